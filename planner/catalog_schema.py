"""The catalog entry format: keys, checks and the one conversion from file units to SI.

One GPU or system entry of a catalog file (human units in key names) becomes a frozen `GPU` or
`System` of planner/hardware.py (SI units). planner/catalog.py merges the files; this module
only reads one merged entry. The format itself is documented in planner/catalog.py.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

from partita.planner.documents import Checker
from partita.planner.enums import PRECISIONS
from partita.planner.errors import unknown_name
from partita.planner.hardware import GPU, Fabric, Network, Price, System
from partita.planner.units import GB, GBIT, GIB, TFLOPS, US

GPU_KEYS = ("name", "display_name", "family", "arch", "form_factor", "memory_gib", "memory_type", "mem_bw_GBps",
            "peak_dense_tflops", "measured_matmul_tflops", "nvlink_gen", "nvlink_links",
            "nvlink_unidir_GBps", "pcie_gen", "pcie_unidir_GBps", "sm_count", "l2_mb", "tdp_w",
            "derived", "notes", "source")
SYSTEM_KEYS = ("name", "kind", "provider", "family", "gpu", "gpus_per_node", "intra_node", "inter_node",
               "vcpus", "cpu", "cpu_cores", "host_memory_gib", "local_storage", "price", "derived",
               "notes", "source")
FABRIC_KEYS = ("kind", "unidir_GBps", "latency_us", "derived", "notes", "source")
NETWORK_KEYS = ("kind", "nics", "nic_gbps", "latency_us", "gpudirect_rdma", "derived", "notes", "source")
PRICE_KEYS = ("on_demand_usd_per_hour", "sagemaker_usd_per_hour", "spot_usd_per_hour", "date",
              "sagemaker_date", "region", "on_demand_before_2025_06_usd_per_hour",
              "capacity_block_usd_per_hour", "notes", "source")
SECTION_KEYS = {"intra_node": FABRIC_KEYS, "inter_node": NETWORK_KEYS, "price": PRICE_KEYS}
FLOPS_SECTIONS = ("peak_dense_tflops", "measured_matmul_tflops")

# Plausible ranges of the numbers in file units (both ends far outside any real device), so a
# typo (1e-12 GiB, 1e300 TFLOP/s) is an error naming the range instead of a nonsense prediction
# or an overflow.
RANGES = {
    "memory_gib": (1 / 8, 1e5), "mem_bw_GBps": (0.1, 1e6), "tflops": (1e-6, 1e6),
    "nvlink_unidir_GBps": (1e-3, 1e6), "pcie_unidir_GBps": (1e-3, 1e6), "unidir_GBps": (1e-3, 1e6),
    "latency_us": (1e-3, 1e7), "nic_gbps": (1e-3, 1e7), "host_memory_gib": (1 / 8, 1e7),
    "usd_per_hour": (1e-6, 1e7),
}
MAX_COUNTS = {"gpus_per_node": 1024, "vcpus": 1 << 20, "nics": 1024}

SYSTEM_KINDS = ("cloud", "onprem", "local")      # "sagemaker" systems are derived, never written
FABRIC_KINDS = ("nvswitch", "nvlink-cube-mesh", "nvlink", "pcie", "host", "none")
NETWORK_KINDS = ("efa", "infiniband", "roce", "ethernet", "omnipath", "none")


def check_keys(c: Checker, section: str) -> None:
    """Reject unknown keys of one entry and of its sub-sections (before merging, in place)."""
    c.only(GPU_KEYS if section == "gpus" else SYSTEM_KEYS)
    subs = FLOPS_SECTIONS if section == "gpus" else tuple(SECTION_KEYS)
    for key in subs:
        sub = c.sub(key, required=False)
        if sub is not None:
            sub.only(PRECISIONS if key in FLOPS_SECTIONS else SECTION_KEYS[key])


def source_list(c: Checker, key: str = "source", required: bool = False) -> tuple[str, ...]:
    """A `source` (or `derived`) value: one string or a list of non-empty strings."""
    value = c.mapping.get(key)
    if value is None or value == []:
        if required:
            raise c.error("missing required key (source keys or citations for the numbers)", key)
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s.strip() for s in items):
        raise c.error("expected a string or a list of non-empty strings", key)
    return tuple(items)


def parse_gpu(c: Checker) -> GPU:
    """One `gpus:` entry -> GPU (SI)."""
    datasheet = _flops(c, "peak_dense_tflops")
    measured = {p: v for p, v in _flops(c, "measured_matmul_tflops").items() if v is not None}
    peaks = {p: v for p, v in datasheet.items() if v is not None}
    fallback = sorted((p for p in measured if p not in peaks), key=PRECISIONS.index)
    for p in fallback:
        peaks[p] = measured[p]
    peaks = {p: peaks[p] for p in PRECISIONS if p in peaks}
    if not peaks:
        raise c.error("no FLOP/s figure: give peak_dense_tflops or measured_matmul_tflops for at "
                      "least one precision")
    notes = c.str("notes", "") or ""
    if fallback:
        notes = (notes + " " if notes else "") + (
            f"peak_flops for {', '.join(fallback)} are measured matmul rates "
            "(measured_matmul_tflops), not datasheet peaks.")
    return GPU(
        name=c.str("name", required=True), display_name=c.str("display_name", "") or "",
        family=_family(c), memory_bytes=round(_in_range(c, "memory_gib", required=True) * GIB),
        memory_bandwidth_bytes_per_s=_in_range(c, "mem_bw_GBps", required=True) * GB,
        peak_flops=peaks, nvlink_bytes_per_s=_scaled(c, "nvlink_unidir_GBps", GB),
        pcie_bytes_per_s=_scaled(c, "pcie_unidir_GBps", GB), source=source_list(c, required=True),
        notes=notes, datasheet_flops=datasheet, measured_matmul_flops=measured,
        extra=_extra(c, ("arch", "form_factor", "memory_type", "nvlink_gen", "nvlink_links", "pcie_gen",
                         "sm_count", "l2_mb", "tdp_w", "derived")))


def _family(c: Checker) -> str | None:
    """`family`: the product line, a lowercase key (e.g. a100 for a100-40gb and a100-80gb); absent
    is None, which the simulator treats as a family without fitted numbers."""
    family = c.str("family")
    if family is not None and (family != family.lower() or not family.replace("-", "").isalnum()):
        raise c.error(f"expected a lowercase key of letters, digits and '-' (e.g. a100), got {family!r}",
                      "family")
    return family


def parse_system(c: Checker, gpus: dict[str, GPU]) -> System:
    """One `systems:` entry -> System (SI); its `gpu` must name a GPU of the catalog."""
    name = c.str("name", required=True)
    if name.lower().startswith("ml."):
        raise c.error(f"'ml.' names are derived from the instance name; set "
                      f"price.sagemaker_usd_per_hour on {name[3:]!r} instead", "name")
    kind = _required_choice(c, "kind", SYSTEM_KINDS)
    gpu_name = c.str("gpu", required=True)
    gpu = gpus.get(gpu_name.lower())
    if gpu is None:
        raise c.error(str(unknown_name("GPU", gpu_name, [g.name for g in gpus.values()])), "gpu")
    per_node = c.int("gpus_per_node", required=True, maximum=MAX_COUNTS["gpus_per_node"])
    intra = parse_fabric(c.sub("intra_node"))
    if intra.kind == "none" and per_node > 1:
        raise c.error(f"kind none (no GPU-to-GPU link) needs gpus_per_node 1, got {per_node}",
                      "intra_node.kind")
    host = _in_range(c, "host_memory_gib")
    return System(
        name=name, kind=kind, gpu=gpu, gpus_per_node=per_node, intra=intra,
        inter=parse_network(c.sub("inter_node")),
        vcpus=c.int("vcpus", maximum=MAX_COUNTS["vcpus"]),
        host_memory_bytes=round(host * GIB) if host is not None else None,
        price=parse_price(c.sub("price", required=False)), source=source_list(c, required=True),
        notes=c.str("notes", "") or "",
        extra=_extra(c, ("provider", "family", "cpu", "cpu_cores", "local_storage", "derived")))


def parse_fabric(c: Checker) -> Fabric:
    kind = _required_choice(c, "kind", FABRIC_KINDS)
    if kind == "none" and c.has("unidir_GBps"):
        raise c.error("kind none has no bandwidth; remove it or name the link kind", "unidir_GBps")
    return Fabric(kind=kind, bytes_per_s=_scaled(c, "unidir_GBps", GB),
                  latency_s=_scaled(c, "latency_us", US), source=source_list(c))


def parse_network(c: Checker) -> Network:
    kind = _required_choice(c, "kind", NETWORK_KINDS)
    nics = c.int("nics", 0 if kind == "none" else None, minimum=0, required=kind != "none",
                 maximum=MAX_COUNTS["nics"])
    gbps = _in_range(c, "nic_gbps")
    if kind == "none" and (nics or gbps is not None):
        raise c.error("kind none has no NICs; remove nics/nic_gbps or name the network kind")
    if kind != "none" and nics == 0:
        raise c.error(f"kind {kind} needs at least one NIC", "nics")
    rdma = c.mapping.get("gpudirect_rdma")
    if rdma is not None and not isinstance(rdma, bool):
        raise c.error(f"expected true, false or null, got {rdma!r}", "gpudirect_rdma")
    return Network(kind=kind, nics=nics, bytes_per_s=nics * gbps * GBIT if gbps is not None else None,
                   latency_s=_scaled(c, "latency_us", US), gpudirect_rdma=bool(rdma),
                   source=source_list(c))


def parse_price(c: Checker | None) -> Price:
    if c is None:
        return Price()
    return Price(on_demand_usd_per_hour=_in_range(c, "on_demand_usd_per_hour"),
                 sagemaker_usd_per_hour=_in_range(c, "sagemaker_usd_per_hour"),
                 spot_usd_per_hour=_in_range(c, "spot_usd_per_hour"),
                 date=_date(c, "date"), region=c.str("region"), source=source_list(c),
                 sagemaker_date=_date(c, "sagemaker_date"))


def check_price_extras(c: Checker | None) -> None:
    """The price keys that only describe (not used by the simulator) still get type checks."""
    if c is not None:
        for key in ("on_demand_before_2025_06_usd_per_hour", "capacity_block_usd_per_hour"):
            _in_range(c, key)
        c.str("notes")


def _flops(c: Checker, key: str) -> dict[str, float | None]:
    sub = c.sub(key, required=False)
    if sub is None:
        return {}
    out: dict[str, float | None] = {}
    for p in PRECISIONS:
        if p in sub.mapping:
            value = _in_range(sub, p, "tflops")
            out[p] = float(round(value * TFLOPS)) if value is not None else None
    return out


def _scaled(c: Checker, key: str, unit: float) -> float | None:
    value = _in_range(c, key)
    return value * unit if value is not None else None


def _in_range(c: Checker, key: str, kind: str | None = None, required: bool = False) -> float | None:
    """A number within RANGES[kind or key] (file units); `*_usd_per_hour` keys share one range."""
    kind = kind or ("usd_per_hour" if key.endswith("usd_per_hour") else key)
    low, high = RANGES[kind]
    return c.number(key, minimum=low, maximum=high, required=required)


def _required_choice(c: Checker, key: str, choices: tuple[str, ...]) -> str:
    if not c.has(key):
        raise c.error(f"missing required key (expected one of {', '.join(choices)})", key)
    return c.choice(key, choices)


def _date(c: Checker, key: str) -> str | None:
    value = c.mapping.get(key)
    if isinstance(value, (_dt.date, _dt.datetime)):     # an unquoted YAML date
        return value.isoformat()
    return c.str(key)


def _extra(c: Checker, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: c.mapping[k] for k in keys if c.mapping.get(k) is not None}

"""The hardware catalog: GPUs and systems (nodes) from data/catalog plus user files, in SI units.

`load_catalog(extra)` reads, in order, every shipped `data/catalog/*.yaml`, then the machine's
`local` file (`local_catalog_path()`: $PARTITA_HOME/local.yaml, default ~/.partita/local.yaml) if
it exists, then `extra` (a `--catalog FILE`). Later files merge over earlier ones by name, field
by field (nested mappings too; lists replace), so a user file can change one price; a new name
adds an entry. Every problem is a `PartitaError` naming `FILE: systems[2].key`.

File format (YAML or JSON; every key is optional at the top level):

    sources:                       # key -> citation; entries cite keys (or give free text)
      MY_BENCH: "our nccl-tests run, 2026-03-01"
    gpus:
      - name: local-cpu            # lookup is case-insensitive
        display_name: "..."
        # family: a100             # optional product line (one key for all sizes of a part): the
                                   # key of per-family fitted numbers (sustained_matmul_fraction);
                                   # absent, or a family without a fitted number: its `default`
        memory_gib: 30             # capacity per device (per process for a CPU)
        mem_bw_GBps: 20            # decimal GB/s
        peak_dense_tflops: {fp32: 1.2}      # datasheet peaks; ABSENT precision = unsupported,
                                            # null = supported but not published
        measured_matmul_tflops: {fp32: 0.9} # measured rates; used where the peak is null/absent
        nvlink_unidir_GBps: null   # per GPU, one direction
        pcie_unidir_GBps: 32       # per GPU, one direction
        source: [MY_BENCH]         # required (keys of `sources:` or free text)
        # optional, descriptive: arch, form_factor, memory_type, nvlink_gen, nvlink_links,
        # pcie_gen, sm_count, l2_mb, tdp_w, derived (list of fields that are arithmetic), notes
    systems:
      - name: local
        kind: local                # cloud | onprem | local (`ml.<cloud name>` = SageMaker, derived)
        gpu: local-cpu             # a GPU name of the catalog: one defined in this file (as above,
                                   # measured) or a shipped CUDA GPU (e.g. a10g) when that is the device
        gpus_per_node: 2           # for `local`: the number of processes on this machine
        intra_node: {kind: host, unidir_GBps: 5.0, latency_us: 30}
                                   # nvswitch | nvlink-cube-mesh | nvlink | pcie | host | none;
                                   # per GPU one direction; host = processes sharing one machine
        inter_node: {kind: none}   # efa | infiniband | roce | ethernet | omnipath | none,
                                   # with nics, nic_gbps (per NIC), latency_us, gpudirect_rdma
        vcpus: 2
        host_memory_gib: 8
        price: {on_demand_usd_per_hour: null, sagemaker_usd_per_hour: null, spot_usd_per_hour: null,
                date: "2026-03-01", sagemaker_date: null, region: null, source: [...]}
        source: ["partita calibrate 2026-03-01 on myhost"]
        # optional, descriptive: provider, family, cpu, cpu_cores, local_storage, derived, notes

Units are converted once, here: GiB -> bytes (2**30), GB/s -> bytes/s (1e9), TFLOP/s -> FLOP/s,
Gbit/s -> bytes/s (1e9/8), us -> s. A null bandwidth stays None in the dataclasses; a scenario
then supplies it with `cluster.intra_node_gbps` / `cluster.inter_node_gbps` (see
`Catalog.resolve_cluster`).
"""
from __future__ import annotations

import copy
import math
import os
import stat
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from partita.planner.catalog_schema import (GBIT, check_keys, check_price_extras, parse_gpu, parse_system,
                                    source_list)
from partita.planner.documents import Checker, load_document, read_text
from partita.planner.errors import PartitaError, closest, unknown_name
from partita.planner.hardware import GPU, Fabric, Network, Price, System
from partita.planner.paths import CATALOG_DIR


def local_catalog_path() -> Path:
    """Where `partita calibrate` writes the `local` system: $PARTITA_HOME/local.yaml."""
    home = os.environ.get("PARTITA_HOME") or str(Path.home() / ".partita")
    return Path(home).expanduser() / "local.yaml"


def shipped_files() -> list[Path]:
    """The shipped catalog files; none (a broken install) is an error, never an empty catalog."""
    files = sorted(CATALOG_DIR.glob("*.yaml"))
    if not files:
        raise PartitaError(f"{CATALOG_DIR}: no catalog files (*.yaml) found; the partita "
                           "installation is incomplete (reinstall it: pip install partita)")
    return files


def load_catalog(extra: str | Path | None = None) -> "Catalog":
    """Shipped data, then the local file if present, then `extra` (must exist)."""
    layers = list(shipped_files())
    local = local_catalog_path()
    if local.is_file():
        layers.append(local)
    if extra is not None and str(extra) != "":
        layers.append(Path(extra))
    return _load(tuple(_stamp(p) for p in layers))


def _stamp(path: Path) -> tuple[str, int, int]:
    """(path, mtime, size): the cache key of one layer; a missing file fails here, uncached."""
    try:
        st = path.stat()
    except OSError:
        if not path.is_symlink() and not path.parent.is_dir() or not os.path.lexists(path):
            raise PartitaError(f"{path}: no such file (a catalog file: YAML or JSON with "
                               "gpus:/systems:)") from None
        read_text(path)      # names what is wrong (no such file, a link loop, permission)
        raise
    if stat.S_ISDIR(st.st_mode):
        raise PartitaError(f"{path}: is a directory, expected a .yaml, .yml or .json file")
    return (str(path), st.st_mtime_ns, st.st_size)


@dataclass
class _Raw:
    """One entry as merged so far: its data, and where it was (last) written."""
    data: dict[str, Any]
    origin: str
    path: str
    origins: list[str]


@lru_cache(maxsize=16)
def _load(layers: tuple[tuple[str, int, int], ...]) -> "Catalog":
    raw: dict[str, dict[str, _Raw]] = {"gpus": {}, "systems": {}}
    sources: dict[str, str] = {}
    for path, _, _ in layers:
        _merge_document(load_document(path), _display(path), raw, sources)
    gpus = {k: parse_gpu(_checker(r)) for k, r in raw["gpus"].items()}
    systems = {}
    for key, r in raw["systems"].items():
        c = _checker(r)
        if key in gpus:
            raise c.error(f"{c.mapping['name']!r} is already a GPU name; systems and GPUs need "
                          "distinct names", "name")
        check_price_extras(c.sub("price", required=False))
        systems[key] = parse_system(c, gpus)
    if not gpus or not systems:
        raise PartitaError(f"{', '.join(_display(p) for p, _, _ in layers)}: the catalog has "
                           f"{len(gpus)} GPUs and {len(systems)} systems; it needs at least one "
                           "of each (gpus: and systems: mappings)")
    return Catalog(gpus, systems, sources, raw)


def _display(path: str) -> str:
    """Shipped files as `data/catalog/x.yaml` (same on every machine); user files as given."""
    try:
        return str(Path(path).resolve().relative_to(CATALOG_DIR.parent.parent))
    except ValueError:
        return path


def _checker(r: _Raw) -> Checker:
    return Checker(r.data, r.path, r.origin)


def _merge_document(doc: dict[str, Any], origin: str, raw: dict[str, dict[str, _Raw]],
                    sources: dict[str, str]) -> None:
    top = Checker(doc, "", origin)
    top.only(("gpus", "systems", "sources"))
    src = top.sub("sources", required=False)
    if src is not None:
        for key in src.mapping:
            sources[str(key)] = src.str(str(key), required=True)
    for section in ("gpus", "systems"):
        items = doc.get(section)
        if items is None:
            continue
        if not isinstance(items, list):
            raise top.error(f"expected a list of entries (each with a name), got "
                            f"{type(items).__name__}", section)
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            c = Checker(item, f"{section}[{i}]", origin)
            name = str(c.str("name", required=True)).lower()
            if name in first:
                raise c.error(f"{c.mapping['name']!r} is also {section}[{first[name]}] of this file; "
                              "give each name once (a later file may override it)", "name")
            first[name] = i
            _merge_entry(c, section, raw[section])


def _merge_entry(c: Checker, section: str, table: dict[str, _Raw]) -> None:
    name = c.str("name", required=True)
    check_keys(c, section)
    key = name.lower()
    old = table.get(key)
    if old is None:
        table[key] = _Raw(copy.deepcopy(dict(c.mapping)), c.origin, c.path, [c.origin])
        return
    data = _deep_merge(old.data, c.mapping)
    data["name"] = old.data["name"]
    table[key] = _Raw(data, c.origin, c.path, old.origins + [c.origin])


def _deep_merge(base: dict[str, Any], over: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@dataclass(frozen=True)
class ClusterHardware:
    """A scenario's cluster on its system: what-if overrides applied, GPU and node counts known."""
    system: System
    gpus: int
    nodes: int


class Catalog:
    """GPUs and systems by name (case-insensitive), with the sources behind every number."""

    def __init__(self, gpus: dict[str, GPU], systems: dict[str, System], sources: dict[str, str],
                 raw: dict[str, dict[str, _Raw]]):
        self._gpus = gpus
        self._systems = systems
        self._sources = sources
        self._raw = raw

    def gpu(self, name: str) -> GPU:
        gpu = self._gpus.get(str(name).lower())
        if gpu is None:
            raise _unknown("GPU", str(name), self.gpu_names())
        return gpu

    def system(self, name: str) -> System:
        """An instance or node type; `ml.<cloud instance>` gives it with SageMaker pricing."""
        key = str(name).lower()
        if key in self._systems:
            return self._systems[key]
        base = self._systems.get(key[3:]) if key.startswith("ml.") else None
        if base is not None and base.kind == "cloud":
            return _sagemaker(base)
        choices = self.system_names(sagemaker=key.startswith("ml."))
        if key == "local":       # written by `partita calibrate`, absent until it has run
            raise PartitaError("unknown system 'local': this machine is not calibrated; run "
                               "`partita calibrate` to measure it (or pass its --catalog FILE)")
        raise _unknown("system", str(name), choices)

    def gpu_names(self) -> list[str]:
        return [g.name for g in self._gpus.values()]

    def gpu_families(self) -> list[str]:
        """Every GPU `family` (the key of per-family fitted numbers), once each, in catalog order."""
        return list(dict.fromkeys(g.family for g in self._gpus.values() if g.family is not None))

    def system_names(self, sagemaker: bool = False) -> list[str]:
        """Every system name; with `sagemaker`, also the `ml.` name of each cloud instance."""
        names = [s.name for s in self._systems.values()]
        if sagemaker:
            names += [f"ml.{s.name}" for s in self._systems.values() if s.kind == "cloud"]
        return names

    def sources(self) -> dict[str, str]:
        """Source key -> citation."""
        return dict(self._sources)

    def describe(self, name: str) -> dict[str, Any]:
        """One GPU or system as written (file units), as used (SI), and its sources resolved."""
        key = str(name).lower()
        if key in self._gpus:
            return self._describe_gpu(key)
        try:
            system = self.system(name)
        except PartitaError:
            near = _suggest(str(name), self.system_names(sagemaker=key.startswith("ml."))
                            + self.gpu_names())[:1]
            hint = f"; did you mean {near[0]!r}?" if near else " (see `partita catalog list`)"
            raise PartitaError(f"unknown system or GPU {name!r}{hint}") from None
        return self._describe_system(system)

    def resolve_cluster(self, cluster: Any, origin: str = "") -> ClusterHardware:
        """A scenario's `cluster:` (planner.scenario.ClusterSpec) on its system, what-ifs applied.

        Needs the system's intra-node bandwidth when a node holds more than one of the GPUs and
        its network bandwidth when there is more than one node; where the catalog has null, the
        scenario must give cluster.intra_node_gbps / inter_node_gbps.
        """
        where = f"{origin}: " if origin else ""
        try:
            named = self.system(cluster.system)
        except PartitaError as exc:
            raise PartitaError(f"{where}cluster.system: {exc}") from None
        system = apply_overrides(named, gpus_per_node=cluster.gpus_per_node,
                                 intra_node_gbps=cluster.intra_node_gbps,
                                 inter_node_gbps=cluster.inter_node_gbps)
        per_node = system.gpus_per_node
        gpus = cluster.gpus if cluster.gpus is not None else cluster.nodes * per_node
        nodes = cluster.nodes if cluster.nodes is not None else math.ceil(gpus / per_node)
        from partita.planner.scenario import LIMITS
        if gpus > LIMITS["cluster.gpus"]:
            limit = LIMITS["cluster.gpus"]
            raise PartitaError(f"{where}cluster.nodes: {cluster.nodes} nodes of {per_node} GPUs "
                               f"are {gpus:,} GPUs, more than partita's limit of {limit:,}")
        if min(gpus, per_node) > 1 and system.intra.bytes_per_s is None:
            raise PartitaError(f"{where}cluster.system {system.name}: GPU-to-GPU bandwidth inside a "
                               "node is not known; set cluster.intra_node_gbps (per GPU, one "
                               "direction, Gbit/s)")
        if nodes > 1 and system.inter.bytes_per_s is None:
            raise PartitaError(f"{where}cluster.system {system.name}: network bandwidth is not known; "
                               "set cluster.inter_node_gbps (per node, Gbit/s)")
        return ClusterHardware(system=system, gpus=gpus, nodes=nodes)

    def _describe_gpu(self, key: str) -> dict[str, Any]:
        gpu, raw = self._gpus[key], self._raw["gpus"][key]
        si = {"memory_bytes": gpu.memory_bytes,
              "memory_bandwidth_bytes_per_s": gpu.memory_bandwidth_bytes_per_s,
              "peak_flops": dict(gpu.peak_flops),
              "peak_is_measured": [p for p in gpu.peak_flops if gpu.peak_is_measured(p)],
              "nvlink_bytes_per_s": gpu.nvlink_bytes_per_s, "pcie_bytes_per_s": gpu.pcie_bytes_per_s}
        return {"name": gpu.name, "type": "gpu", "files": list(raw.origins),
                "entry": copy.deepcopy(raw.data), "si": si, "notes": gpu.notes,
                "sources": self._cite(raw.data)}

    def _describe_system(self, s: System) -> dict[str, Any]:
        raw = self._raw["systems"][s.name.lower().removeprefix("ml.")]
        entry = copy.deepcopy(raw.data)
        if s.kind == "sagemaker":
            entry.update(name=s.name, kind="sagemaker")
            entry.setdefault("price", {}).update(on_demand_usd_per_hour=s.price.on_demand_usd_per_hour,
                                                 spot_usd_per_hour=None, date=s.price.date)
        si = {"gpus_per_node": s.gpus_per_node,
              "intra_node": {"kind": s.intra.kind, "bytes_per_s": s.intra.bytes_per_s,
                             "latency_s": s.intra.latency_s},
              "inter_node": {"kind": s.inter.kind, "nics": s.inter.nics,
                             "bytes_per_s": s.inter.bytes_per_s, "latency_s": s.inter.latency_s,
                             "gpudirect_rdma": s.inter.gpudirect_rdma},
              "host_memory_bytes": s.host_memory_bytes,
              "price_usd_per_hour": s.price.best_usd_per_hour}
        gpu = self._describe_gpu(s.gpu.name.lower())
        sources = {**gpu["sources"], **self._cite(raw.data)}
        return {"name": s.name, "type": "system", "kind": s.kind, "files": list(raw.origins),
                "entry": entry, "si": si, "gpu": gpu, "notes": s.notes, "sources": sources}

    def _cite(self, data: dict[str, Any]) -> dict[str, str | None]:
        """Every source named in an entry and its sub-sections -> citation (None: free text)."""
        names: list[str] = list(source_list(Checker(data, "", "")))
        for value in data.values():
            if isinstance(value, dict):
                names += source_list(Checker(value, "", ""))
        return {n: self._sources.get(n) for n in dict.fromkeys(names)}


def _suggest(name: str, choices: list[str]) -> list[str]:
    """Names that extend what was typed ('a100' -> 'a100-40gb') first, then the closest spellings."""
    low = name.lower()
    prefixed = [c for c in choices if c.lower().startswith(low)]
    return list(dict.fromkeys(prefixed + closest(name, choices, n=3)))[:3]


def _unknown(kind: str, name: str, choices: list[str]) -> PartitaError:
    """`unknown <kind> 'x'; did you mean 'y'? (valid: ...)`, as errors.unknown_name words it."""
    near = _suggest(name, choices)
    if not near:
        return unknown_name(kind, name, choices)
    listing = ", ".join(sorted(choices)) if len(choices) <= 40 else ", ".join(sorted(choices)[:40]) + ", ..."
    return PartitaError(f"unknown {kind} {name!r}; did you mean {', '.join(repr(c) for c in near)}? "
                        f"(valid: {listing})")


def _sagemaker(base: System) -> System:
    """The SageMaker view of a cloud instance: same hardware, the `ml.` hourly price."""
    p = base.price
    price = Price(on_demand_usd_per_hour=p.sagemaker_usd_per_hour,
                  sagemaker_usd_per_hour=p.sagemaker_usd_per_hour, spot_usd_per_hour=None,
                  date=p.sagemaker_date, region=p.region, source=p.source,
                  sagemaker_date=p.sagemaker_date)
    return replace(base, name=f"ml.{base.name}", kind="sagemaker", price=price)


def apply_overrides(system: System, *, gpus_per_node: int | None = None,
                    intra_node_gbps: float | None = None,
                    inter_node_gbps: float | None = None) -> System:
    """The scenario's what-if overrides (cluster.gpus_per_node / intra_node_gbps / inter_node_gbps)."""
    what_if = ("scenario cluster override",)
    if gpus_per_node is not None:
        system = replace(system, gpus_per_node=gpus_per_node)
    if intra_node_gbps is not None:
        kind = system.intra.kind if system.intra.kind != "none" else "custom"
        system = replace(system, intra=Fabric(kind=kind, bytes_per_s=intra_node_gbps * GBIT,
                                              latency_s=system.intra.latency_s, source=what_if))
    if inter_node_gbps is not None:
        net = system.inter
        system = replace(system, inter=Network(
            kind=net.kind if net.kind != "none" else "custom", nics=max(net.nics, 1),
            bytes_per_s=inter_node_gbps * GBIT, latency_s=net.latency_s,
            gpudirect_rdma=net.gpudirect_rdma, source=what_if))
    return system

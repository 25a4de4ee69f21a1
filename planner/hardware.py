"""Hardware records shared by the catalog, the simulator and the planner (SI units throughout).

These are the types only; `planner.catalog` reads them from `data/catalog/*.yaml` (human units in
key names, a `source` for every number) and converts units exactly once, at load.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partita.planner.enums import PRECISIONS


@dataclass(frozen=True)
class GPU:
    name: str                                   # catalog name, e.g. "a100-80gb"
    display_name: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float] = field(hash=False)    # dense FLOP/s per precision it supports
    nvlink_bytes_per_s: float | None = None     # per GPU, one direction (None: no NVLink)
    pcie_bytes_per_s: float | None = None       # per GPU, one direction
    source: tuple[str, ...] = ()
    notes: str = ""
    # Datasheet dense peaks as published; a precision present with None is supported by the part
    # but its peak is not published. `peak_flops` falls back to `measured_matmul_flops` there.
    datasheet_flops: dict[str, float | None] = field(default_factory=dict, hash=False, compare=False)
    measured_matmul_flops: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Product line (catalog `family`: one key for every memory size of one part): the key of per-family
    # numbers such as the fitted sustained matmul fraction. None: none given (the family default).
    family: str | None = None

    def supports(self, precision: str) -> bool:
        return self.peak_flops.get(precision) is not None

    def peak_is_measured(self, precision: str) -> bool:
        """True where `peak(precision)` is a measured matmul rate, not a datasheet peak."""
        return self.datasheet_flops.get(precision) is None and precision in self.measured_matmul_flops

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for the matrix work of `precision` (tensor cores where present)."""
        value = self.peak_flops.get(precision)
        if value is None:
            from partita.planner.errors import PartitaError
            ok = ", ".join(p for p in PRECISIONS if self.supports(p))
            if precision in self.datasheet_flops:
                raise PartitaError(f"no FLOP/s figure for {precision} on {self.name}: not published and "
                                   f"not measured; give gpus[].measured_matmul_tflops.{precision} in a "
                                   f"--catalog file (known: {ok})")
            raise PartitaError(f"precision {precision!r} is not supported by {self.name} (supports: {ok})")
        return value


@dataclass(frozen=True)
class Fabric:
    """Links between GPUs of one node."""
    kind: str                                   # nvswitch | nvlink-cube-mesh | nvlink | pcie | host | none
                                                # (| custom: set by a scenario's what-if override)
    bytes_per_s: float | None                   # per GPU, one direction; None: no link (kind none) or
                                                # not published (a scenario sets cluster.intra_node_gbps)
    latency_s: float | None                     # None: not published (simulator uses calibration)
    source: tuple[str, ...] = ()


@dataclass(frozen=True)
class Network:
    """Links between nodes."""
    kind: str                                   # efa | infiniband | roce | ethernet | omnipath | none
    nics: int
    bytes_per_s: float | None                   # per node, one direction, all NICs together; None: no
                                                # network or not published (cluster.inter_node_gbps)
    latency_s: float | None                     # None: not published (simulator uses calibration)
    gpudirect_rdma: bool = False
    source: tuple[str, ...] = ()


@dataclass(frozen=True)
class Price:
    on_demand_usd_per_hour: float | None = None
    sagemaker_usd_per_hour: float | None = None
    spot_usd_per_hour: float | None = None
    date: str | None = None
    region: str | None = None
    source: tuple[str, ...] = ()
    sagemaker_date: str | None = None           # the SageMaker price's snapshot date when it differs

    @property
    def best_usd_per_hour(self) -> float | None:
        """The on-demand price, else SageMaker's, else None (unknown)."""
        return self.on_demand_usd_per_hour if self.on_demand_usd_per_hour is not None \
            else self.sagemaker_usd_per_hour


@dataclass(frozen=True)
class System:
    """A node type one rents or owns: an AWS instance, a DGX, or `local` (this machine)."""
    name: str
    kind: str                                   # cloud | sagemaker | onprem | local
    gpu: GPU
    gpus_per_node: int
    intra: Fabric
    inter: Network
    vcpus: int | None = None
    host_memory_bytes: int | None = None
    price: Price = Price()
    source: tuple[str, ...] = ()
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

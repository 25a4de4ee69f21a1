"""Framework effects no kernel microbenchmark shows, as data.

Fitted (data/calibration/fitted.yaml, written by benchmarks/fit_overheads.py with the rows,
objective and command; `simulator.fitting`):
- the fraction of the best-shape matmul throughput a training run sustains, per GPU family
  (sustained clocks under full power differ by generation: a 700 W H100 throttles further below
  its boost clock than a 400 W A100), with a default (their median) for families without rows;
  it applies to tensor-core matmuls (fp32 on the CUDA cores keeps its sweep rate:
  `Overheads.matmul_fraction`).
Measured or published (data/calibration/training.yaml):
- how much slower kernels run while a collective runs beside them on the same GPU (`overlapped`);
- the per-rank host work of collectives called with a Python list of per-rank tensors
  (`list_collective`; benchmarks/bench_host_collective.py) and the host time to submit each list
  entry's copy (`list_copy_host_us`: measured dispatch plus a published `cudaMemcpyAsync` cost);
- the fp8 and attention-kernel fractions (1.0: no dev data identifies them).
Kept for a user's own file, none shipped: a fixed cost per block pass (`block_overhead_us`,
`framework_block_overhead_us`) and per step (`step_overhead_s`); host dispatch and launch are
modelled instead (`simulator.host`); per training framework the fraction of Megatron-LM's
kernel throughput it sustains (`framework_fraction`); and per framework the fraction of the
modelled bandwidth its ZeRO-3 parameter gathers and gradient scatters reach
(`zero3_collective_fraction`). That last one was fitted for DeepSpeed while one source's rows alone
informed it: Narayanan et al. 2021's ZeRO-3 runs, whose 175B runs (384-1,536 GPUs) the modelled
bandwidth predicts within -8% to +3% and whose 530B runs (640-2,240 GPUs) it predicts 14-23% fast,
so the fit settled between them (0.634, 21% slow on one 175B run), and leave-one-source-out, which
leaves that source out, could never check it. No framework fraction is fitted: the dev
rows' DeepSpeed runs (BLOOM, MT-NLG) are Megatron-DeepSpeed, Megatron's own kernels, and FSDP
runs the same cuBLAS and flash-attention kernels; fitted, the FSDP fraction sat at its bound 1.0
and traded against the H100 fraction whenever Megatron-Core's H100 rows were left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from partita.planner.catalog import load_catalog
from partita.planner.documents import Checker
from partita.planner.provenance import load_by_provenance as load_document
from partita.planner.enums import FRAMEWORKS
from partita.planner.errors import PartitaError
from partita.planner.paths import CALIBRATION_DIR

TRAINING_FILE = CALIBRATION_DIR / "training.yaml"
FITTED_FILE = CALIBRATION_DIR / "fitted.yaml"     # written by benchmarks/fit_overheads.py --write
KEYS = ("sustained_matmul_fraction", "fp8_matmul_fraction", "block_overhead_us",
        "framework_block_overhead_us", "step_overhead_s",
        "attention_fraction", "framework_fraction", "zero3_collective_fraction",
        "overlap_slowdown", "list_collective_host_us", "list_copy_host_us", "source")
# The numbers fitted to measured step times (simulator.fitting); the others are measured or published.
FITTED_KEYS = ("sustained_matmul_fraction",)
FACT_KEYS = tuple(k for k in KEYS if k not in FITTED_KEYS)
LIST_COLLECTIVES = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Overheads:
    sustained_default: float | None = 1.0     # None: the file fits families but gives no default
    sustained_by_family: dict[str, float] = field(default_factory=dict, hash=False)
    block_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    fp8_matmul_fraction: float = 1.0   # fp8 GEMMs sustain this much of their own sweep on top
                                       # (scaling, clocks; the casts and transposes around them
                                       # are kernels of their own: simulator.fp8casts)
    attention_fraction: float = 1.0    # flash attention kernels, of their kernel benchmark
    framework_fraction: dict[str, float] = field(default_factory=dict, hash=False)
    zero3_collective_fraction: dict[str, float] = field(default_factory=dict, hash=False)
    overlap_slowdown: float = 0.0      # kernels run (1 + this) slower beside a running collective
    # Host seconds per rank to build a collective's list of per-rank tensors (see `list_collective`).
    list_collective_host_s: dict[str, float] = field(default_factory=dict, hash=False)
    # Host seconds to submit one list entry's copy (torch's copy_ and its cudaMemcpyAsync).
    list_copy_host_s: float = 0.0
    # Seconds per block pass (forward, recomputed forward, backward-input, backward-weight) a
    # framework adds on top of `block_overhead_s` (see `block_overhead`).
    framework_block_overhead_s: dict[str, float] = field(default_factory=dict, hash=False)

    def overlapped(self, compute_s: float, comm_s: float) -> float:
        """Seconds for `compute_s` of kernels with `comm_s` of collectives overlapped beside them.

        The collective keeps its own speed; while it runs, the kernels sharing the GPU's SMs and
        HBM with it run (1 + k) times slower (k = overlap_slowdown). Lee et al. 2025, "Characterizing
        Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv
        2507.03114), measure 18.9% mean and 40% worst compute slowdown under overlap on A100 and
        H100. So comm <= compute (1 + k) costs compute + comm k / (1 + k); a longer collective
        sets the time alone. k = 0 is the ideal max(compute, comm)."""
        if comm_s <= 0.0:
            return compute_s
        return max(comm_s, compute_s + self.contention(comm_s))

    def contention(self, comm_s: float) -> float:
        """Seconds a collective running `comm_s` beside kernels delays them: comm k / (1 + k)."""
        k = self.overlap_slowdown
        return comm_s * k / (1.0 + k)

    def list_collective(self, kind: str, ranks: int, copy_s: float) -> float:
        """Seconds one collective called with a Python list of `ranks` per-rank tensors adds to
        its transfer. DeepSpeed 0.3's ZeRO-3 gathers and scatters every parameter this way
        (partition_parameters.py `_allgather_param`, `_reduce_scatter_gradient`: a Python loop
        narrows the flat buffer once per rank, then `torch.distributed.all_gather` /
        `reduce_scatter` on the list), and torch's NCCL process group copies each list entry out
        of (or into) its flat buffer, one copy per rank (ProcessGroupNCCL.cpp `allgather`,
        `flatten_for_scatter_gather`); PR #1188 removed those copies for that reason. Per rank: the
        exposed host loop (`list_collective_host_us`) and the copy of that rank's share. The host
        submits each copy (`list_copy_host_us`: torch's `copy_` dispatch, then one
        `cudaMemcpyAsync`, as ATen copies contiguous device tensors) while the GPU runs the one
        before, `copy_s` seconds (memory-bound, at least the GPU's shortest kernel), so the slower
        of the two paces the copies. A gather's loop is exposed:
        every gather first synchronised the device, so the GPU waits for the loop. A gradient
        scatter's loop runs in a backward hook while the GPU still works through the block's
        backward kernels, so training.yaml gives it 0; its copies remain. 0 for a kind without an
        entry, and for collectives on flat buffers (FSDP, DeepSpeed >= 0.4)."""
        host = self.list_collective_host_s.get(kind)
        return 0.0 if host is None else ranks * (host + max(self.list_copy_host_s, copy_s))

    def framework(self, name: str) -> float:
        """Kernel throughput a framework sustains relative to Megatron-LM (1.0 if not fitted)."""
        return self.framework_fraction.get(name, 1.0)

    def block_overhead(self, name: str) -> float:
        """Fixed seconds per transformer block per micro-batch pass under framework `name`: the
        shared per-block cost plus the framework's own (none shipped: a user's own file may set
        them). A fit once gave DeepSpeed 3.3 ms per pass from these observations: the
        BLOOM log (bigscience tr11-176B-ml chronicles-prequel, 02-21 tables) runs one 72-layer model
        on the same 384 GPUs at micro-batch 1, 2 and 4: the steps take 143, 134 and 124 s for the
        same FLOPs, though the smaller micro-batch has the smaller bubble. Bubble plus a cost per
        block pass fits the micro-batch 1 and 4 steps with about 11 ms per block per micro-batch
        (forward, recompute and backward together). Those runs set CUDA_LAUNCH_BLOCKING=1
        (tr11-176B-ml.slurm), which leaves every kernel's host-side launch exposed. That is now
        modelled where launches block (`training.launch_blocking`, `simulator.host`) with published
        latencies and the host time per kernel measured on a whole block, which account for about
        0.4 ms of the 3.3 ms; the rest is not explained."""
        return self.block_overhead_s + self.framework_block_overhead_s.get(name, 0.0)

    def zero3_collectives(self, name: str) -> float:
        """Fraction of the modelled bandwidth a framework's ZeRO-3 collectives reach."""
        return self.zero3_collective_fraction.get(name, 1.0)

    def matmul_fraction(self, gpu, precision: str, framework: str = "megatron") -> float:
        """The fraction of its sweep rate a matmul of `precision` keeps in a training run on `gpu`
        under `framework`: the family's sustained fraction (times the fp8 one for fp8) on tensor
        cores; fp32 on a tensor-core GPU's CUDA cores keeps the sweep rate
        (`simulator.compute.cuda_core_matmul`: under the shipped fit NVIDIA's V100 FP32 BERT-large
        runs, DLEBERT-15 and -19, come out 9% and 12% fast at the sweep rate, and 27% and 23% slow
        with the V100 family's fraction, which their 16-bit runs and Megatron-LM 2019's set)."""
        from partita.simulator.compute import cuda_core_matmul
        if cuda_core_matmul(gpu, precision):
            return self.framework(framework)
        return (self.sustained(gpu.family) * self.framework(framework)
                * (self.fp8_matmul_fraction if precision == "fp8" else 1.0))

    def sustained(self, family: str | None) -> float:
        """The sustained matmul fraction of a GPU family (the catalog's `gpus[].family`); a family
        without a fitted number, or a GPU without a family, gets `default` (their median)."""
        if family in self.sustained_by_family:
            return self.sustained_by_family[family]
        if self.sustained_default is None:
            raise PartitaError(f"sustained_matmul_fraction: no value for GPU family {family!r} and no "
                               f"`default` (families: {', '.join(sorted(self.sustained_by_family))})")
        return self.sustained_default


@lru_cache(maxsize=4)
def _load(path: str, mtime: int, fitted: str | None, fitted_mtime: int) -> Overheads:
    facts = Checker(load_document(path), "", path)
    fit = Checker(load_document(fitted), "", fitted) if fitted is not None else None
    if fit is not None:
        facts.only(FACT_KEYS)
        fit.only(FITTED_KEYS + ("rows", "objective", "command", "loss"))
    else:
        facts.only(KEYS)

    def at(key: str) -> Checker:
        """The file that holds `key`: fitted numbers in the fitted file, the rest in training.yaml."""
        return fit if fit is not None and key in FITTED_KEYS else facts

    default, families = 1.0, {}
    c = at("sustained_matmul_fraction")
    if c.has("sustained_matmul_fraction"):
        sub = c.sub("sustained_matmul_fraction")
        sub.only(("default", *load_catalog().gpu_families()))     # the catalog's `gpus[].family`
        default = None                              # unless the section gives one
        for key in sub.mapping:
            value = sub.number(key)
            if value > 1.0:
                raise sub.error(f"must be in (0, 1], got {value}", key)
            if key == "default":
                default = value
            else:
                families[key] = value
    fp8 = at("fp8_matmul_fraction").number("fp8_matmul_fraction", 1.0)
    if fp8 > 1.0:
        raise at("fp8_matmul_fraction").error(f"must be in (0, 1], got {fp8}", "fp8_matmul_fraction")
    return Overheads(default, families,
                     at("block_overhead_us").number("block_overhead_us", 0.0, positive=False) * 1e-6,
                     at("step_overhead_s").number("step_overhead_s", 0.0, positive=False), fp8,
                     _fraction(at("attention_fraction"), "attention_fraction"),
                     _per_framework(at("framework_fraction"), "framework_fraction"),
                     _per_framework(at("zero3_collective_fraction"), "zero3_collective_fraction"),
                     _nonnegative(facts, "overlap_slowdown"), _list_collective_host(facts),
                     _nonnegative(facts, "list_copy_host_us") * 1e-6,
                     _per_framework(at("framework_block_overhead_us"), "framework_block_overhead_us",
                                    _nonnegative, 1e-6))


def _list_collective_host(c: Checker) -> dict[str, float]:
    key = "list_collective_host_us"
    if not c.has(key):
        return {}
    sub = c.sub(key)
    sub.only(LIST_COLLECTIVES + ("source",))
    return {kind: _nonnegative(sub, kind) * 1e-6 for kind in LIST_COLLECTIVES if sub.has(kind)}


def _fraction(c: Checker, key: str) -> float:
    value = c.number(key, 1.0)
    if value > 1.0:
        raise c.error(f"must be in (0, 1], got {value}", key)
    return value


def _nonnegative(c: Checker, key: str) -> float:
    value = c.number(key, 0.0, positive=False)
    if value < 0.0:
        raise c.error(f"must be >= 0, got {value}", key)
    return value


def _per_framework(c: Checker, key: str, value=_fraction, scale: float = 1.0) -> dict[str, float]:
    """A mapping framework -> number under `key`, each checked by `value`, times `scale`."""
    if not c.has(key):
        return {}
    sub = c.sub(key)
    sub.only(FRAMEWORKS)
    return {name: value(sub, name) * scale for name in sub.mapping}


def load_overheads(path: str | Path = TRAINING_FILE,
                   fitted: str | Path | None = None) -> Overheads:
    """The overheads of training.yaml (measured and published numbers) with the fitted numbers of
    `fitted` (default: fitted.yaml beside the shipped training.yaml; a file given as `path` alone
    holds every key itself, as a user's own file may)."""
    path = Path(path)
    if fitted is None and path.resolve() == TRAINING_FILE.resolve():
        fitted = FITTED_FILE
    if fitted is None:
        return _load(str(path), path.stat().st_mtime_ns, None, 0)
    fitted = Path(fitted)
    return _load(str(path), path.stat().st_mtime_ns, str(fitted), fitted.stat().st_mtime_ns)

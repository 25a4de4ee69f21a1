"""A block's RMSNorms and rotary embeddings run as eager PyTorch ops: their bytes and kernels.

`training.norm_kernel: eager` (Hugging Face's LlamaRMSNorm, torchtitan's `rmsnorm`, fms's
LayerNormParameterized) and `training.rope_kernel: complex` (Meta's and torchtitan's
apply_rotary_emb), `rotate-half` (Hugging Face's apply_rotary_pos_emb) or `matrix` (fms's 2 x 2
rotations) replace the fused kernels `simulator.compute` prices (a norm reads its input and
writes its output, 2e bytes per element forward and twice that backward; RoPE the same on q and
k) by the measured traffic of the eager forms (data/calibration/eager_kernels.yaml, [Note: eager
bytes]); each eager form also launches more kernels (`forward_kernels`), which the host model
charges (`simulator.host.forward_kernels`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from partita.planner import inventory
from partita.planner.documents import Checker
from partita.planner.modelspec import TransformerDims
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.provenance import load_by_provenance

EAGER_FILE = CALIBRATION_DIR / "eager_kernels.yaml"
FORMS = ("rmsnorm_fp32_ops", "rope_complex_fp32", "rope_rotate_half", "rope_matrix_fp32")
# training.norm_kernel / rope_kernel values and the measured forms they run (None: fused)
NORM_FORM = {"fused": None, "eager": "rmsnorm_fp32_ops"}
ROPE_FORM = {"fused": None, "complex": "rope_complex_fp32", "rotate-half": "rope_rotate_half",
             "matrix": "rope_matrix_fp32"}
FIELDS = ("forward_bytes_per_element", "backward_bytes_per_element", "forward_kernels")


@dataclass(frozen=True)
class EagerForm:
    """One eager implementation: bytes per element of its input, forward and backward, at a
    large memory-bound kernel's rate, and the kernels its forward launches."""
    forward_bytes: float
    backward_bytes: float
    forward_kernels: int


@lru_cache(maxsize=4)
def _load(path: str, mtime: int) -> dict[str, EagerForm]:
    c = Checker(load_by_provenance(path), "", path)
    c.only(FORMS + ("source",))
    forms = {}
    for name in FORMS:
        f = c.sub(name)
        f.only(FIELDS)
        forms[name] = EagerForm(f.number(FIELDS[0], required=True, maximum=1e4),
                                f.number(FIELDS[1], required=True, maximum=1e4),
                                f.int(FIELDS[2], required=True, maximum=1000))
    return forms


def eager_forms(path: str | Path = EAGER_FILE) -> dict[str, EagerForm]:
    path = Path(path)
    return _load(str(path), path.stat().st_mtime_ns)


def norm_rope_elements(dims: TransformerDims, micro_batch: int, tp: int, cp: int, sp: bool,
              decoder: bool) -> tuple[float, float]:
    """(elements through the block's norms, elements of q and k through RoPE) on one rank."""
    tokens = micro_batch * dims.seq_len / cp
    norm_tokens = tokens / tp if sp else tokens       # without SP every TP rank repeats them
    norms = (3 if decoder else 2) * norm_tokens * dims.hidden
    rope = 0.0
    if dims.arch == "llama":
        q_heads, kv_heads = inventory.heads_per_rank(dims, tp)
        rope = tokens * (q_heads + kv_heads) * dims.head_dim
    return norms, rope


def extra_bytes(dims: TransformerDims, micro_batch: int, tp: int, cp: int, sp: bool,
                decoder: bool, element_bytes: int, *, norm: str, rope: str) -> tuple[float, float]:
    """(forward, backward) bytes the eager forms move beyond the fused kernels' 2e per element
    forward and 4e backward (`simulator.compute._block_elementwise_bytes`)."""
    if NORM_FORM[norm] is None and ROPE_FORM[rope] is None:
        return 0.0, 0.0
    norms, rope_elements = norm_rope_elements(dims, micro_batch, tp, cp, sp, decoder)
    forms = eager_forms()
    fwd = bwd = 0.0
    fused_f, fused_b = 2.0 * element_bytes, 4.0 * element_bytes
    for count, name in ((norms, NORM_FORM[norm]), (rope_elements, ROPE_FORM[rope])):
        if name is not None:
            form = forms[name]
            fwd += count * (form.forward_bytes - fused_f)
            bwd += count * (form.backward_bytes - fused_b)
    return fwd, bwd


def extra_forward_kernels(dims: TransformerDims, decoder: bool, *, norm: str, rope: str) -> int:
    """Forward kernels the eager forms launch beyond one per norm (a fused RoPE is not counted)."""
    if NORM_FORM[norm] is None and ROPE_FORM[rope] is None:
        return 0
    forms = eager_forms()
    n = 0
    if NORM_FORM[norm] is not None:
        n += (3 if decoder else 2) * (forms[NORM_FORM[norm]].forward_kernels - 1)
    if ROPE_FORM[rope] is not None and dims.arch == "llama":
        n += 2 * forms[ROPE_FORM[rope]].forward_kernels                # q and k
    return n

"""Training batches for `partita run`: a seeded synthetic token stream or the user's token file.

Sample k of the run is a pure function of (source, k): the synthetic stream draws it from a
generator seeded by (seed, k); a token file (a flat array of token ids: uint16 `.bin` as nanoGPT
writes, or a 1-D integer `.npy`) gives the window starting at token k * seq_len (wrapping round).
So any process can build any batch without reading the others', and a pipelined run sees exactly
the batches of the single-process reference.

Step i uses samples [i * GB, (i + 1) * GB); data-parallel rank d of D takes
[i * GB + d * GB / D, i * GB + (d + 1) * GB / D) and cuts it into micro-batches in order.

How a window becomes (inputs, targets) depends on the architecture (as planner.models' sample_batch):
gpt / llama / a `module:` model next-token prediction on seq_len + 1 tokens; bert masked-LM on seq_len tokens (15% of
positions replaced by random tokens, Devlin et al. 2019 Sec. 3.1); t5 seq_len source tokens followed
by seq_len target tokens (decoder input = targets shifted right behind token 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from partita.planner.errors import PartitaError

MASK_FRACTION = 0.15
SUFFIXES = (".bin", ".npy")


@dataclass(frozen=True)
class DataSpec:
    """Where the tokens come from: `path` None means the synthetic stream."""
    arch: str
    seq_len: int
    vocab: int
    seed: int = 0
    path: str | None = None

    @property
    def window(self) -> int:
        """Tokens per sample."""
        return {"gpt": self.seq_len + 1, "llama": self.seq_len + 1, "module": self.seq_len + 1,
                "bert": self.seq_len, "t5": 2 * self.seq_len}[self.arch]


def open_tokens(path: str | Path) -> np.ndarray:
    """The token array of a file, memory-mapped; PartitaError for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise PartitaError(f"--data {path}: no such file (expected a flat array of token ids: "
                           "uint16 .bin as nanoGPT writes, or a 1-D integer .npy)")
    if path.suffix not in SUFFIXES:
        raise PartitaError(f"--data {path}: unknown token file type {path.suffix!r} "
                           f"(valid: {', '.join(SUFFIXES)})")
    if path.suffix == ".bin":
        if path.stat().st_size % 2:
            raise PartitaError(f"--data {path}: {path.stat().st_size} bytes is not a whole number "
                               "of uint16 tokens")
        return np.memmap(path, dtype=np.uint16, mode="r")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise PartitaError(f"--data {path}: not a readable .npy array ({exc})") from None
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise PartitaError(f"--data {path}: expected a 1-D integer array of token ids, got "
                           f"shape {arr.shape} of {arr.dtype}")
    return arr


def check_token_file(spec: DataSpec) -> int:
    """Validate the token file against the model before launch; returns its token count."""
    tokens = open_tokens(spec.path)
    if len(tokens) < spec.window:
        raise PartitaError(f"--data {spec.path}: {len(tokens)} tokens, fewer than one "
                           f"{spec.arch} sample needs ({spec.window})")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= spec.vocab:
        raise PartitaError(f"--data {spec.path}: token ids span [{low}, {high}], outside the "
                           f"model's vocabulary [0, {spec.vocab})")
    return len(tokens)


class TokenStream:
    """Sample k of the run as `window` token ids (int64)."""

    def __init__(self, spec: DataSpec):
        self.spec = spec
        self.tokens = open_tokens(spec.path) if spec.path is not None else None

    def sample(self, k: int) -> np.ndarray:
        w = self.spec.window
        if self.tokens is None:
            rng = np.random.default_rng([self.spec.seed, k])
            return rng.integers(0, self.spec.vocab, size=w, dtype=np.int64)
        start = (k * self.spec.seq_len) % (len(self.tokens) - w + 1)
        return np.asarray(self.tokens[start:start + w], dtype=np.int64)

    def batch(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of samples first .. first + count - 1, each (count, S) or (count, 2S)."""
        rows = [self._example(k) for k in range(first, first + count)]
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def _example(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        tokens, s, arch = self.sample(k), self.spec.seq_len, self.spec.arch
        if arch in ("gpt", "llama", "module"):
            return tokens[:-1], tokens[1:]
        if arch == "bert":
            rng = np.random.default_rng([self.spec.seed, k, 1])
            masked = rng.random(s) < MASK_FRACTION
            noise = rng.integers(0, self.spec.vocab, size=s, dtype=np.int64)
            return np.where(masked, noise, tokens), tokens
        source, targets = tokens[:s], tokens[s:]
        shifted = np.concatenate(([0], targets[:-1]))
        return np.concatenate((source, shifted)), targets


def replica_samples(step: int, global_batch: int, data: int, dp_rank: int) -> tuple[int, int]:
    """(first sample, count) that data-parallel rank `dp_rank` of `data` trains on in `step` (0-based)."""
    per = global_batch // data
    return step * global_batch + dp_rank * per, per

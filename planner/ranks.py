"""Megatron-LM's rank order, written once: which global rank holds which (tp, cp, dp, pp) coordinates.

`RankGenerator` is Megatron-Core's class of the same name (megatron/core/parallel_state.py) for the
dimensions partita models: the order string names the dimensions fastest first, and Megatron's
default `tp-cp-ep-dp-pp` without expert parallelism is `tp-cp-dp-pp`:

    rank = tp + T * (cp + C * (dp + D * pp))

The simulator (simulator/placement.py: which node each rank of a group sits on) and the executor
(executor/plan.py and executor/parallel.py: process groups and the torch device mesh) both read the
order from here, so the plan simulated is the plan launched.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

from partita.planner.errors import PartitaError

DIMS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"


@dataclass(frozen=True, kw_only=True)
class RankGenerator:
    """Degrees of tensor, context, data and pipeline parallelism in one rank order."""
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    order: str = DEFAULT_ORDER

    def __post_init__(self) -> None:
        for dim in DIMS:
            size = getattr(self, dim)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise PartitaError(f"rank order: {dim} must be a positive integer, got {size!r}")
        if sorted(self.order.split("-")) != sorted(DIMS):
            raise PartitaError(f"rank order {self.order!r}: expected the dimensions "
                               f"{', '.join(DIMS)} each once, joined by '-' (e.g. {DEFAULT_ORDER})")

    @property
    def dims(self) -> tuple[str, ...]:
        """The dimensions fastest first."""
        return tuple(self.order.split("-"))

    @property
    def world(self) -> int:
        return prod(self.size(d) for d in DIMS)

    def size(self, dim: str) -> int:
        if dim not in DIMS:
            raise PartitaError(f"rank order: unknown dimension {dim!r} (known: {', '.join(DIMS)})")
        return getattr(self, dim)

    def stride(self, dim: str) -> int:
        """Distance in rank between neighbours along `dim`: the product of the faster dimensions."""
        self.size(dim)
        return prod(self.size(d) for d in self.dims[:self.dims.index(dim)])

    def rank(self, **coords: int) -> int:
        """The global rank at `coords` (a dimension left out is 0)."""
        out = 0
        for dim, value in coords.items():
            if not 0 <= value < self.size(dim):
                raise PartitaError(f"rank order: {dim} = {value} is outside 0..{self.size(dim) - 1}")
            out += value * self.stride(dim)
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """The coordinates of global rank `rank`, keyed by dimension."""
        if not 0 <= rank < self.world:
            raise PartitaError(f"rank order: rank {rank} is outside 0..{self.world - 1}")
        return {d: rank // self.stride(d) % self.size(d) for d in DIMS}

    def groups(self, token: str) -> list[list[int]]:
        """Every group of ranks that differ only in the dimensions of `token` ("tp", "tp-dp", ...),
        as Megatron's `RankGenerator.get_ranks`: within a group the ranks run in the generator's
        order (its fastest dimension first); groups are listed by the remaining coordinates."""
        inner = [d for d in self.dims if d in token.split("-")]
        for d in token.split("-"):
            self.size(d)
        outer = [d for d in self.dims if d not in inner]
        out = []
        for fixed in product(*(range(self.size(d)) for d in reversed(outer))):
            base = dict(zip(reversed(outer), fixed))
            out.append([self.rank(**base, **dict(zip(reversed(inner), moving)))
                        for moving in product(*(range(self.size(d)) for d in reversed(inner)))])
        return sorted(out)

    def mesh(self, dims: tuple[str, ...] = DIMS) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Names and sizes, slowest first, of the row-major device mesh (torch's `init_device_mesh`)
        that numbers ranks in this order, over `dims`; every dimension left out must have size 1."""
        for d in DIMS:
            if d not in dims and self.size(d) != 1:
                raise PartitaError(f"rank order: a mesh without {d} needs {d} = 1, got {self.size(d)}")
        names = tuple(d for d in reversed(self.dims) if d in dims)
        return names, tuple(self.size(d) for d in names)

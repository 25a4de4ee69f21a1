"""Where each rank of a TP x CP x DP x PP plan sits, and how its communication groups span nodes.

Rank order is Megatron-LM's (planner/ranks.py `RankGenerator`: tensor fastest, pipeline slowest).
Ranks fill nodes in order, `gpus_per_node` at a time. A group's shape decides which links its collectives use and how
many GPUs of one node share that node's network interfaces at the same moment.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from partita.planner.ranks import RankGenerator
from partita.simulator.network import Group


@dataclass(frozen=True)
class GroupShape:
    """n ranks of one collective group: `per_node` of them on each of `nodes` nodes.

    `sharing` is how many GPUs of one node run the same kind of collective off-node at once (all
    groups of a kind run together), i.e. how many ways the node's NICs are shared.
    """
    n: int
    per_node: int
    nodes: int
    sharing: int

    @property
    def intra_only(self) -> bool:
        return self.nodes <= 1

    def group(self) -> Group:
        """This shape as a collective group of the network model: every group of its kind runs
        at once, so `per_node * sharing` collectives share a node's NICs."""
        return Group(self.n, self.per_node, concurrent=self.per_node * self.sharing)


@dataclass(frozen=True)
class Placement:
    tensor: int
    context: int
    data: int
    pipeline: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.tensor * self.context * self.data * self.pipeline

    @property
    def ranks(self) -> RankGenerator:
        return RankGenerator(tp=self.tensor, cp=self.context, dp=self.data, pp=self.pipeline)

    @property
    def nodes(self) -> int:
        return ceil(self.gpus / self.gpus_per_node)

    def _group(self, stride: int, size: int) -> GroupShape:
        """Shape of a group of `size` ranks spaced `stride` apart in rank order."""
        g = self.gpus_per_node
        if size <= 1:
            return GroupShape(1, 1, 1, 1)
        if stride >= g:
            per_node = 1
        else:
            per_node = max(1, min(size, g // stride)) if g % stride == 0 else 1
        nodes = ceil(size / per_node)
        sharing = min(g, self.gpus) // per_node if nodes > 1 else 1
        return GroupShape(size, per_node, nodes, max(1, sharing))

    def tp_group(self) -> GroupShape:
        return self._group(self.ranks.stride("tp"), self.tensor)

    def cp_group(self) -> GroupShape:
        return self._group(self.ranks.stride("cp"), self.context)

    def dp_group(self) -> GroupShape:
        return self._group(self.ranks.stride("dp"), self.data)

    def shard_group(self, shard: int) -> GroupShape:
        """A ZeRO shard group: `shard` consecutive data-parallel ranks (`ParallelSpec.data_shard`)."""
        return self._group(self.ranks.stride("dp"), shard)

    def replica_group(self, shard: int) -> GroupShape:
        """The data-parallel ranks at one position of every shard group, which all-reduce that
        position's gradient shard (FSDP HYBRID_SHARD's inter-node group)."""
        return self._group(self.ranks.stride("dp") * shard, self.data // shard)

    def pp_neighbours_same_node(self) -> tuple[bool, ...]:
        """For each boundary between pipeline rank i and i+1: are the two ranks on one node?

        Both ranks of the first model-parallel group (dp = 0, cp = 0, tp = 0) are checked; every
        other group has the same layout when group sizes divide the node size.
        """
        ranks = self.ranks
        out = []
        for i in range(self.pipeline - 1):
            a, b = ranks.rank(pp=i), ranks.rank(pp=i + 1)
            out.append(a // self.gpus_per_node == b // self.gpus_per_node)
        return tuple(out)

    def pp_sharing(self) -> int:
        """GPUs of a node sending pipeline activations off-node at once (they share the NICs)."""
        return max(1, min(self.gpus_per_node, self.ranks.stride("pp")))

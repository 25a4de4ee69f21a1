"""Collective and point-to-point communication times over a two-tier topology (closed forms).

A `Topology` has an intra-node tier (per-GPU links: NVSwitch, NVLink, PCIe) and an inter-node tier
(the node's NICs, shared by its GPUs). A `Group` says how many ranks talk and how they spread over
nodes. Every function returns seconds for a buffer of `nbytes` per rank, as nccl-tests' "size":

    time = base latency + steps * step latency + moved bytes / achieved rate(message size)

where the moved bytes per rank follow nccl-tests doc/PERFORMANCE.md (all-reduce 2(n-1)/n,
reduce-scatter and all-gather (n-1)/n). Rings and trees take the faster of NCCL's two protocols, as
its tuner does: LL (short steps, a quarter of wire * efficiency) or Simple (longer steps, the rate
wire * efficiency * S/(S + n_1/2)) (data/calibration/network.yaml). Across nodes, the groups of a
node that run the same collective at once (`Group.concurrent` GPUs) share the node's NICs. Latency
steps follow NCCL's own tuning model (src/graph/tuning.cc: ring (nsteps - inter steps) * intra +
inter steps * inter; tree 2 * ((ranks per node - 1) * intra + log2(nodes) * inter)).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from partita.planner.errors import PartitaError
from partita.planner.hardware import System
from partita.simulator.calibration import Calibration, TierCalibration

ALLREDUCE_ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "parameter-server", "nvls")
KINDS = ("allreduce", "reduce_scatter", "all_gather", "alltoall")
TREE_BANDWIDTH_FACTOR = 0.9     # NCCL tuning.cc: tree busBw *= .9
LL_BANDWIDTH_FRACTION = 0.25    # NCCL tuning.cc: ring LL (low-latency protocol) busBw *= 1/4
PS_NETWORK_HOPS = 2             # push shard to its server, pull the reduced shard back (Herring)


@dataclass(frozen=True)
class Tier:
    """One kind of link. bytes_per_s: one direction, per GPU (intra) or per node (inter)."""
    kind: str
    bytes_per_s: float
    latency_s: float                    # per algorithm step, low-latency protocol (LL)
    efficiency: float                   # large-message achieved / wire
    base_latency_s: float = 0.0         # per collective call
    half_bandwidth_bytes: float = 0.0   # n_1/2 of the efficiency ramp
    simple_latency_s: float | None = None   # per step, bandwidth protocol (Simple); None: as LL
    # Per collective call, beyond a send's latency: a process group that hands each collective to
    # a worker thread (torch's ProcessGroupGloo queues it, a worker runs gloo's algorithm, the
    # caller waits on the work) pays that hand-off; measured by `partita calibrate` (0 elsewhere).
    collective_overhead_s: float = 0.0
    # A ring collective's transfer rate against a send's on this tier: gloo reduces each received
    # segment and copies on the CPU between its sends (gloo/allreduce.cc `ring`), which a plain send
    # does not; measured by `partita calibrate` (1 elsewhere: NCCL's efficiency is in `efficiency`).
    collective_efficiency: float = 1.0

    def step_latency(self, protocol: str) -> float:
        """Per-step latency of NCCL's `protocol` ("ll" or "simple")."""
        if protocol == "simple" and self.simple_latency_s is not None:
            return self.simple_latency_s
        return self.latency_s

    def rate(self, message_bytes: float, low_latency: bool = True, protocol: str | None = None
             ) -> float:
        """Achieved bytes/s for a collective on a per-rank buffer of `message_bytes`.

        The bandwidth protocol (Simple) ramps up as S/(S + n_1/2); NCCL's low-latency protocol
        (LL) keeps a quarter of the bandwidth at any size. protocol "simple" or "ll" gives that
        protocol's rate; None the better of the two where LL applies (`low_latency`; NVLS and the
        NVLS tree run the bandwidth protocol only)."""
        s = max(message_bytes, 0.0)
        ramp = s / (s + self.half_bandwidth_bytes) if self.half_bandwidth_bytes > 0 else 1.0
        if protocol == "ll":
            ramp = LL_BANDWIDTH_FRACTION
        elif protocol is None and low_latency:
            ramp = max(ramp, LL_BANDWIDTH_FRACTION)
        return self.bytes_per_s * self.efficiency * ramp

    def transfer(self, moved_bytes: float, message_bytes: float, share: float = 1.0,
                 low_latency: bool = True, protocol: str | None = None) -> float:
        """Seconds to move `moved_bytes` at `share` of this tier's achieved rate."""
        if moved_bytes <= 0:
            return 0.0
        return moved_bytes / (self.rate(message_bytes, low_latency, protocol) * share)


@dataclass(frozen=True)
class Topology:
    system: str
    gpus_per_node: int
    intra: Tier | None                  # None: no GPU-to-GPU fabric (or its bandwidth unknown)
    inter: Tier | None                  # None: single-node system (or its bandwidth unknown)
    nvls_efficiency: float | None = None    # NVLink SHARP all-reduce busbw / wire (NVSwitch 3+)
    pcie_bytes_per_s: float | None = None   # GPU <-> host, for parameter-server copies
    intra_missing: str = ""             # why intra is None, for the error when a group needs it
    inter_missing: str = ""


@dataclass(frozen=True)
class Group:
    """`ranks` ranks, `ranks_per_node` of them on each node spanned; `concurrent`: GPUs of a node
    using the NICs at once for this kind of collective (None: all GPUs of the node)."""
    ranks: int
    ranks_per_node: int
    concurrent: int | None = None

    @property
    def nodes(self) -> int:
        return self.ranks // self.ranks_per_node

    @staticmethod
    def from_stride(size: int, stride: int, gpus_per_node: int) -> "Group":
        """A group whose members are `stride` apart in the global rank order (Megatron: tensor
        stride 1, then context, data, pipeline), ranks numbered node by node."""
        per_node = 1 if stride >= gpus_per_node else max(1, min(size, gpus_per_node // stride))
        return Group(size, per_node)


def tier_from_calibration(t: TierCalibration, bytes_per_s: float,
                          catalog_latency_s: float | None, measured: bool = False) -> Tier:
    """A catalog link with its calibration. A published link latency (a wire figure) is a floor
    under the calibrated per-step latency; a measured one (`partita calibrate`) replaces it."""
    if measured and catalog_latency_s is not None:
        latency = catalog_latency_s
    else:
        latency = max(t.step_latency_s, catalog_latency_s or 0.0)
    simple = None
    if t.simple_step_latency_s is not None and not measured:
        simple = max(t.simple_step_latency_s, latency)      # never below the wire or LL figure
    return Tier(t.kind, bytes_per_s, latency, t.efficiency, t.base_latency_s, t.half_bandwidth_bytes,
                simple, t.collective_overhead_s, t.collective_efficiency)


def build_topology(system: System, cal: Calibration, *, inter_node_gbps: float | None = None,
                   intra_node_gbps: float | None = None,
                   gpus_per_node: int | None = None) -> Topology:
    """Tiers of a catalog system, with the scenario's what-if overrides (Gbit/s per node for the
    network, per GPU one direction inside the node)."""
    g = gpus_per_node or system.gpus_per_node
    local = system.kind == "local"      # `partita calibrate` measured its links: efficiency 1
    intra, intra_missing = _tier(system, cal, "intra", intra_node_gbps, local)
    inter, inter_missing = _tier(system, cal, "inter", inter_node_gbps, local)
    nvls = None
    if intra is not None and not local:
        nvls = cal.tier(intra.kind).nvls_efficiency.get(system.gpu.name)
    return Topology(system.name, g, intra, inter, nvls, system.gpu.pcie_bytes_per_s,
                    intra_missing, inter_missing)


def _tier(system: System, cal: Calibration, which: str, gbps: float | None,
          local: bool) -> tuple[Tier | None, str]:
    link = system.intra if which == "intra" else system.inter
    key = "intra_node_gbps" if which == "intra" else "inter_node_gbps"
    what = "GPU-to-GPU link inside a node" if which == "intra" else "inter-node network"
    if gbps:
        kind = link.kind if link.kind != "none" else "custom"
        bw = gbps * 1e9 / 8
    elif link.kind == "none":
        return None, f"{system.name} has no {what}"
    else:
        kind, bw = link.kind, link.bytes_per_s
        if bw is None:
            return None, (f"{system.name}: the {what}'s bandwidth is not published; set "
                          f"cluster.{key} in the scenario")
    tier = cal.tier("local" if local else kind)
    return tier_from_calibration(tier, bw, link.latency_s, measured=local), ""


# ---- checks ----

def _check(group: Group, topo: Topology) -> None:
    if group.ranks < 1 or group.ranks_per_node < 1 or group.ranks % group.ranks_per_node:
        raise PartitaError(f"communication group of {group.ranks} ranks with "
                           f"{group.ranks_per_node} per node: ranks must be a multiple of ranks "
                           "per node")
    if group.ranks_per_node > topo.gpus_per_node:
        raise PartitaError(f"communication group has {group.ranks_per_node} ranks per node, but "
                           f"{topo.system} has {topo.gpus_per_node} GPUs per node")
    if group.ranks_per_node > 1 and topo.intra is None:
        raise PartitaError(f"{topo.intra_missing or topo.system + ' has no GPU-to-GPU link'}; "
                           f"a group cannot place {group.ranks_per_node} ranks on one node")
    if group.nodes > 1 and topo.inter is None:
        raise PartitaError(f"{topo.inter_missing or topo.system + ' has no inter-node network'}; "
                           f"a group cannot span {group.nodes} nodes")


def _sharers(group: Group, topo: Topology) -> float:
    """How many groups of this node share its NICs (concurrent GPUs / this group's GPUs there)."""
    c = group.concurrent if group.concurrent is not None else topo.gpus_per_node
    return max(c, group.ranks_per_node) / group.ranks_per_node


PROTOCOLS = ("ll", "simple")


def _ring_latency(steps: int, inter_steps: int, topo: Topology, multi_node: bool,
                  protocol: str = "ll") -> float:
    if not multi_node:
        return topo.intra.base_latency_s + steps * topo.intra.step_latency(protocol)
    intra_lat = topo.intra.step_latency(protocol) if topo.intra is not None else 0.0
    return (topo.inter.base_latency_s + (steps - inter_steps) * intra_lat
            + inter_steps * topo.inter.step_latency(protocol))


def _ring(moved: float, nbytes: float, steps: int, inter_steps: int, group: Group,
          topo: Topology) -> float:
    """A ring whose every rank sends `moved` bytes; across nodes each group's ring carries `moved`
    out of every node it spans (NCCL channels cross each node boundary once). NCCL's tuner takes
    the faster protocol: LL (short steps, a quarter of the bandwidth) or Simple (full bandwidth
    after the ramp, longer steps: a ring of thousands of ranks pays thousands of them)."""
    return min(_ring_protocol(moved, nbytes, steps, inter_steps, group, topo, proto)
               for proto in PROTOCOLS)


def _ring_protocol(moved: float, nbytes: float, steps: int, inter_steps: int, group: Group,
                   topo: Topology, protocol: str) -> float:
    if group.nodes == 1:
        return (_ring_latency(steps, 0, topo, False, protocol)
                + topo.intra.transfer(moved, nbytes, protocol=protocol)
                / topo.intra.collective_efficiency)
    t_inter = topo.inter.transfer(moved * _sharers(group, topo), nbytes, protocol=protocol)
    t_intra = (topo.intra.transfer(moved, nbytes, protocol=protocol)
               if group.ranks_per_node > 1 else 0.0)
    return _ring_latency(steps, inter_steps, topo, True, protocol) + max(t_inter, t_intra)


# ---- collectives ----

def ring_allreduce(nbytes: float, group: Group, topo: Topology) -> float:
    """Ring all-reduce: each rank moves 2(n-1)/n of the buffer in 2(n-1) steps (nccl-tests busbw)."""
    _check(group, topo)
    n, k = group.ranks, group.nodes
    if n == 1:
        return 0.0
    return _ring(2 * (n - 1) / n * nbytes, nbytes, 2 * (n - 1), 2 * (k - 1), group, topo)


def reduce_scatter(nbytes: float, group: Group, topo: Topology) -> float:
    """Ring reduce-scatter of an `nbytes` buffer: (n-1)/n of it per rank in n-1 steps."""
    _check(group, topo)
    n, k = group.ranks, group.nodes
    if n == 1:
        return 0.0
    return _ring((n - 1) / n * nbytes, nbytes, n - 1, k - 1, group, topo)


def all_gather(nbytes: float, group: Group, topo: Topology) -> float:
    """Ring all-gather into an `nbytes` buffer: same traffic and steps as reduce-scatter."""
    return reduce_scatter(nbytes, group, topo)


def _within_one_node(nbytes: float, group: Group, topo: Topology) -> float | None:
    """The all-reduce time when the group needs no multi-node algorithm (one rank: nothing; one
    node: the ring over NVLink), else None. Checks the group first."""
    _check(group, topo)
    if group.ranks == 1:
        return 0.0
    if group.nodes == 1:
        return ring_allreduce(nbytes, group, topo)
    return None


def tree_allreduce(nbytes: float, group: Group, topo: Topology) -> float:
    """NCCL double binary tree: a chain inside each node and two binary trees across nodes.

    Latency grows with log2(nodes); every node sends and receives the whole buffer once up and once
    down the trees, which matches the ring's 2(n-1)/n at large n, at 0.9 of its bandwidth.
    """
    single = _within_one_node(nbytes, group, topo)
    if single is not None:
        return single
    return min(_tree_protocol(nbytes, group, topo, proto) for proto in PROTOCOLS)


def _tree_protocol(nbytes: float, group: Group, topo: Topology, protocol: str) -> float:
    r, k = group.ranks_per_node, group.nodes
    intra_lat = topo.intra.step_latency(protocol) if topo.intra is not None else 0.0
    latency = topo.inter.base_latency_s + 2 * ((r - 1) * intra_lat + math.ceil(math.log2(k))
                                               * topo.inter.step_latency(protocol))
    moved = 2 * nbytes
    t_inter = topo.inter.transfer(moved * _sharers(group, topo), nbytes, TREE_BANDWIDTH_FACTOR,
                                  protocol=protocol)
    t_intra = (topo.intra.transfer(moved, nbytes, TREE_BANDWIDTH_FACTOR, protocol=protocol)
               if r > 1 else 0.0)
    return latency + max(t_inter, t_intra)


def nvls_allreduce(nbytes: float, group: Group, topo: Topology) -> float:
    """NVLink SHARP all-reduce inside one node: the switch reduces and multicasts."""
    _check(group, topo)
    if topo.nvls_efficiency is None:
        raise PartitaError(f"{topo.system}: NVLink SHARP (nvls) needs an NVSwitch of the third "
                           "generation or later (H100, H200, B200 nodes)")
    if group.nodes > 1:
        raise PartitaError("nvls all-reduce works inside one node; use hierarchical across nodes")
    n = group.ranks
    if n == 1:
        return 0.0
    moved = 2 * (n - 1) / n * nbytes
    latency = topo.intra.base_latency_s + 2 * topo.intra.latency_s
    share = topo.nvls_efficiency / topo.intra.efficiency
    return latency + topo.intra.transfer(moved, nbytes, share, low_latency=False)


def _intra_allreduce(nbytes: float, r: int, topo: Topology) -> float:
    """Bandwidth part of the in-node phases (reduce-scatter then all-gather, or NVLS)."""
    if r == 1:
        return 0.0
    moved = 2 * (r - 1) / r * nbytes
    share = topo.nvls_efficiency / topo.intra.efficiency if topo.nvls_efficiency else 1.0
    return topo.intra.transfer(moved, nbytes, share, low_latency=False)


def hierarchical_allreduce(nbytes: float, group: Group, topo: Topology) -> float:
    """Reduce-scatter inside the node, all-reduce 1/g of the buffer across nodes, all-gather inside.

    Each accelerator moves 2(g-1)/g P over NVLink but only 2(k-1)/k P/g over the NIC
    (ml-engineering network/README.md); the phases are pipelined over chunks (NCCL NVLSTree), so
    the slower of the two sets the bandwidth term.
    """
    single = _within_one_node(nbytes, group, topo)
    if single is not None:
        return single
    r, k = group.ranks_per_node, group.nodes
    shard = nbytes / r
    per_gpu = 2 * (k - 1) / k * shard
    t_inter = topo.inter.transfer(per_gpu * r * _sharers(group, topo), nbytes, low_latency=False)
    t_intra = _intra_allreduce(nbytes, r, topo)
    intra_lat = topo.intra.latency_s if topo.intra is not None else 0.0
    latency = topo.inter.base_latency_s + 2 * (r - 1) * intra_lat + 2 * (k - 1) * topo.inter.latency_s
    return latency + max(t_inter, t_intra)


def parameter_server_traffic(nbytes: float, nodes: int) -> tuple[float, int]:
    """(bytes each node sends over the network, network hops) of a sharded parameter server:
    the node keeps its own shard and pushes the other (k-1)/k, then pulls as much back."""
    return (nodes - 1) / nodes * nbytes, PS_NETWORK_HOPS


def parameter_server(nbytes: float, group: Group, topo: Topology) -> float:
    """SageMaker data parallel (Herring, SC20): reduce inside the node, shard the node's fusion
    buffer over one server per node (on the nodes' CPUs), push shard i to server i and pull the
    reduced shard back: 2 network hops whatever the node count; then broadcast inside the node.
    The GPU-host copies over PCIe are pipelined with the network (balanced fusion buffers).

    Against `hierarchical_allreduce` the design changes the hops, not the bytes: each node's NICs
    carry (k-1)/k of the buffer out and in for the push, and again for the pull, 2(k-1)/k in all,
    what the NVLS tree's inter-node all-reduce of the node's shards carries too (Thangakrishnan et
    al. 2020, "Herring", Sec. 3: every worker sends and receives its gradients once). So at
    bandwidth-bound sizes the two are equal (the 0.1% of #16); the parameter server saves latency,
    2 network hops against 2(k-1), which shows for small buffers on many nodes, and adds the PCIe
    copies to the CPU servers, which bind where PCIe is slower than the NIC share."""
    single = _within_one_node(nbytes, group, topo)
    if single is not None:
        return single
    r, k = group.ranks_per_node, group.nodes
    sent, hops = parameter_server_traffic(nbytes, k)
    # push and pull each load the NICs with `sent` per group in each direction
    t_net = 2 * topo.inter.transfer(sent * _sharers(group, topo), nbytes, low_latency=False)
    t_intra = _intra_allreduce(nbytes, r, topo)
    t_pcie = 2 * (nbytes / r) / topo.pcie_bytes_per_s if topo.pcie_bytes_per_s else 0.0
    intra_lat = topo.intra.latency_s if topo.intra is not None else 0.0
    latency = topo.inter.base_latency_s + 2 * (r - 1) * intra_lat + hops * topo.inter.latency_s
    return latency + max(t_net, t_intra, t_pcie)


def alltoall(nbytes: float, group: Group, topo: Topology) -> float:
    """Each rank sends 1/n of its `nbytes` buffer to every other rank, all at once."""
    _check(group, topo)
    n, r = group.ranks, group.ranks_per_node
    if n == 1:
        return 0.0
    piece = nbytes / n
    t_intra = topo.intra.transfer((r - 1) * piece, nbytes) if r > 1 else 0.0
    if group.nodes == 1:
        return topo.intra.base_latency_s + topo.intra.latency_s + t_intra
    t_inter = topo.inter.transfer((n - r) * piece * r * _sharers(group, topo), nbytes)
    return topo.inter.base_latency_s + topo.inter.latency_s + max(t_intra, t_inter)


def p2p(nbytes: float, same_node: bool, topo: Topology, *, concurrent: int | None = None) -> float:
    """One send/recv of `nbytes` (pipeline activations and gradients). Across nodes `concurrent`
    GPUs of the node send at once (default: all of them) and share its NICs."""
    if nbytes <= 0:
        return 0.0
    if same_node:
        if topo.intra is None:
            raise PartitaError(topo.intra_missing or f"{topo.system} has no GPU-to-GPU link")
        t = topo.intra
        return t.base_latency_s + t.latency_s + t.transfer(nbytes, nbytes)
    if topo.inter is None:
        raise PartitaError(topo.inter_missing or f"{topo.system} has no inter-node network")
    c = concurrent if concurrent is not None else topo.gpus_per_node
    t = topo.inter
    return t.base_latency_s + t.latency_s + t.transfer(nbytes * c, nbytes)


def collective(kind: str, algorithm: str, nbytes: float, group: Group, topo: Topology) -> float:
    """Seconds for `kind` (allreduce | reduce_scatter | all_gather | alltoall) with `algorithm`
    (auto | ring | tree | hierarchical | parameter-server | nvls; all but auto and ring are
    all-reduce algorithms). auto takes the fastest of what NCCL would consider, as NCCL's tuner
    does: ring (and NVLS on Hopper NVSwitch) inside a node; ring, tree and, with NVLS, the
    hierarchical NVLS tree across nodes."""
    if kind not in KINDS:
        raise PartitaError(f"unknown collective {kind!r} (valid: {', '.join(KINDS)})")
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise PartitaError(f"unknown collective algorithm {algorithm!r} "
                           f"(valid: {', '.join(ALLREDUCE_ALGORITHMS)})")
    if kind != "allreduce":
        if algorithm not in ("auto", "ring"):
            raise PartitaError(f"{kind} runs as a ring; algorithm {algorithm!r} is for all-reduce")
        seconds = {"reduce_scatter": reduce_scatter, "all_gather": all_gather,
                   "alltoall": alltoall}[kind](nbytes, group, topo)
    elif algorithm == "auto":
        seconds = min(f(nbytes, group, topo) for f in auto_candidates(group, topo))
    else:
        seconds = ALLREDUCE[algorithm](nbytes, group, topo)
    return seconds + _call_overhead(group, topo, nbytes) if seconds > 0 else seconds


GLOO_ELEMENT_BYTES = 4      # the scalars and fp32 buffers a gloo all-reduce carries on a CPU


def _call_overhead(group: Group, topo: Topology, nbytes: float) -> float:
    """`Tier.collective_overhead_s` of the tier the group's collective crosses last (the network
    across nodes, else the link inside the node). It is measured on buffers that fill gloo's ring:
    at least 2N segments of one element or more, a send/recv round each (gloo/allreduce.cc
    `ring`); a buffer of fewer elements sends only its non-empty segments and pays that share."""
    tier = topo.inter if group.nodes > 1 else topo.intra
    if tier is None or tier.collective_overhead_s <= 0.0:
        return 0.0
    segments = 2 * group.ranks
    filled = min(segments, max(1.0, math.ceil(nbytes / GLOO_ELEMENT_BYTES)))
    return tier.collective_overhead_s * filled / segments


def auto_candidates(group: Group, topo: Topology) -> list:
    _check(group, topo)
    nvls = topo.nvls_efficiency is not None
    if group.nodes == 1:
        return [ring_allreduce] + ([nvls_allreduce] if nvls and group.ranks > 1 else [])
    out = [ring_allreduce, tree_allreduce]
    if nvls and group.ranks_per_node > 1:
        out.append(hierarchical_allreduce)
    return out


ALLREDUCE = {"ring": ring_allreduce, "tree": tree_allreduce, "hierarchical": hierarchical_allreduce,
             "parameter-server": parameter_server, "nvls": nvls_allreduce}


@dataclass(frozen=True)
class CpRing:
    comm_s: float       # all ring steps' transfers
    exposed_s: float    # what the attention compute does not hide


def cp_ring_time(kv_bytes: float, cp: int, same_node: bool, topo: Topology, *,
                 attention_s: float = 0.0, concurrent: int | None = None,
                 overlap: Callable[[float, float], float] = max) -> CpRing:
    """Context parallelism (ring attention): cp-1 steps, each passing this rank's K,V block
    (`kv_bytes`; pass K,V plus dK,dV for the backward) to the next rank while attending over the
    block received before. Step i's transfer hides behind step i's compute (attention_s / cp):
    a step costs overlap(compute, transfer), by default the ideal max."""
    if cp <= 1:
        return CpRing(0.0, 0.0)
    step = p2p(kv_bytes, same_node, topo, concurrent=concurrent)
    compute = attention_s / cp
    total = compute + (cp - 1) * overlap(compute, step)
    return CpRing((cp - 1) * step, max(0.0, total - attention_s))

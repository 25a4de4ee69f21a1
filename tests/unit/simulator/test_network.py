"""Collective cost model: hand-computed ring/tree/hierarchical/parameter-server times, properties
(monotone in bytes, never slower with more bandwidth), topology building and its errors."""
from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.planner.errors import PartitaError
from partita.planner.hardware import GPU, Fabric, Network, System
from partita.planner.paths import CALIBRATION_DIR
from partita.simulator.calibration import load_calibration
from partita.simulator.network import (ALLREDUCE, Group, Tier, Topology, all_gather, alltoall,
                               build_topology, collective, cp_ring_time, hierarchical_allreduce,
                               p2p, parameter_server, parameter_server_traffic, reduce_scatter,
                               ring_allreduce, tree_allreduce)

GB = 1e9
IDEAL_INTRA = Tier("nvswitch", 300 * GB, 0.0, 1.0)          # no latency, efficiency 1, no ramp
IDEAL_INTER = Tier("efa", 50 * GB, 0.0, 1.0)
IDEAL = Topology("ideal", 8, IDEAL_INTRA, IDEAL_INTER)
S = 256e6


@pytest.fixture(scope="module")
def cal():
    return load_calibration(include_local=False)


def a100_gpu(name="a100-80gb"):
    return GPU(name, name, 80 * 2**30, 2.0e12, {"bf16": 312e12}, nvlink_bytes_per_s=300 * GB,
               pcie_bytes_per_s=32 * GB)


def system(gpu=None, intra="nvswitch", inter="efa", node_gbps=400, gpus=8, kind="cloud"):
    gpu = gpu or a100_gpu()
    return System("box", kind, gpu, gpus, Fabric(intra, 300 * GB, None),
                  Network(inter, 4, node_gbps * GB / 8, None))


# ---- hand-computed answers ----

def test_a_collective_overhead_is_paid_per_collective_call_not_per_send():
    """`Tier.collective_overhead_s` (gloo's hand-off of each collective to a worker thread, as
    `partita calibrate` measures it) adds once to every collective over that tier, never to a
    point-to-point send, and not to a collective of one rank (which does nothing)."""
    slow = replace(IDEAL_INTRA, collective_overhead_s=1e-4)
    topo = Topology("t", 8, slow, replace(IDEAL_INTER, collective_overhead_s=3e-4))
    for kind in ("allreduce", "reduce_scatter", "all_gather"):
        assert collective(kind, "auto", S, Group(4, 4), topo) == pytest.approx(
            collective(kind, "auto", S, Group(4, 4), IDEAL) + 1e-4)
        assert collective(kind, "ring", S, Group(16, 8), topo) == pytest.approx(
            collective(kind, "ring", S, Group(16, 8), IDEAL) + 3e-4)     # across nodes: the NIC's
    assert collective("allreduce", "auto", S, Group(1, 1), topo) == 0.0
    assert p2p(S, True, topo) == p2p(S, True, IDEAL)


def test_a_collective_efficiency_slows_a_rings_transfer_but_not_a_send():
    slow = replace(IDEAL_INTRA, collective_efficiency=0.5)
    topo = Topology("t", 8, slow, IDEAL_INTER)
    for kind in ("allreduce", "reduce_scatter", "all_gather"):
        assert collective(kind, "ring", S, Group(4, 4), topo) == pytest.approx(
            2 * collective(kind, "ring", S, Group(4, 4), IDEAL))
    assert p2p(S, True, topo) == p2p(S, True, IDEAL)


def test_a_buffer_that_leaves_gloos_ring_segments_empty_pays_their_share_of_the_overhead():
    """gloo's ring cuts a buffer into at least 2N segments and runs a round per non-empty one
    (gloo/allreduce.cc `ring`): a one-element all-reduce over 2 ranks fills 1 of 4 segments and
    pays a quarter of the per-collective overhead, 4 elements or more all of it."""
    slow = replace(IDEAL_INTRA, collective_overhead_s=1e-3)
    topo = Topology("t", 8, slow, IDEAL_INTER)

    def extra(nbytes):
        return (collective("allreduce", "ring", nbytes, Group(2, 2), topo)
                - collective("allreduce", "ring", nbytes, Group(2, 2), IDEAL))
    assert extra(4) == pytest.approx(2.5e-4)
    assert extra(8) == pytest.approx(5e-4)
    assert extra(16) == pytest.approx(1e-3) and extra(S) == pytest.approx(1e-3)



def test_ring_moves_two_n_minus_one_over_n_of_the_buffer():
    for n in (2, 4, 8):
        assert ring_allreduce(S, Group(n, n), IDEAL) == pytest.approx(2 * (n - 1) / n * S / (300 * GB))


def test_ring_across_nodes_is_bound_by_the_node_nics():
    one_per_node = Group(16, 1, concurrent=1)
    assert ring_allreduce(S, one_per_node, IDEAL) == pytest.approx(2 * 15 / 16 * S / (50 * GB))
    # all 8 GPUs of each node in their own data-parallel ring at once share the NICs
    assert ring_allreduce(S, Group(16, 1), IDEAL) == pytest.approx(8 * 2 * 15 / 16 * S / (50 * GB))
    # one ring over whole nodes: each node boundary carries the ring's 2(n-1)/n once
    assert ring_allreduce(S, Group(32, 8), IDEAL) == pytest.approx(2 * 31 / 32 * S / (50 * GB))


def test_reduce_scatter_and_all_gather_move_n_minus_one_over_n():
    expect = 7 / 8 * S / (300 * GB)
    assert reduce_scatter(S, Group(8, 8), IDEAL) == pytest.approx(expect)
    assert all_gather(S, Group(8, 8), IDEAL) == pytest.approx(expect)


def test_hierarchical_on_one_node_is_the_ring():
    for n in (2, 8):
        assert hierarchical_allreduce(S, Group(n, n), IDEAL) == ring_allreduce(S, Group(n, n), IDEAL)


def test_hierarchical_sends_one_gth_over_the_nic():
    k = 4
    # each accelerator moves 2(k-1)/k P/g over the NIC; the node's g accelerators share it
    expect_nic = 2 * (k - 1) / k * S / (50 * GB)
    assert hierarchical_allreduce(S, Group(8 * k, 8), IDEAL) == pytest.approx(expect_nic)
    assert hierarchical_allreduce(S, Group(8 * k, 8), IDEAL) < ring_allreduce(S, Group(8 * k, 8), IDEAL)


def test_tree_bandwidth_is_close_to_the_ring_at_scale():
    group = Group(8 * 64, 8)
    ratio = tree_allreduce(S, group, IDEAL) / ring_allreduce(S, group, IDEAL)
    assert 1.0 < ratio < 1.0 / 0.9 + 0.01          # 2S vs 2(n-1)/n S, at 0.9 of the bandwidth


def test_parameter_server_sends_the_same_per_node_with_constant_hops():
    for k in (2, 4, 16, 64, 256):
        sent, hops = parameter_server_traffic(S, k)
        assert sent == pytest.approx((k - 1) / k * S) and sent < S and hops == 2
    expect = 2 * 3 / 4 * S / (50 * GB)              # push then pull, whole-node groups
    assert parameter_server(S, Group(32, 8), IDEAL) == pytest.approx(expect)


def test_parameter_server_latency_does_not_grow_with_nodes():
    lat = Topology("lat", 8, Tier("nvswitch", 1e15, 1e-6, 1.0), Tier("efa", 1e15, 20e-6, 1.0))
    ps = [parameter_server(8e3, Group(8 * k, 8), lat) for k in (2, 16, 128)]
    ring = [ring_allreduce(8e3, Group(8 * k, 8), lat) for k in (2, 16, 128)]
    assert ps[0] == pytest.approx(ps[-1], rel=1e-6)
    assert ps[0] == pytest.approx(2 * 7 * 1e-6 + 2 * 20e-6, rel=1e-6)   # reduce, 2 hops, broadcast
    # ring: 2(k-1) network steps and 2(n-1) - 2(k-1) NVLink steps, k = 2 -> 128
    assert ring[-1] - ring[0] == pytest.approx(2 * 126 * 20e-6 + (1792 - 28) * 1e-6, rel=1e-6)


def test_latency_steps_follow_nccl():
    lat = Topology("lat", 8, Tier("nvswitch", 300 * GB, 1e-6, 1.0, 5e-6),
                   Tier("efa", 50 * GB, 10e-6, 1.0, 7e-6))
    tiny = 1.0
    # ring over 2 nodes x 8: 30 steps, 2 of them between nodes
    assert ring_allreduce(tiny, Group(16, 8), lat) == pytest.approx(7e-6 + 28e-6 + 20e-6, rel=1e-3)
    # tree over 4 nodes: 2 * (7 intra + log2(4) inter)
    assert tree_allreduce(tiny, Group(32, 8), lat) == pytest.approx(7e-6 + 2 * (7e-6 + 20e-6), rel=1e-3)


def test_big_buffers_pay_the_bandwidth_protocols_step_latency():
    # LL: 1 us and 10 us per step at a quarter of the bandwidth; Simple: 3 us and 20 us at all of it
    # (no ramp). NCCL's tuner takes the faster: LL for a tiny buffer, Simple for a big one.
    lat = Topology("lat", 8, Tier("nvswitch", 300 * GB, 1e-6, 1.0, 5e-6, simple_latency_s=3e-6),
                   Tier("efa", 50 * GB, 10e-6, 1.0, 7e-6, simple_latency_s=20e-6))
    group = Group(1024, 8, concurrent=8)            # 128 nodes: 1023 steps, 127 of them between nodes
    tiny, big = 1.0, 1e9
    ll_steps, simple_steps = 896 * 1e-6 + 127 * 10e-6, 896 * 3e-6 + 127 * 20e-6
    assert all_gather(tiny, group, lat) == pytest.approx(7e-6 + ll_steps + 1023 / 1024 * tiny
                                                         / (0.25 * 50 * GB), rel=1e-6)
    assert all_gather(big, group, lat) == pytest.approx(7e-6 + simple_steps + 1023 / 1024 * big
                                                        / (50 * GB), rel=1e-6)
    # tree: 2 * (7 intra + log2(128) inter) steps, Simple for the big buffer
    assert tree_allreduce(big, group, lat) == pytest.approx(
        7e-6 + 2 * (7 * 3e-6 + 7 * 20e-6) + 2 * big / (0.9 * 50 * GB), rel=1e-6)
    # without a Simple figure a tier keeps its one step latency (the tests above)
    assert Tier("efa", 50 * GB, 10e-6, 1.0).step_latency("simple") == 10e-6


def test_simple_step_latency_comes_from_the_calibration(cal):
    ib = build_topology(system(inter="infiniband"), cal).inter
    assert (ib.latency_s, ib.simple_latency_s) == pytest.approx((5.5e-6, 14e-6))
    slow = System("slow", "onprem", a100_gpu(), 8, Fabric("nvswitch", 300 * GB, None),
                  Network("infiniband", 8, 200 * GB, 1e-3))
    assert build_topology(slow, cal).inter.simple_latency_s == 1e-3     # the wire is the floor


def test_alltoall_and_p2p():
    assert alltoall(S, Group(8, 8), IDEAL) == pytest.approx(7 / 8 * S / (300 * GB))
    assert p2p(S, True, IDEAL) == pytest.approx(S / (300 * GB))
    assert p2p(S, False, IDEAL, concurrent=1) == pytest.approx(S / (50 * GB))
    assert p2p(S, False, IDEAL) == pytest.approx(8 * S / (50 * GB))


def test_cp_ring_overlaps_with_attention():
    step = S / (300 * GB)
    hidden = cp_ring_time(S, 4, True, IDEAL, attention_s=8 * step)
    assert hidden.comm_s == pytest.approx(3 * step) and hidden.exposed_s == pytest.approx(0.0)
    exposed = cp_ring_time(S, 4, True, IDEAL, attention_s=2 * step)
    # compute 0.5 step each: 0.5 + 3 * max(1, 0.5) - 2 = 1.5 steps exposed
    assert exposed.exposed_s == pytest.approx(1.5 * step)
    assert cp_ring_time(S, 1, True, IDEAL) == cp_ring_time(0, 1, True, IDEAL)


# ---- properties ----

ALGOS = ["ring", "tree", "hierarchical", "parameter-server", "auto"]
sizes = st.floats(min_value=1.0, max_value=1e10, allow_nan=False)
layouts = st.sampled_from([(8, 8), (16, 8), (64, 8), (32, 1), (8, 2), (128, 4)])


@settings(max_examples=150, deadline=None)
@given(sizes, sizes, layouts, st.sampled_from(ALGOS))
def test_monotone_in_bytes(a, b, layout, algorithm):
    cal = load_calibration(include_local=False)
    topo = build_topology(system(), cal)
    group = Group(*layout)
    lo, hi = sorted((a, b))
    assert collective("allreduce", algorithm, lo, group, topo) <= collective(
        "allreduce", algorithm, hi, group, topo) * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(sizes, layouts, st.sampled_from(ALGOS), st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower(size, layout, algorithm, intra_x, inter_x):
    cal = load_calibration(include_local=False)
    base = build_topology(system(), cal)
    faster = replace(base, intra=replace(base.intra, bytes_per_s=base.intra.bytes_per_s * intra_x),
                     inter=replace(base.inter, bytes_per_s=base.inter.bytes_per_s * inter_x))
    group = Group(*layout)
    assert collective("allreduce", algorithm, size, group, faster) <= collective(
        "allreduce", algorithm, size, group, base) * (1 + 1e-12)


def test_auto_is_the_fastest_candidate(cal):
    topo = build_topology(system(), cal)
    for layout in ((8, 8), (64, 8), (16, 1)):
        group = Group(*layout)
        for size in (1e3, 1e6, 1e9):
            auto = collective("allreduce", "auto", size, group, topo)
            assert auto <= ring_allreduce(size, group, topo)
            if group.nodes > 1:
                assert auto <= tree_allreduce(size, group, topo)


def test_nvls_on_hopper_nvswitch(cal):
    h100 = GPU("h100-80gb", "H100", 80 * 2**30, 3.35e12, {"bf16": 989e12})
    hopper = build_topology(system(h100), cal)
    ampere = build_topology(system(), cal)
    assert hopper.nvls_efficiency is not None and ampere.nvls_efficiency is None
    group = Group(8, 8)
    assert collective("allreduce", "auto", 1e9, group, hopper) < ring_allreduce(1e9, group, hopper)
    assert collective("allreduce", "nvls", 1e9, group, hopper) < ring_allreduce(1e9, group, hopper)
    with pytest.raises(PartitaError, match="nvls"):
        collective("allreduce", "nvls", 1e9, group, ampere)


def test_what_if_bandwidth_overrides(cal):
    base = build_topology(system(), cal)
    fast = build_topology(system(), cal, inter_node_gbps=800, intra_node_gbps=4800, gpus_per_node=4)
    assert fast.inter.bytes_per_s == pytest.approx(100 * GB) == 2 * base.inter.bytes_per_s
    assert fast.intra.bytes_per_s == pytest.approx(600 * GB)
    assert fast.gpus_per_node == 4
    group = Group(16, 1, concurrent=1)
    assert ring_allreduce(1e9, group, fast) < ring_allreduce(1e9, group, base)


def test_catalog_latency_is_a_floor(cal):
    slow = System("slow", "onprem", a100_gpu(), 8, Fabric("nvswitch", 300 * GB, None),
                  Network("infiniband", 8, 200 * GB, 1e-3))
    assert build_topology(slow, cal).inter.latency_s == 1e-3
    assert build_topology(system(inter="infiniband"), cal).inter.latency_s == pytest.approx(5.5e-6)


def test_local_system_uses_its_measured_links(cal):
    local = System("local", "local", a100_gpu("local-cpu"), 2, Fabric("host", 5 * GB, 12e-6),
                   Network("none", 0, None, None))
    topo = build_topology(local, cal)
    assert topo.intra.kind == "local" and topo.intra.efficiency == 1.0
    assert topo.intra.latency_s == 12e-6 and topo.intra.base_latency_s == 0.0
    assert p2p(1.0, True, topo) == pytest.approx(12e-6, rel=1e-3)


def test_group_from_stride():
    assert Group.from_stride(8, 1, 8) == Group(8, 8)        # tensor parallel inside a node
    assert Group.from_stride(16, 8, 8) == Group(16, 1)      # data parallel across nodes
    assert Group.from_stride(8, 2, 8) == Group(8, 4)        # 4 members per node
    assert Group(8, 4).nodes == 2


def test_model_matches_measured_sweeps_above_one_mib(cal):
    """The measured sweeps of data/calibration/collective_sweeps.yaml, within 10% median."""
    doc = yaml.safe_load((CALIBRATION_DIR / "collective_sweeps.yaml").read_text())
    for s in doc["sweeps"][:2]:
        gpu = GPU(s["gpu"], s["gpu"], 80 * 2**30, 3.35e12, {"bf16": 989e12})
        sysm = System("sweep", "cloud", gpu, s["gpus_per_node"],
                      Fabric(s["intra"]["kind"], s["intra"]["unidir_GBps"] * GB, None),
                      Network(s["inter"]["kind"], 1, s["inter"]["node_gbps"] * GB / 8, None))
        topo = build_topology(sysm, cal)
        for tier, fields in (s.get("tier_overrides") or {}).items():
            topo = replace(topo, **{tier: replace(getattr(topo, tier), **fields)})
        group = Group(s["ranks"], s["ranks_per_node"])
        errors = [abs(collective("allreduce", s["algorithm"], n, group, topo) / (t * 1e-6) - 1)
                  for n, t in s["size_bytes_time_us"] if n >= 2**20]
        assert statistics.median(errors) < 0.10, s["name"]


# ---- errors ----

def test_group_errors(cal):
    topo = build_topology(system(), cal)
    single = build_topology(replace(system(), inter=Network("none", 0, 0.0, None)), cal)
    lonely = build_topology(System("one", "cloud", a100_gpu(), 1, Fabric("none", 0.0, None),
                                   Network("efa", 1, 12.5 * GB, None)), cal)
    with pytest.raises(PartitaError, match="no inter-node network; a group cannot span 2 nodes"):
        ring_allreduce(S, Group(16, 8), single)
    with pytest.raises(PartitaError, match="has 8 GPUs per node"):
        ring_allreduce(S, Group(16, 16), topo)
    with pytest.raises(PartitaError, match="multiple of ranks per node"):
        ring_allreduce(S, Group(12, 8), topo)
    with pytest.raises(PartitaError, match="GPUs per node"):
        ring_allreduce(S, Group(2, 2), lonely)
    with pytest.raises(PartitaError, match="no GPU-to-GPU link"):
        p2p(S, True, lonely)


def test_bad_kind_and_algorithm(cal):
    topo = build_topology(system(), cal)
    with pytest.raises(PartitaError, match=r"unknown collective 'allgather' \(valid: allreduce"):
        collective("allgather", "auto", S, Group(8, 8), topo)
    with pytest.raises(PartitaError, match=r"unknown collective algorithm 'rings'"):
        collective("allreduce", "rings", S, Group(8, 8), topo)
    with pytest.raises(PartitaError, match="runs as a ring"):
        collective("reduce_scatter", "tree", S, Group(8, 8), topo)
    assert set(ALLREDUCE) | {"auto"} == set(ALGOS) | {"nvls"}


def test_unpublished_bandwidth_needs_a_what_if(cal):
    unknown = System("g5-like", "cloud", a100_gpu(), 8, Fabric("pcie", None, None),
                     Network("efa", 1, 12.5 * GB, None))
    topo = build_topology(unknown, cal)
    with pytest.raises(PartitaError, match=r"g5-like: the GPU-to-GPU link inside a node's bandwidth "
                                           r"is not published; set cluster\.intra_node_gbps"):
        ring_allreduce(S, Group(8, 8), topo)
    assert ring_allreduce(S, Group(4, 1), topo) > 0                   # the network is known
    fixed = build_topology(unknown, cal, intra_node_gbps=256)
    assert fixed.intra.bytes_per_s == pytest.approx(32 * GB) and fixed.intra.kind == "pcie"
    lonely = System("one", "cloud", a100_gpu(), 1, Fabric("none", None, None),
                    Network("none", 0, None, None))
    what_if = build_topology(lonely, cal, intra_node_gbps=800, inter_node_gbps=100, gpus_per_node=4)
    assert what_if.intra.kind == "custom" and what_if.inter.kind == "custom"
    assert ring_allreduce(S, Group(8, 4), what_if) > 0


def test_every_catalog_system_builds(cal):
    from partita.planner.catalog import load_catalog
    catalog = load_catalog()
    for name in catalog.system_names():
        s = catalog.system(name)
        topo = build_topology(s, cal)
        if topo.intra is not None and s.gpus_per_node > 1:
            assert ring_allreduce(S, Group(s.gpus_per_node, s.gpus_per_node), topo) > 0, name
        if topo.inter is not None:
            assert ring_allreduce(S, Group(2, 1), topo) > 0, name


def test_unknown_link_kind_in_catalog(cal):
    with pytest.raises(PartitaError, match=r"unknown link tier in the calibration 'nvlinkk'; did you mean 'nvlink'"):
        build_topology(system(intra="nvlinkk"), cal)


def test_tier_overrides_and_new_tiers(tmp_path):
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump({"tiers": {"efa": {"efficiency": 0.5},
                                              "slingshot": {"efficiency": 0.9, "step_latency_us": 2,
                                                            "base_latency_us": 5,
                                                            "half_bandwidth_mb": 4}}}))
    cal = load_calibration(path, include_local=False)
    assert cal.tier("efa").efficiency == 0.5
    assert cal.tier("efa").step_latency_s == load_calibration(include_local=False).tier("efa").step_latency_s
    assert cal.tier("slingshot").half_bandwidth_bytes == 4e6
    path.write_text(yaml.safe_dump({"tiers": {"slingshot": {"efficiency": 0.9}}}))
    with pytest.raises(PartitaError, match=r"net\.yaml: tiers\.slingshot: missing required key 'step_latency_us'"):
        load_calibration(path, include_local=False)
    path.write_text(yaml.safe_dump({"tiers": {"efa": {"step_latency_us": -1}}}))
    with pytest.raises(PartitaError, match=r"tiers\.efa\.step_latency_us: must be >= 0"):
        load_calibration(path, include_local=False)
    path.write_text(yaml.safe_dump({"tiers": {"efa": {"simple_step_latency_us": -2}}}))
    with pytest.raises(PartitaError, match=r"tiers\.efa\.simple_step_latency_us: must be >= 0"):
        load_calibration(path, include_local=False)

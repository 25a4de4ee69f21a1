"""The pipeline simulation against closed forms and hand-timed cases, its properties, and the
Chrome trace it writes."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.planner.errors import PartitaError
from partita.planner.schedule import (NAMES, Action, add_comms, build, gpipe, interleaved_1f1b,
                              one_f_one_b, peak_inflight_by_rank, zero_bubble_h1)
from partita.simulator.pipeline import PipelineCosts, compile_schedule, simulate_pipeline
from partita.simulator.result import Span
from partita.simulator.trace import chrome_trace, read_trace, spans_from_trace, write_trace


def test_one_f_one_b_by_hand():
    tl = simulate_pipeline(one_f_one_b(4, 8), PipelineCosts.uniform(4, 1.0, 2.0))
    assert tl.makespan_s == pytest.approx((8 + 4 - 1) * (1.0 + 2.0))
    assert tl.busy_s == (24.0,) * 4
    assert tl.idle_s == (9.0,) * 4
    assert tl.bubble_fraction == pytest.approx(9 / 33)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("b", [1.0, 2.0, 3.0])
def test_uniform_free_comm_closed_form(name, p, m, b):
    tl = simulate_pipeline(build(name, p, m), PipelineCosts.uniform(p, 1.0, b))
    assert tl.makespan_s == pytest.approx((m + p - 1) * (1.0 + b))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4),
       st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_interleaved_bubble_is_megatrons(p, rounds, v, f, b):
    """Chunks of f/v and b/v: step = m(f + b) + (p - 1)(f + b)/v, i.e. bubble (p-1)/(v m)."""
    m = rounds * p
    tl = simulate_pipeline(interleaved_1f1b(p, m, v), PipelineCosts.uniform(p * v, f / v, b / v))
    ideal = m * (f + b)
    assert tl.makespan_s == pytest.approx(ideal + (p - 1) * (f + b) / v)
    assert (tl.makespan_s - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 6), st.floats(0.1, 3.0), st.floats(0.1, 3.0),
       st.floats(0.0, 1.0))
def test_zero_bubble_h1_closed_form(p, extra, f, i, share):
    """Qi et al. 2023, section 3.1: bubble (p-1)(f + i - w) instead of 1F1B's (p-1)(f + i + w)."""
    m, w = p + extra, share * min(f, i)
    costs = PipelineCosts.uniform(p, f, i + w, weight_s=w)
    zb = simulate_pipeline(zero_bubble_h1(p, m), costs).makespan_s
    assert zb == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))
    one = simulate_pipeline(one_f_one_b(p, m), costs).makespan_s
    assert one == pytest.approx(m * (f + i + w) + (p - 1) * (f + i + w))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 10), st.floats(0.01, 3.0), st.floats(0.01, 5.0),
       st.floats(0.0, 1.0), st.data())
def test_zero_bubble_never_slower_than_1f1b(p, m, f, b, share, data):
    """Same uniform stages, any transfer times per boundary."""
    times = st.lists(st.floats(0.0, 2.0), min_size=p - 1, max_size=p - 1)
    costs = PipelineCosts((f,) * p, (b,) * p, (share * b,) * p, data.draw(times),
                          data.draw(times), (True,) * (p - 1))
    zb = simulate_pipeline(zero_bubble_h1(p, m), costs).makespan_s
    assert zb <= simulate_pipeline(one_f_one_b(p, m), costs).makespan_s + 1e-9


@st.composite
def cases(draw):
    """A schedule by name with random per-stage costs and transfer times."""
    name = draw(st.sampled_from(NAMES))
    p = draw(st.integers(1, 4))
    v = draw(st.integers(1, 3)) if name == "interleaved-1f1b" else 1
    m = draw(st.integers(1, 3)) * p if name == "interleaved-1f1b" else draw(st.integers(1, 8))
    n = p * v
    secs = st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n)
    links = st.lists(st.floats(0.0, 2.0), min_size=n - 1, max_size=n - 1)
    fwd, bwd = draw(secs), draw(secs)
    shares = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    same = draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    costs = PipelineCosts(fwd, bwd, [s * b for s, b in zip(shares, bwd)], draw(links),
                          draw(links), same)
    return build(name, p, m, v), costs


@settings(max_examples=80, deadline=None)
@given(cases())
def test_no_two_spans_overlap_on_a_lane(case):
    schedule, costs = case
    tl = simulate_pipeline(schedule, costs, trace=True)
    lanes: dict[tuple[int, str], list[Span]] = {}
    for span in tl.spans:
        assert span.end_s >= span.start_s
        lanes.setdefault((span.rank, span.lane), []).append(span)
    for spans in lanes.values():
        spans.sort(key=lambda s: (s.start_s, s.end_s))
        for a, b in zip(spans, spans[1:]):
            assert b.start_s >= a.end_s - 1e-12, (a, b)
    compute = [s for s in tl.spans if s.lane == "compute"]
    assert len(compute) == sum(len(acts) for acts in schedule.values())
    assert max(s.end_s for s in compute) == tl.makespan_s


@settings(max_examples=80, deadline=None)
@given(cases(), st.data())
def test_more_bandwidth_never_slower(case, data):
    schedule, costs = case
    n = costs.num_stages - 1
    scale = data.draw(st.lists(st.floats(0.0, 1.0), min_size=2 * n, max_size=2 * n))
    faster = PipelineCosts(costs.forward_s, costs.backward_s, costs.backward_weight_s,
                           [t * k for t, k in zip(costs.activation_s, scale)],
                           [t * k for t, k in zip(costs.gradient_s, scale[n:])], costs.same_node)
    assert (simulate_pipeline(schedule, faster).makespan_s
            <= simulate_pipeline(schedule, costs).makespan_s)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_same_input_same_output(case):
    schedule, costs = case
    first = simulate_pipeline(schedule, costs, trace=True)
    again = simulate_pipeline({r: list(a) for r, a in schedule.items()}, costs, trace=True)
    assert first == again
    assert json.dumps(chrome_trace(first.spans)) == json.dumps(chrome_trace(again.spans))


@settings(max_examples=30, deadline=None)
@given(cases())
def test_busy_time_is_the_sum_of_the_costs(case):
    schedule, costs = case
    tl = simulate_pipeline(schedule, costs)
    per_kind = {"F": costs.forward_s, "B": costs.backward_s, "I": costs.backward_input_s,
                "W": costs.backward_weight_s}
    for r, acts in schedule.items():
        assert tl.busy_s[r] == pytest.approx(sum(per_kind[a.kind.value][a.stage] for a in acts))
        assert tl.makespan_s >= tl.busy_s[r] - 1e-9


def test_transfers_and_exposed_waits_by_hand():
    # 0F0 [0, 1] then its activation [1, 1.5]: rank 1 waits on it from 1 (it was computed) to 1.5;
    # 1F0 [1.5, 2.5], 1B0 [2.5, 4.5], the gradient [4.5, 4.75], and rank 0's 0B0 [4.75, 6.75]
    costs = PipelineCosts((1.0, 1.0), (2.0, 2.0), (1.0, 1.0), (0.5,), (0.25,), (False,))
    tl = simulate_pipeline(one_f_one_b(2, 1), costs, trace=True)
    got = [(s.rank, s.lane, s.name, s.start_s, s.end_s) for s in tl.spans]
    assert got == [
        (0, "compute", "0F0", 0.0, 1.0), (0, "compute", "0B0", 4.75, 6.75),
        (0, "recv", "0RECV_B0", 4.5, 4.75),
        (0, "send", "0SEND_F0", 1.0, 1.5),
        (1, "compute", "1F0", 1.5, 2.5), (1, "compute", "1B0", 2.5, 4.5),
        (1, "recv", "1RECV_F0", 1.0, 1.5),
        (1, "send", "1SEND_B0", 4.5, 4.75),
    ]
    assert tl.makespan_s == 6.75
    assert tl.recv_wait_s == (0.25, 0.5) and tl.send_s == (0.5, 0.25)
    assert {s.cat for s in tl.spans if s.lane != "compute"} == {"pp-inter-node"}


def test_a_ranks_sends_queue_on_its_send_lane():
    # 0F0 ends at 1 and 0F1 at 2, but the first transfer holds the lane until 2.5
    costs = PipelineCosts((1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.5,), (0.0,), (True,))
    tl = simulate_pipeline(gpipe(2, 2), costs, trace=True)
    sends = [(s.name, s.start_s, s.end_s) for s in tl.spans if s.lane == "send"]
    assert sends == [("0SEND_F0", 1.0, 2.5), ("0SEND_F1", 2.5, 4.0)]
    starts = {s.name: s.start_s for s in tl.spans if s.lane == "compute"}
    assert starts["1F1"] == 4.0


def test_blocking_sends_hold_the_compute_lane():
    # DeepSpeed's synchronous send: 0F1 waits for the activation of 0F0 to leave ([1, 2.5]), so it
    # runs [2.5, 3.5] and its own send [3.5, 5]; rank 1's 1F1 starts at 5 (4 when sends are async)
    costs = PipelineCosts((1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.5,), (0.0,), (True,),
                          blocking_sends=True)
    tl = simulate_pipeline(gpipe(2, 2), costs, trace=True)
    sends = [(s.name, s.start_s, s.end_s) for s in tl.spans if s.lane == "send"]
    assert sends == [("0SEND_F0", 1.0, 2.5), ("0SEND_F1", 3.5, 5.0)]
    starts = {s.name: s.start_s for s in tl.spans if s.lane == "compute"}
    assert starts["0F1"] == 2.5 and starts["1F1"] == 5.0
    free = simulate_pipeline(gpipe(2, 2), PipelineCosts((1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.5,),
                                                        (0.0,), (True,)))
    assert tl.makespan_s > free.makespan_s


def test_single_rank_interleaving_has_no_transfers():
    costs = PipelineCosts.uniform(3, 1.0, 2.0, activation_s=9.0)
    tl = simulate_pipeline(interleaved_1f1b(1, 2, 3), costs, trace=True)
    assert tl.makespan_s == 2 * 3 * 3.0
    assert {s.lane for s in tl.spans} == {"compute"}


def test_comm_actions_and_bubbles_are_ignored():
    costs = PipelineCosts.uniform(8, 1.0, 2.0, activation_s=0.3)
    plain = simulate_pipeline(interleaved_1f1b(4, 8, 2), costs)
    lowered = simulate_pipeline(add_comms(interleaved_1f1b(4, 8, 2), 4, 2), costs)
    padded = simulate_pipeline({r: [None, *a] for r, a in interleaved_1f1b(4, 8, 2).items()}, costs)
    assert plain == lowered == padded


def test_peaks_and_last_backwards():
    p, m = 4, 8
    costs = PipelineCosts.uniform(p, 1.0, 2.0)
    one = simulate_pipeline(one_f_one_b(p, m), costs)
    assert one.peak_inflight == (4, 3, 2, 1) and one.peak_inflight_rank == (4, 3, 2, 1)
    # in the cool-down each gradient hop costs one backward: rank r ends r * b before rank 0
    assert one.last_backward_s == tuple(one.makespan_s - r * 2.0 for r in range(p))
    assert simulate_pipeline(gpipe(p, m), costs).peak_inflight == (m,) * p
    zb = simulate_pipeline(zero_bubble_h1(p, m), costs)
    assert zb.peak_inflight == (p,) * p
    assert max(zb.last_backward_s) == zb.makespan_s
    inter = simulate_pipeline(interleaved_1f1b(2, 4, 2), PipelineCosts.uniform(4, 1.0, 2.0))
    assert inter.num_stages == 4 and inter.num_ranks == 2 and inter.num_microbatches == 4


def test_bad_schedules_are_refused():
    costs = PipelineCosts.uniform(2, 1.0, 2.0)
    broken = gpipe(2, 2)
    broken[0][1], broken[0][2] = broken[0][2], broken[0][1]       # deadlocks
    with pytest.raises(PartitaError, match="schedule deadlocks: rank 0, step 1"):
        simulate_pipeline(broken, costs)
    with pytest.raises(PartitaError, match=r"pipeline simulation stalled \(rank 0 waits at 0B0; "
                                           r"rank 1 waits at 1F1\)"):
        simulate_pipeline(broken, costs, check=False)
    with pytest.raises(PartitaError, match="costs describe 3 stages, not a multiple of the "
                                           "schedule's 2 ranks"):
        simulate_pipeline(gpipe(2, 2), PipelineCosts.uniform(3, 1.0, 2.0))
    with pytest.raises(PartitaError, match="schedule has no compute actions"):
        simulate_pipeline({0: [None], 1: []}, costs)
    with pytest.raises(PartitaError, match="action 2F0 is outside the 2 stages"):
        simulate_pipeline({0: [Action.from_str("2F0")], 1: []}, costs, check=False)


@pytest.mark.parametrize("kwargs,message", [
    (dict(forward_s=()), "at least one stage"),
    (dict(backward_s=(1.0,)), r"backward_s has 1 entries, expected 2"),
    (dict(activation_s=(-1.0,)), r"activation_s\[0\] must be finite and >= 0, got -1.0"),
    (dict(gradient_s=(float("nan"),)), r"gradient_s\[0\] must be finite"),
    (dict(backward_weight_s=(3.0, 0.0)), r"stage 0 backward_weight_s \(3.0\) exceeds backward_s"),
    (dict(same_node=()), r"same_node has 0 entries, expected 1"),
])
def test_costs_check_themselves(kwargs, message):
    fields = dict(forward_s=(1.0, 1.0), backward_s=(2.0, 2.0), backward_weight_s=(1.0, 1.0),
                  activation_s=(0.0,), gradient_s=(0.0,), same_node=(True,))
    fields.update(kwargs)
    with pytest.raises(ValueError, match=message):
        PipelineCosts(**fields)


# ---------------------------------------------------------------- Chrome trace

def small_trace():
    costs = PipelineCosts.uniform(2, 1e-3, 2e-3, activation_s=5e-4)
    return simulate_pipeline(one_f_one_b(2, 2), costs, trace=True).spans


def test_chrome_trace_shape():
    doc = chrome_trace(small_trace(), metadata={"scenario": "toy"})
    assert doc["otherData"] == {"scenario": "toy"}
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert (0, 0, "compute") in threads and (0, 1, "send") in threads and (1, 2, "recv") in threads
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    first = xs[0]
    assert (first["name"], first["pid"], first["tid"], first["cat"]) == ("0F0", 0, 0, "forward")
    assert first["ts"] == 0.0 and first["dur"] == pytest.approx(1000.0)    # microseconds
    assert xs == sorted(xs, key=lambda e: (e["pid"], e["tid"], e["ts"], e["dur"], e["name"]))


def test_trace_file_round_trips(tmp_path):
    spans = small_trace()
    write_trace(spans, tmp_path / "t.json", metadata={"step_time_s": 1.0})
    back = read_trace(tmp_path / "t.json")
    key = lambda s: (s.rank, s.lane, s.start_s)  # noqa: E731
    assert len(back) == len(spans)
    for a, b in zip(sorted(spans, key=key), sorted(back, key=key)):
        assert (a.rank, a.lane, a.name, a.cat) == (b.rank, b.lane, b.name, b.cat)
        assert (b.start_s, b.end_s) == pytest.approx((a.start_s, a.end_s), abs=1e-12)


def test_unknown_lanes_sort_after_known_ones():
    spans = [Span(0, "zeta", "x", 0.0, 1.0), Span(0, "compute", "0F0", 0.0, 1.0),
             Span(0, "alpha", "y", 0.0, 1.0)]
    meta = [e for e in chrome_trace(spans)["traceEvents"] if e["name"] == "thread_name"]
    assert [(e["tid"], e["args"]["name"]) for e in meta] == [(0, "compute"), (1, "alpha"), (2, "zeta")]


def test_trace_errors(tmp_path):
    with pytest.raises(PartitaError, match="cannot write trace"):
        write_trace(small_trace(), tmp_path / "missing" / "t.json")
    with pytest.raises(PartitaError, match="no such file"):
        read_trace(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PartitaError, match="bad.json: invalid JSON at line 1"):
        read_trace(tmp_path / "bad.json")
    with pytest.raises(PartitaError, match="not a Chrome trace"):
        spans_from_trace({"events": []})
    with pytest.raises(PartitaError, match="event '0F0' on pid 0, tid 3 has no thread_name"):
        spans_from_trace({"traceEvents": [{"ph": "X", "name": "0F0", "pid": 0, "tid": 3,
                                           "ts": 0, "dur": 1}]})
    lane = {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}}
    with pytest.raises(PartitaError, match="event '0F0' needs numeric ts and dur"):
        spans_from_trace({"traceEvents": [lane, {"ph": "X", "name": "0F0", "pid": 0, "tid": 0}]})


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("zero-bubble", 1),
                                    ("interleaved-1f1b", 2)])
def test_compiled_schedule_times_like_the_action_lists(name, v):
    """The compiled form (shared by every simulation of one schedule) changes no number."""
    p, m = 3, 6
    n = p * v
    costs = PipelineCosts((1.0, 1.5, 0.5, 2.0, 1.0, 0.75)[:n], (2.0, 3.0, 1.0, 4.5, 2.0, 1.5)[:n],
                          (1.0, 1.0, 0.5, 2.0, 0.5, 0.5)[:n], (0.25,) * (n - 1), (0.5,) * (n - 1),
                          (False,) * (n - 1))
    schedule = build(name, p, m, v)
    compiled = compile_schedule(schedule, p * v)
    assert simulate_pipeline(compiled, costs, trace=True) == simulate_pipeline(schedule, costs,
                                                                               trace=True)
    assert compiled.peak_inflight_rank == tuple(peak_inflight_by_rank(schedule).values())
    with pytest.raises(PartitaError, match="costs describe 2 stages, the compiled schedule"):
        simulate_pipeline(compiled, PipelineCosts.uniform(2, 1.0, 2.0))

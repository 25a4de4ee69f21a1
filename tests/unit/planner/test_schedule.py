"""The schedule IR: action text, the four generators (checked against torch's own), lowering to
sends and receives, validation messages, activation liveness and CSV io."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.planner.errors import PartitaError
from partita.planner.scenario import SCHEDULES
from partita.planner.schedule import (NAMES, Action, ComputationType, add_comms, build, compute_only,
                              format_csv, from_csv, gpipe, interleaved_1f1b, one_f_one_b,
                              parse_csv, peak_inflight, peak_inflight_by_rank, to_csv, validate,
                              zero_bubble_h1)

F, B, I, W = "F", "B", "I", "W"


def text(schedule):
    return {r: ["" if a is None else str(a) for a in acts] for r, acts in schedule.items()}


# ---------------------------------------------------------------- actions

def test_action_text_is_torchs():
    assert str(Action(2, ComputationType.FORWARD, 0)) == "2F0"
    assert str(Action(1, ComputationType.SEND_B, 3)) == "1SEND_B3"
    assert str(Action(0, ComputationType.REDUCE_GRAD)) == "0REDUCE_GRAD"
    assert repr([Action(2, ComputationType.BACKWARD_WEIGHT, 11)]) == "[2W11]"


@given(st.integers(0, 300), st.sampled_from(list(ComputationType)), st.integers(0, 5000))
def test_action_round_trips(stage, kind, mb):
    action = Action(stage, kind, mb)
    assert Action.from_str(str(action)) == action


@pytest.mark.parametrize("bad", ["F0", "2X0", "2F-1", "two", "2SEND0", "2F0x"])
def test_action_from_bad_text_names_it(bad):
    with pytest.raises(PartitaError, match=f"invalid action '{bad}'.*e.g. 2F0"):
        Action.from_str(bad)


def test_empty_cell_is_a_bubble():
    assert Action.from_str("  ") is None


# ---------------------------------------------------------------- generators, by hand

def test_one_f_one_b_by_hand():
    sched = text(one_f_one_b(4, 8))
    assert sched[0][:6] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4"]
    assert sched[3][:4] == ["3F0", "3B0", "3F1", "3B1"]
    assert sched[1][-3:] == ["1B5", "1B6", "1B7"]


def test_zero_bubble_h1_by_hand():
    # rank r runs p-1-r warm-up forwards, then F/I pairs, with its W's r micro-batches late
    sched = text(zero_bubble_h1(4, 8))
    assert sched[0][:9] == ["0F0", "0F1", "0F2", "0F3", "0I0", "0W0", "0F4", "0I1", "0W1"]
    assert sched[3][:9] == ["3F0", "3I0", "3F1", "3I1", "3F2", "3I2", "3F3", "3I3", "3W0"]
    assert sched[3][-4:] == ["3W4", "3W5", "3W6", "3W7"]


def test_gpipe_by_hand():
    assert text(gpipe(2, 2)) == {0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]}


def test_interleaved_places_chunks_in_a_loop():
    sched = interleaved_1f1b(4, 8, 2)
    assert {a.stage for a in sched[1]} == {1, 5}
    assert text(sched)[3][:6] == ["3F0", "3F1", "3F2", "3F3", "7F0", "7B0"]


def test_one_f_one_b_is_zero_bubble_without_w():
    """1F1B's order of forwards and backwards is ZB-H1's with I renamed B (same p-1-r warm-up)."""
    for p, m in [(4, 8), (3, 2), (5, 11)]:
        zb = {r: [str(a).replace("I", "B") for a in acts if a.kind != ComputationType.BACKWARD_WEIGHT]
              for r, acts in zero_bubble_h1(p, m).items()}
        assert zb == text(one_f_one_b(p, m))


# ---------------------------------------------------------------- generators against torch

@pytest.fixture(scope="module")
def torch_orders():
    """Per-rank compute order of torch's own schedule classes, built on mock stages."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules as ts
    from torch.distributed.pipelining.stage import _PipelineStageBase

    class MockStage(_PipelineStageBase):     # like torch's test/distributed/pipelining mocks
        def __init__(self, stage_index, num_stages, group_size, group_rank):
            self.stage_index, self.num_stages = stage_index, num_stages
            self.group_size, self.group_rank = group_size, group_rank
            self.submod = torch.nn.Identity()
            self.stage_index_to_group_rank = {}

        # never called when only the order is built; abstract in the base class
        def _create_grad_recv_info(self, *args, **kwargs):
            raise NotImplementedError

        _prepare_forward_infra = _prepare_backward_infra = _create_grad_recv_info

    def orders(cls, p, m, v=1):
        out = {}
        for r in range(p):
            stages = [MockStage(r + k * p, p * v, p, r) for k in range(v)]
            if cls in (ts.ScheduleGPipe, ts.Schedule1F1B):
                order = cls(stages[0], m, loss_fn=lambda a, b: a)._get_pipeline_order()
            else:
                order = cls(stages, m, loss_fn=lambda a, b: a).pipeline_order
            out[r] = [str(a) for a in order[r] if a is not None and a.is_compute_op]
        return out
    return ts, orders


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 3), (4, 12, 2), (3, 6, 3),
                                   (8, 16, 2), (1, 4, 3), (4, 8, 1)])
def test_interleaved_matches_torch(torch_orders, p, m, v):
    ts, orders = torch_orders
    assert text(interleaved_1f1b(p, m, v)) == orders(ts.ScheduleInterleaved1F1B, p, m, v)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4), (3, 9), (8, 16), (4, 2), (1, 3)])
def test_zero_bubble_h1_matches_torch(torch_orders, p, m):
    ts, orders = torch_orders
    assert text(zero_bubble_h1(p, m)) == orders(ts.ScheduleInterleavedZeroBubble, p, m)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2), (1, 3)])
def test_gpipe_matches_torch(torch_orders, p, m):
    ts, orders = torch_orders
    assert text(gpipe(p, m)) == orders(ts.ScheduleGPipe, p, m)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (5, 7)])
def test_one_f_one_b_matches_torch(torch_orders, p, m):
    """Torch's Schedule1F1B order (its runtime loop runs 1F1B directly; `_get_pipeline_order` is
    the IR it shows). In torch 2.13 that IR numbers the last rank's forwards from 1 ("3F1" first,
    "3F8" last for m = 8); the last rank is covered instead by ZB-H1 against torch together with
    test_one_f_one_b_is_zero_bubble_without_w."""
    ts, orders = torch_orders
    theirs = orders(ts.Schedule1F1B, p, m)
    ours = text(one_f_one_b(p, m))
    assert all(ours[r] == theirs[r] for r in range(p - 1))


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 3, 4, 1), ("1f1b", 4, 8, 1),
                                        ("interleaved-1f1b", 4, 8, 2), ("zero-bubble", 4, 8, 1),
                                        ("interleaved-1f1b", 1, 2, 3)])
def test_add_comms_matches_torch_lowering(name, p, m, v):
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule
    sched = build(name, p, m, v)
    theirs = {r: [_Action.from_str(str(a)) for a in acts] for r, acts in sched.items()}
    _validate_schedule(theirs, p, p * v, m)                    # torch accepts ours as is
    lowered = _add_send_recv(theirs, stage_to_rank=lambda s: s % p, num_stages=p * v)
    assert text(add_comms(sched, p, v)) == {r: [str(a) for a in acts] for r, acts in lowered.items()}


# ---------------------------------------------------------------- build

def test_build_knows_the_scenario_names():
    assert set(NAMES) == set(SCHEDULES)
    for name in NAMES:
        validate(build(name, 4, 8, 2 if name == "interleaved-1f1b" else 1), 4, 8,
                 2 if name == "interleaved-1f1b" else 1)


def test_build_unknown_name_lists_valid():
    with pytest.raises(PartitaError, match=r"unknown pipeline schedule '1f1f'; did you mean "
                                           r"'1f1b'.*valid: 1f1b, gpipe, interleaved-1f1b, zero-bubble"):
        build("1f1f", 4, 8)


def test_build_virtual_stages_need_interleaving():
    with pytest.raises(PartitaError, match=r"virtual_stages \(2\) > 1 needs schedule interleaved-1f1b"):
        build("1f1b", 4, 8, 2)


def test_interleaved_needs_whole_rounds():
    with pytest.raises(PartitaError, match=r"micro-batches \(6\) to be a multiple of the pipeline "
                                           r"size \(4\)"):
        build("interleaved-1f1b", 4, 6, 2)


@pytest.mark.parametrize("p,m", [(0, 4), (4, 0), (4, 2.5), (True, 3)])
def test_build_rejects_bad_sizes(p, m):
    with pytest.raises(PartitaError, match="must be a positive integer"):
        build("gpipe", p, m)


def test_fewer_microbatches_than_ranks_still_valid():
    for name in ("gpipe", "1f1b", "zero-bubble"):
        validate(build(name, 6, 2), 6, 2)


# ---------------------------------------------------------------- validate

def swapped(schedule, rank, i, j):
    out = {r: list(acts) for r, acts in schedule.items()}
    out[rank][i], out[rank][j] = out[rank][j], out[rank][i]
    return out


def test_validate_names_rank_step_and_shows_the_list():
    sched = one_f_one_b(4, 8)
    sched[1] = [Action.from_str(t) for t in "1F0 1F1 1B0 1B2 1F2 1B1".split()] + sched[1][6:]
    with pytest.raises(PartitaError, match=r"^rank 1, step 3: 1B2 before 1F2; rank 1 runs "
                                           r"1F0,1F1,1B0,\[1B2\],1F2,1B1,"):
        validate(sched, 4, 8)


def test_validate_reports_deadlock_with_both_sides():
    # rank 0 waits for 1B0 before sending 0F1; rank 1 needs 0F1 before it runs 1B0
    sched = swapped(gpipe(2, 2), 0, 1, 2)
    with pytest.raises(PartitaError, match=r"schedule deadlocks: rank 0, step 1: 0B0 waits for "
                                           r"1B0 \(rank 1, step 2\); rank 1, step 1: 1F1 waits "
                                           r"for 0F1 \(rank 0, step 2\); rank 0 runs "
                                           r"0F0,\[0B0\],0F1,0B1"):
        validate(sched, 2, 2)


@pytest.mark.parametrize("edit,message", [
    (lambda s: s[0].append(Action(0, ComputationType.FORWARD, 1)),
     r"rank 0, step 8: 0F1 appears twice"),
    (lambda s: s[1].remove(Action(1, ComputationType.FULL_BACKWARD, 2)),
     r"stage 1, micro-batch 2: no backward \(1B2, or 1I2 and 1W2\) on rank 1"),
    (lambda s: s[1].remove(Action(1, ComputationType.FORWARD, 3)), r"rank 1, step \d+: 1B3 before 1F3"),
    (lambda s: s[0].insert(0, Action(1, ComputationType.FORWARD, 0)),
     r"rank 0, step 0: 1F0: stage 1 runs on rank 1 \(stage % 2\), not rank 0"),
    (lambda s: s[0].insert(0, Action(4, ComputationType.FORWARD, 0)),
     r"rank 0, step 0: 4F0: stage 4 out of range \(the schedule has 2 stages\)"),
    (lambda s: s[0].insert(0, Action(0, ComputationType.FORWARD, 9)),
     r"rank 0, step 0: 0F9: micro-batch 9 out of range 0..3"),
    (lambda s: s.pop(1), r"schedule has ranks \[0\], expected 0..1 \(pipeline size 2\)"),
    (lambda s: s[0].insert(0, "0F0"), r"rank 0, step 0: '0F0' is not an Action"),
])
def test_validate_errors(edit, message):
    sched = gpipe(2, 4)
    edit(sched)
    with pytest.raises(PartitaError, match=message):
        validate(sched, 2, 4)


def test_validate_split_backward_rules():
    sched = zero_bubble_h1(2, 2)
    i0 = sched[0].index(Action(0, ComputationType.BACKWARD_INPUT, 0))
    w0 = sched[0].index(Action(0, ComputationType.BACKWARD_WEIGHT, 0))
    with pytest.raises(PartitaError, match=r"rank 0, step \d: 0W0 before 0I0"):
        validate(swapped(sched, 0, i0, w0), 2, 2)
    mixed = {r: list(a) for r, a in sched.items()}
    mixed[0].insert(w0, Action(0, ComputationType.FULL_BACKWARD, 0))
    with pytest.raises(PartitaError, match=r"0B0 after 0I0 \(a backward is either B or I then W\)"):
        validate(mixed, 2, 2)
    no_w = {r: list(a) for r, a in sched.items()}
    no_w[0].remove(Action(0, ComputationType.BACKWARD_WEIGHT, 1))
    with pytest.raises(PartitaError, match=r"stage 0, micro-batch 1: no 0W1 after 0I1 on rank 0"):
        validate(no_w, 2, 2)


def test_validate_skips_comms_and_bubbles():
    lowered = add_comms(one_f_one_b(3, 4), 3)
    assert any(not a.is_compute for a in lowered[0])
    validate(lowered, 3, 4)
    validate({r: [None] + acts for r, acts in one_f_one_b(3, 4).items()}, 3, 4)


def progresses(schedule, p, m, v):
    """Independent oracle: torch's round-based dry run, one ready action per rank per round."""
    lists = {r: [a for a in acts if a is not None] for r, acts in schedule.items()}
    done, pos, stages = set(), dict.fromkeys(lists, 0), p * v
    while any(pos[r] < len(lists[r]) for r in lists):
        moved = False
        for r in lists:
            if pos[r] == len(lists[r]):
                continue
            s, kind, mb = lists[r][pos[r]]
            if kind == F and s > 0:
                ok = (s - 1, F, mb) in done
            elif kind in (B, I) and s < stages - 1:
                ok = (s + 1, B, mb) in done or (s + 1, I, mb) in done
            else:
                ok = True
            if ok:
                done.add((s, kind.value, mb))
                pos[r] += 1
                moved = True
        if not moved:
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(NAMES), st.integers(1, 4), st.integers(1, 3), st.integers(1, 2),
       st.data())
def test_swaps_are_caught_exactly_when_they_break(name, p, k, v, data):
    v = v if name == "interleaved-1f1b" else 1
    m = k * p if name == "interleaved-1f1b" else k + 1
    sched = build(name, p, m, v)
    r = data.draw(st.integers(0, p - 1))
    i = data.draw(st.integers(0, len(sched[r]) - 1))
    j = data.draw(st.integers(0, len(sched[r]) - 1))
    broken = swapped(sched, r, i, j)
    order_ok = all(_per_rank_order_ok(acts) for acts in broken.values())
    try:
        validate(broken, p, m, v)
        assert order_ok and progresses(broken, p, m, v)
    except PartitaError as exc:
        assert not (order_ok and progresses(broken, p, m, v))
        assert str(exc).startswith(("rank ", "schedule deadlocks: rank "))


def _per_rank_order_ok(actions):
    seen = set()
    for a in actions:
        if a.kind in (ComputationType.FULL_BACKWARD, ComputationType.BACKWARD_INPUT):
            if (a.stage, F, a.microbatch) not in seen:
                return False
        if a.kind == ComputationType.BACKWARD_WEIGHT and (a.stage, I, a.microbatch) not in seen:
            return False
        seen.add((a.stage, a.kind.value, a.microbatch))
    return True


# ---------------------------------------------------------------- liveness

def test_peak_inflight_per_schedule():
    p, m = 4, 8
    assert peak_inflight(gpipe(p, m)) == dict.fromkeys(range(p), m)
    assert peak_inflight(one_f_one_b(p, m)) == {r: p - r for r in range(p)}
    zb = peak_inflight(zero_bubble_h1(p, m))
    assert max(zb.values()) == max(peak_inflight(one_f_one_b(p, m)).values()) == p


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 3), (2, 8, 4)])
def test_peak_inflight_interleaved_is_warmup_plus_one(p, m, v):
    expected = {r: min(2 * (p - 1 - r) + (v - 1) * p + 1, m * v) for r in range(p)}
    assert peak_inflight_by_rank(interleaved_1f1b(p, m, v)) == expected


# ---------------------------------------------------------------- CSV

def test_csv_is_torchs_text():
    sched = {0: [Action.from_str("0F0"), None, Action.from_str("0B0")],
             1: [None, Action.from_str("1F0")]}
    assert format_csv(sched) == "0F0,,0B0\n,1F0\n"


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)])
def test_csv_round_trips(tmp_path, name, v):
    sched = build(name, 4, 8, v)
    lowered = add_comms(sched, 4, v)
    to_csv(lowered, tmp_path / "s.csv")
    back = from_csv(tmp_path / "s.csv")
    assert back == lowered
    assert compute_only(back) == sched


def test_csv_reads_torch_dump(tmp_path):
    pytest.importorskip("torch")
    import csv
    from torch.distributed.pipelining.schedules import _Action
    path = tmp_path / "torch.csv"
    with open(path, "w", newline="") as f:                     # as torch's _dump_csv writes it
        writer = csv.writer(f)
        for r, acts in one_f_one_b(3, 3).items():
            writer.writerow([None] * r + [_Action.from_str(str(a)) for a in acts])
    back = from_csv(path)
    validate(back, 3, 3)
    assert compute_only({r: [a for a in acts if a] for r, acts in back.items()}) == one_f_one_b(3, 3)


def test_csv_errors_name_row_and_column(tmp_path):
    with pytest.raises(PartitaError, match=r"s.csv: row 2 \(rank 1\), column 3: invalid action '1Q0'"):
        parse_csv("0F0,0B0\n1F0,,1Q0\n", "s.csv")
    with pytest.raises(PartitaError, match="empty schedule"):
        parse_csv("", "s.csv")
    with pytest.raises(PartitaError, match="nope.csv: no such file"):
        from_csv(tmp_path / "nope.csv")
    with pytest.raises(PartitaError, match="is a directory"):
        from_csv(tmp_path)
    with pytest.raises(PartitaError, match="cannot write schedule"):
        to_csv(gpipe(1, 1), tmp_path / "missing" / "s.csv")


def test_generators_are_deterministic():
    for name, (p, m) in itertools.product(NAMES, [(4, 8), (3, 6)]):
        v = 2 if name == "interleaved-1f1b" else 1
        assert build(name, p, m, v) == build(name, p, m, v)

"""The event core: short stories in SimPy's style, each appending to `log`."""
from __future__ import annotations

import math

import pytest

from partita.simulator.events import NORMAL, URGENT, EventLoop


@pytest.fixture
def loop():
    return EventLoop()


@pytest.fixture
def log():
    return []


def test_events_run_in_time_order(loop, log):
    loop.schedule(2.0, log.append, "b")
    loop.schedule(1.0, log.append, "a")
    loop.schedule(3.0, log.append, "c")
    assert loop.run() == 3.0
    assert log == ["a", "b", "c"]


def test_ties_go_by_priority_then_insertion(loop, log):
    loop.schedule(1.0, log.append, "normal-1")
    loop.schedule(1.0, log.append, "urgent", priority=URGENT)
    loop.schedule(1.0, log.append, "normal-2", priority=NORMAL)
    loop.run()
    assert log == ["urgent", "normal-1", "normal-2"]


def test_callbacks_schedule_more_events(loop, log):
    def tick(n):
        log.append((loop.now, n))
        if n < 3:
            loop.schedule(0.5, tick, n + 1)
    loop.schedule(0.0, tick, 0)
    loop.run()
    assert log == [(0.0, 0), (0.5, 1), (1.0, 2), (1.5, 3)]


def test_zero_delay_runs_after_what_is_already_due(loop, log):
    loop.schedule(1.0, lambda: (log.append("first"), loop.schedule(0.0, log.append, "third")))
    loop.schedule(1.0, log.append, "second")
    loop.run()
    assert log == ["first", "second", "third"]


def test_at_is_exact(loop, log):
    loop.schedule(0.1, lambda: loop.at(0.3, log.append, loop.now))
    loop.run()
    assert log == [0.1] and loop.now == 0.3          # 0.1 + (0.3 - 0.1) would be 0.30000000000000004


def test_run_until_stops_before_and_resumes(loop, log):
    for t in (1.0, 2.0, 3.0):
        loop.schedule(t, log.append, t)
    assert loop.run(until=2.0) == 2.0
    assert log == [1.0]                               # an event at `until` waits, as in SimPy
    assert len(loop) == 2 and loop.peek() == 2.0
    loop.run()
    assert log == [1.0, 2.0, 3.0]
    assert loop.peek() == math.inf


def test_negative_delay_names_the_value(loop):
    with pytest.raises(ValueError, match="negative delay -1.5"):
        loop.schedule(-1.5, print)


@pytest.mark.parametrize("delay", [math.nan, math.inf])
def test_non_finite_delay_is_refused(loop, delay):
    with pytest.raises(ValueError, match=f"delay must be finite, got {delay}"):
        loop.schedule(delay, print)


def test_past_times_are_refused(loop):
    loop.run(until=5.0)
    with pytest.raises(ValueError, match=r"until \(4.0\) must not be before the current time \(5.0\)"):
        loop.run(until=4.0)
    with pytest.raises(ValueError, match=r"time \(4.0\) must be finite and not before the current "
                                         r"time \(5.0\)"):
        loop.at(4.0, print)


def test_same_input_same_run():
    def story():
        loop, out = EventLoop(), []
        for i in range(50):
            loop.schedule((i * 7) % 5 * 0.25, out.append, i, priority=i % 2)
        loop.run()
        return out
    assert story() == story()

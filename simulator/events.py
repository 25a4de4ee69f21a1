"""A tiny deterministic discrete-event core: a heap of (time, priority, seq, callback, args).

Like SimPy's `Environment.schedule` (src/simpy/core.py), ties go by time, then priority (lower
first), then insertion order, so the same input always gives the same run. Time is in seconds and
moves only when an event is taken off the heap. Callbacks are plain functions; they may schedule
more events.

    loop = EventLoop()
    loop.schedule(2.0, log.append, "b")
    loop.schedule(1.0, log.append, "a")
    loop.run()              # log == ["a", "b"], loop.now == 2.0
"""
from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count
from typing import Any

URGENT = 0
NORMAL = 1
_INF = math.inf


class EventLoop:
    """The event heap and the clock (`now`, seconds)."""

    __slots__ = ("now", "_queue", "_seq")

    def __init__(self, start: float = 0.0):
        self.now = start
        self._queue: list[tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = count()

    def schedule(self, delay: float, fn: Callable[..., Any], *args: Any,
                 priority: int = NORMAL) -> None:
        """Call `fn(*args)` `delay` seconds from now."""
        if not 0 <= delay < _INF:
            raise ValueError(f"negative delay {delay}" if delay < 0
                             else f"delay must be finite, got {delay}")
        heappush(self._queue, (self.now + delay, priority, next(self._seq), fn, args))

    def at(self, time: float, fn: Callable[..., Any], *args: Any, priority: int = NORMAL) -> None:
        """Call `fn(*args)` at absolute `time` (exact: no now + (time - now) rounding)."""
        if not self.now <= time < _INF:
            raise ValueError(f"time ({time}) must be finite and not before the current time "
                             f"({self.now})")
        heappush(self._queue, (time, priority, next(self._seq), fn, args))

    def peek(self) -> float:
        """The time of the next event, or infinity when there is none."""
        return self._queue[0][0] if self._queue else math.inf

    def __len__(self) -> int:
        return len(self._queue)

    def run(self, until: float | None = None) -> float:
        """Process events in order; with `until`, only those before it, and stop with now = until.

        As in SimPy, an event at exactly `until` is left for a later `run`. Returns `now`.
        """
        if until is not None and not until >= self.now:
            raise ValueError(f"until ({until}) must not be before the current time ({self.now})")
        queue = self._queue
        if until is None:
            while queue:
                time, _, _, fn, args = heappop(queue)
                self.now = time
                fn(*args)
            return self.now
        while queue and queue[0][0] < until:
            time, _, _, fn, args = heappop(queue)
            self.now = time
            fn(*args)
        self.now = until
        return until

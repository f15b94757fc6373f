"""The replay's simpy environment: simpy's own, plus waiting without an event.

A process waits in simpy by yielding an event; the environment resumes it
when that event comes off the queue, after every event ordered before it
(by time, then priority, then event id).  :class:`Clock` lets the one caller
that drives a replay (the compute stream) wait the same way without the
event: it runs, with simpy's own ``step``, the events that would have run
before it was resumed, then goes on.  Same floats, same order of every
event, without the waiting event's make, push, pop and resume.

Imported only by a replay with copies (a copy-free plan runs without simpy).
"""

from __future__ import annotations

from typing import Callable

import simpy
from simpy.events import NORMAL, Event, Timeout


class Clock(simpy.Environment):
    """A :class:`simpy.Environment` with waits that are not events (:meth:`hold`,
    :meth:`settle`) and callbacks on fresh events (:meth:`call_soon`,
    :meth:`call_after`).

    Who waits with :meth:`hold` or :meth:`settle` must not itself be a callback
    that an event run inside the wait could call again, and must be the last
    callback of the event it runs in (nothing else of that event left to run).
    The replay's compute stream is the only caller: it runs in the one callback
    of its start event and waits on nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0   # event ids taken by waits that were not events

    @property
    def scheduled(self) -> int:
        """How many events were scheduled so far (ids given, less those taken)."""
        given = next(self._eid)   # reading takes an id too: counted as taken
        self.taken += 1
        return given - (self.taken - 1)

    def next_id(self) -> int:
        """The id the next scheduled event would get (taken: ids only order events,
        so one taken and never used changes no order)."""
        self.taken += 1
        return next(self._eid)

    def settle(self, t: float, eid: int) -> None:
        """Run every event ordered before an event of id ``eid`` at time ``t``: those
        earlier, and those at ``t`` scheduled before it (events that run here and
        schedule more are followed the same way)."""
        q = self._queue
        step = self.step
        while q:
            at, priority, other, _ = q[0]
            if at < t or (at == t and (priority, other) < (NORMAL, eid)):
                step()
            else:
                break

    def hold(self, delay: float) -> float:
        """``yield self.timeout(delay)`` without the timeout: run the events it would
        let run first, then move the clock to ``now + delay`` (simpy's float, returned)."""
        t = self._now + delay
        eid = next(self._eid)
        self.taken += 1
        q = self._queue    # settle(t, eid), inline: a call less per compute step
        while q:
            at, priority, other, _ = q[0]
            if at < t or (at == t and (priority, other) < (NORMAL, eid)):
                self.step()
            else:
                break
        self._now = t
        return t

    def call_soon(self, callback: Callable[[Event], None]) -> None:
        """``callback(event)`` when a new event, scheduled now, comes off the queue."""
        ev = Event(self)
        ev.callbacks.append(callback)
        ev.succeed()

    def call_after(self, delay: float, callback: Callable[[Event], None]) -> None:
        """``callback(event)`` when a new timeout of ``delay`` comes off the queue."""
        Timeout(self, delay).callbacks.append(callback)

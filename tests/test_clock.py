"""``Clock.hold`` and ``Clock.settle`` run events in simpy's own order.

The replay's compute stream waits without events (``snsim.sim.clock``); these
check the two waits against the generator processes they stand for, on
random scenarios with many ties (equal times, zero delays), by the exact log
of who ran when.
"""

from __future__ import annotations

import pytest

simpy = pytest.importorskip("simpy")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from snsim.sim.clock import Clock  # noqa: E402

DELAYS = st.sampled_from([0.0, 0.5, 1.0, 1.0, 1.5, 2.0])
WORKERS = st.lists(st.lists(DELAYS, max_size=6), min_size=1, max_size=3)


def _workers(env, log, plans, signal=None):
    """Background processes: each waits its delays in turn and logs each end;
    worker 0 calls ``signal(n)`` at its n-th end (what a copy's end is)."""
    def worker(w, delays):
        for n, d in enumerate(delays):
            yield env.timeout(d)
            log.append((f"w{w}", n, env.now))
            if w == 0 and signal is not None:
                signal(n)

    for w, delays in enumerate(plans):
        env.process(worker(w, delays))


def _run(env, log, inline: bool, by_wait, by_events) -> list:
    """Run the stream inline (``by_wait`` called at once, waiting without events)
    or as a generator process (``by_events``); the log and the end time."""
    if inline:
        env.call_soon(by_wait)
    else:
        env.process(by_events())
    env.run()
    return log + [("end", env.now)]


@settings(max_examples=300, deadline=None)
@given(plans=WORKERS, mine=st.lists(DELAYS, max_size=8))
def test_hold_runs_what_a_timeout_would(plans, mine):
    def run(inline: bool) -> list:
        env, log = Clock(), []
        _workers(env, log, plans)

        def by_timeouts():
            for n, d in enumerate(mine):
                yield env.timeout(d)
                log.append(("me", n, env.now))

        def by_hold(_event):
            for n, d in enumerate(mine):
                env.hold(d)
                log.append(("me", n, env.now))

        return _run(env, log, inline, by_hold, by_timeouts)

    assert run(True) == run(False)


@settings(max_examples=300, deadline=None)
@given(plans=WORKERS, mine=st.lists(st.tuples(st.booleans(), DELAYS), max_size=8))
def test_settle_resumes_where_the_signal_event_would(plans, mine):
    """Waiting for worker 0's next end: by yielding an event it triggers then
    (unless triggered already), or by stepping until it took an id and settling
    before that id (``Replay._await``)."""
    ends = len(plans[0])

    def run(inline: bool) -> list:
        env, log = Clock(), []
        events = [env.event() for _ in range(ends)]
        ready: dict[int, int] = {}

        def signal(n):
            if inline:
                ready[n] = env.next_id()
            else:
                events[n].succeed()

        _workers(env, log, plans, signal)

        def by_events():
            k = 0
            for n, (wait, d) in enumerate(mine):
                if wait and k < ends:
                    if not events[k].triggered:
                        yield events[k]
                    k += 1
                else:
                    yield env.timeout(d)
                log.append(("me", n, env.now))

        def by_settle(_event):
            k = 0
            for n, (wait, d) in enumerate(mine):
                if wait and k < ends:
                    if k not in ready:
                        while k not in ready:
                            env.step()
                        env.settle(env.now, ready[k])
                    k += 1
                else:
                    env.hold(d)
                log.append(("me", n, env.now))

        return _run(env, log, inline, by_settle, by_events)

    assert run(True) == run(False)


def test_a_wait_with_ties_runs_the_earlier_scheduled_first():
    """Hand-checked: a worker's timeout ending at 1.0, scheduled before the
    stream's hold to 1.0, runs first; one scheduled after runs after."""
    env, log = Clock(), []
    _workers(env, log, [[1.0]])

    def stream(_event):
        env.hold(1.0)
        log.append(("me", 0, env.now))

    env.call_soon(stream)
    env.run()
    assert log == [("w0", 0, 1.0), ("me", 0, 1.0)]
    assert env.scheduled == 4    # the worker's start, timeout and end; the stream's start

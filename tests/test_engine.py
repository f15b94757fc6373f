"""The simulator's event log, copy engines, budget waits and infeasibility."""

from __future__ import annotations

import pytest

from snsim.errors import ScheduleError
from snsim.graph import G, Graph, X
from snsim.schedule import verify
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait
from snsim.sim import simulate


def swap_schedule():
    """chain4 with X0 offloaded after F1 and brought back for B1."""
    return Schedule("hand", [
        Compute("F", 0), Compute("F", 1), Offload(X(0)), Free(X(0)),
        Compute("F", 2), Free(X(1)), Compute("F", 3), Free(X(3)),
        Compute("B", 3), Free(G(3)), Compute("B", 2), Free(X(2)), Free(G(2)),
        Prefetch(X(0)), Wait(X(0)), Compute("B", 1), Free(X(0)), Free(G(1)),
    ])


def test_exact_event_log(chain4):
    g = Graph(chain4)
    s = swap_schedule()
    verify(g, s)
    r = simulate(g, s)
    log = [(iv.stream, iv.name, iv.start_ms, iv.end_ms) for iv in r.intervals]
    assert log == [
        ("compute", "F0", 0.0, 0.0),
        ("compute", "F1", 0.0, 2.0),
        ("compute", "F2", 2.0, 3.0),
        ("d2h", "X0", 2.0, 3.0),        # 100 B at 1e5 B/s
        ("compute", "F3", 3.0, 3.5),
        ("compute", "B3", 3.5, 4.0),
        ("compute", "B2", 4.0, 5.0),
        ("h2d", "X0", 5.0, 6.0),
        ("compute", "stall", 5.0, 6.0),
        ("compute", "B1", 6.0, 10.0),
    ]
    assert r.iteration_ms == 10.0 and r.stall_ms == 1.0
    assert r.h2d_bytes == r.d2h_bytes == 100
    # X0 leaves the device when its copy ends (t=3), not when Free is issued
    assert [(p.time_ms, p.what) for p in r.timeline if p.what == "free X0"][0] == (3.0, "free X0")
    # peak: B2 with X2, G2, G1 + static; X0 is on the host then
    assert r.peak_bytes == 20 + 600


def test_allocation_waits_for_free_under_way_then_runs_out(chain4):
    g = Graph(chain4)
    r = simulate(g, swap_schedule(), budget_bytes=450)
    # F2 needs 200 B at t=2 with 320 in use: it waits for X0's copy to end (t=3)
    assert r.stall_ms == 1.0
    # B2 needs 200 B more with 420 in use and nothing under way: infeasible
    assert not r.feasible
    assert "B2" in r.reason and "170 bytes short" in r.reason
    assert r.samples_per_s == 0.0


def test_liveness_infeasible_names_step(chain4):
    from snsim.policies import plan
    from snsim.policies.base import PlanContext
    g = Graph(chain4)
    r = simulate(g, plan("liveness", PlanContext(g, 700)), 700)
    assert not r.feasible and "step B2" in r.reason and "20 bytes short" in r.reason


def test_deterministic(chain4):
    g = Graph(chain4)
    a, b = simulate(g, swap_schedule()), simulate(g, swap_schedule())
    assert a.to_dict() == b.to_dict() and a.intervals == b.intervals


def test_record_false_gives_same_numbers(chain4):
    g = Graph(chain4)
    a, b = simulate(g, swap_schedule()), simulate(g, swap_schedule(), record=False)
    assert a.to_dict() == b.to_dict() and b.timeline[1:] == () and b.intervals == ()


def _bad(ops):
    return Schedule("bad", ops)


F = [Compute("F", i) for i in range(4)]


@pytest.mark.parametrize("ops, message", [
    (F[:3], "ends before route step F3"),
    ([F[0], F[2]], "route step out of order: expected F1"),
    (F + [Compute("B", 2)], "expected B3"),
    ([F[0], Free(X(0)), F[1]], "uses X0 after it was freed at op 1"),
    ([F[0], Free(X(0)), Free(X(0))], "frees X0, which it does not hold (freed at op 1)"),
    ([Free(X(2))], "frees X2, which it does not hold"),
    ([F[0], Prefetch(X(0))], "prefetches X0, which has no host copy"),
    ([F[0], Offload(X(0)), Prefetch(X(0))], "already on the device"),
    ([F[0], Offload(X(0)), Free(X(0)), Prefetch(X(0)), F[1]], "prefetched but not waited"),
    ([F[0], Wait(X(0))], "waits for X0, which has no copy in flight"),
    ([F[0], F[1], Compute("R", 1)], "allocates X1, which is already resident"),
    ([F[0], Compute("F", 1, algo=2)], "no workspace algorithm 2"),
    ([Offload(X(1))], "offloads X1, which is not resident"),
])
def test_verifier_rejects(chain4, ops, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verify(Graph(chain4), _bad(ops))


def test_verifier_accepts_recompute(chain4):
    g = Graph(chain4)
    ops = [Compute("F", 0), Compute("F", 1), Compute("F", 2), Free(X(1)), Compute("F", 3),
           Free(X(3)), Compute("B", 3), Free(G(3)), Compute("B", 2), Free(X(2)), Free(G(2)),
           Compute("B", 1)]
    verify(g, _bad(ops))
    # a recompute of X1 after it was freed is fine and costs its forward time
    ops2 = ops[:4] + [Compute("R", 1), Free(X(1))] + ops[4:]
    verify(g, _bad(ops2))
    r = simulate(g, _bad(ops2))
    assert r.recompute_ms == 2.0 and r.iteration_ms == 11.0 and r.compute_ms == 9.0


@pytest.mark.parametrize("policy", ["liveness", "recompute-memory", "sqrt-n", "dtr"])
@pytest.mark.parametrize("factor", [1.0, 1.2, 3.0])
def test_sequential_replay_equals_the_simpy_run(policy, factor):
    """A schedule without copies replays in one pass without simpy
    (``Replay._sequential``); the simpy run of the same schedule gives the same
    floats, peak, reason, timeline and intervals, feasible or not."""
    from snsim import policies, synth
    from snsim.policies.base import PlanContext
    from snsim.sim.engine import Replay

    g = Graph(synth.resnet((2, 2, 3, 2), batch=4, image=64))
    budget = int(factor * g.lower_bound_bytes)
    s = policies.plan(policy, PlanContext(g, budget))
    verify(g, s)
    fast = Replay(g, s, budget, record=True)
    assert not fast.copies
    fast.run()
    slow = Replay(g, s, budget, record=True)
    slow.env.run()    # the three simpy processes, as for a schedule with copies
    assert (fast.end_ms, fast.peak, fast.level, fast.reason, fast.recompute_ms,
            fast.forward_end_ms, fast.stall_ms) == (
        slow.env.now, slow.peak, slow.level, slow.reason, slow.recompute_ms,
        slow.forward_end_ms, slow.stall_ms)
    assert fast.timeline == slow.timeline
    assert fast.intervals == slow.intervals
    if factor == 1.0 and policy == "liveness":
        assert fast.reason is not None   # the infeasible path is exercised too


@pytest.mark.parametrize("copies", [True, False])
def test_replay_is_freed_without_the_cyclic_collector(chain4, copies):
    """After ``run()`` no reference cycle holds a replay (and with it the schedule
    and its effects): the simulator runs with the cyclic collector paused."""
    import gc
    import weakref

    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.sim.engine import Replay

    g = Graph(chain4)
    s = swap_schedule() if copies else policies.plan("liveness", PlanContext(g))
    verify(g, s)
    was = gc.isenabled()
    gc.disable()
    try:
        run = Replay(g, s, 10**9, record=True)
        assert run.copies == copies
        run.run()
        ref = weakref.ref(run)
        del run
        assert ref() is None
    finally:
        if was:
            gc.enable()

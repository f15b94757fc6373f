"""Gradient swaps in the class of policy ``optimal`` (issue 15, ninth pass).

A residual block's input gradient is made by the add's backward and read
again only by the branch's first layer's backward: it may leave the device
while the branch's backward runs.  Without that the class has no plan at
the lower bound of ``grad_residual``; with it the MILP's plan is priced at
the simulator's time and peak, runs at the time of the best plan of a
brute force over keep / recompute / swap of every activation and keep /
swap of that gradient, and the stage windows still bound it.
"""

from __future__ import annotations

import itertools
import math

import pytest

from conftest import L, make
from snsim.graph import Graph
from snsim.policies import plan, replay
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait
from snsim.sim import simulate

highspy = pytest.importorskip("highspy")

from snsim.policies.optimal import formulation  # noqa: E402
from snsim.policies.optimal.decode import decode  # noqa: E402
from snsim.policies.optimal.formulation import build, gradient_swaps  # noqa: E402
from snsim.policies.optimal.solve import solve  # noqa: E402
from snsim.policies.optimal.start import plan_start  # noqa: E402
from test_optimal import (  # noqa: E402
    brute_schedules, fastest, milp_plan_checked, run_optimal)
from test_optimal_suffix import check_splits  # noqa: E402

G1 = ("G", 1)


def grad_residual():
    """data X0 100 -> conv X1 300 -> conv X2 400 -> conv X3 400 -> add(X1, X3) -> loss.
    B4 (the add) makes G1 (300); B3 makes G2 reading G3 and X2 (1200 with
    them) while G1 waits for B2, which adds into it."""
    return make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 300, params=1, fwd=1.0, bwd=1.0, reads=["inputs"]),
        L(2, "conv", [1], 400, params=1, fwd=1.0, bwd=1.0, reads=["inputs"]),
        L(3, "conv", [2], 400, params=1, fwd=1.0, bwd=1.0, reads=["inputs"]),
        L(4, "add", [1, 3], 100, fwd=0.1, bwd=0.1),
        L(5, "loss", [4], 4, fwd=0.1, bwd=0.1, reads=["inputs"]),
    ], "grad_residual")


def with_gradient_swaps(g, ops, stage_of):
    """``ops`` (a plan that keeps every gradient) with each gradient t in
    ``stage_of`` offloaded after the step making it, waited for and freed
    right after, prefetched at the start of stage ``stage_of[t]`` and waited
    for at the start of the stage of the next step that reads it (before its
    recomputations, as the class waits)."""
    route = g.route
    out = list(ops)
    for t, k in stage_of.items():
        made = next(i for i, s in enumerate(route) if t in g.allocs(s))
        use = next(i for i in range(k, len(route)) if t in g.needs(route[i]))
        at = out.index(Compute(*route[made]))
        out[at + 1:at + 1] = [Offload(t), Wait(t), Free(t)]
        at = out.index(Compute(*route[k - 1])) + 1
        while type(out[at]) in (Free, Offload, Wait):   # stage k-1's end
            at += 1
        out.insert(at, Prefetch(t))
        at = out.index(Compute(*route[use - 1])) + 1
        while type(out[at]) in (Free, Offload, Wait, Prefetch):   # stage use's start
            at += 1
        out.insert(at, Wait(t))
    return out


def brute_best(g, budget):
    """The fastest feasible plan of the brute force of ``test_optimal`` (keep,
    recompute or swap each activation) with each gradient that some step
    between its birth and its next read leaves alone either kept or swapped
    (prefetched at any stage up to that read)."""
    route = g.route
    gaps = {}
    for t in {t for s in route for t in g.allocs(s) if t[0] == "G"}:
        made = next(i for i, s in enumerate(route) if t in g.allocs(s))
        use = next((i for i in range(made + 1, len(route)) if t in g.needs(route[i])), None)
        if use is not None and use > made + 1:
            gaps[t] = range(made + 1, use + 1)
    names = sorted(gaps)
    return fastest(g, budget, (
        with_gradient_swaps(g, ops, {t: k for t, k in zip(names, choice) if k is not None})
        for ops in brute_schedules(g)
        for choice in itertools.product(*[[None, *gaps[t]] for t in names])))


def test_the_block_inputs_gradient_is_the_one_the_class_may_swap():
    g = Graph(grad_residual())
    # made in stage 7 (B4), read by B2 (stage 9, which adds into it) and B1
    assert gradient_swaps(g) == {G1: (7, [9, 10], 9)}
    f = build(g, g.lower_bound_bytes)
    assert f.grads == {G1} and f.birth[G1] == 7 and G1 in f.O
    # prefetched in the gap (B3's stage) or at B2's start, never after B2's write
    assert sorted(k for k, t in f.P if t == G1) == [8, 9]
    assert all(f.P_wait[k, G1] == 9 for k, t in f.P if t == G1)


def test_gradient_swaps_make_the_lower_bound_reachable_and_are_priced_exactly(monkeypatch):
    g = Graph(grad_residual())
    lb = g.lower_bound_bytes
    assert lb == 1206
    for budget in (lb, int(lb * 1.1), int(lb * 1.2)):
        with monkeypatch.context() as mp:
            mp.setattr(formulation, "gradient_swaps", lambda graph: {})
            assert solve(build(g, budget).milp, 20).status == "infeasible"
        _, sol, ops, _ = milp_plan_checked(g, budget)   # time and peak as simulated
        b4, b2 = ops.index(Compute("B", 4)), ops.index(Compute("B", 2))
        assert ops.index(Offload(G1)) == b4 + 1
        assert b4 < ops.index(Wait(G1)) < ops.index(Free(G1)) < ops.index(Prefetch(G1)) < b2
        want = brute_best(g, budget)
        assert math.isfinite(want)
        assert sol.objective == pytest.approx(want, abs=1e-9)   # 14.4, 13.4, 13.4 ms
        _, got = run_optimal(g, budget)
        assert got.feasible and got.iteration_ms <= want + 1e-9


def test_a_heuristic_plan_that_swaps_the_gradient_starts_the_solver():
    """superneurons swaps G1 at the lower bound (it frees it while its copy
    runs, where the class waits for the copy first): its plan is read as the
    class's binaries, which satisfy every row, and the class's plan for them
    runs at the time and peak the model predicts."""
    g = Graph(grad_residual())
    budget = g.lower_bound_bytes
    s = plan("superneurons", PlanContext(g, budget))
    assert Offload(G1) in s.ops and Prefetch(G1) in s.ops
    f = build(g, budget)
    start = plan_start(f, s.ops)
    assert start is not None
    m = f.milp
    fixed = dict(zip(*start))
    for c, integer in enumerate(m.integer):
        if integer:
            m.lb[c] = m.ub[c] = fixed.get(c, 0.0)
    sol = solve(m, 20)
    assert sol.status == "optimal"
    ops, peak = decode(f, sol.values)
    r = simulate(g, Schedule("milp", ops, budget), budget, record=False)
    assert r.feasible and r.iteration_ms == pytest.approx(sol.objective, abs=1e-9)
    assert r.peak_bytes == peak <= budget
    # the class's wait for the copy costs what superneurons' early free saves
    assert sol.objective + g.optimizer_ms >= replay.estimate_ms(g, s.ops, budget) - 1e-9


def test_stage_windows_bound_the_class_with_gradient_swaps():
    g = Graph(grad_residual())
    lb = g.lower_bound_bytes
    for budget in (lb, int(lb * 1.1)):
        check_splits(g, budget)

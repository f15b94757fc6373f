"""The moment bound (``snsim.policies.optimal.bound``): a lower bound on every
schedule's time, checked against brute-forced optima of tiny traces, against
every heuristic's simulated plans on random DAGs and the shipped traces'
families, and hand-worked where it is tight."""

from __future__ import annotations

import math

import pytest

from snsim import synth
from snsim.graph import Graph
from snsim.policies import get, names, plan
from snsim.policies.base import PlanContext
from snsim.sim import simulate

highspy = pytest.importorskip("highspy")

from snsim.policies.optimal.bound import moment_bound  # noqa: E402
from test_optimal import SLOW, brute_best, chain4, chain5, residual, run_optimal  # noqa: E402

EPS = 1e-6


def budgets(g, parts=(0, 1, 2, 3)):
    lb = g.lower_bound_bytes
    top = simulate(g, plan("none", PlanContext(g)), record=False).peak_bytes
    return sorted({lb + (top - lb) * p // 4 for p in parts})


def test_chain4_moment_bound_is_the_hand_worked_optimum():
    """At 620 (the lower bound) X0 cannot stay through B2 and cannot be
    recomputed: at B2's start it is on the host, and its 1 ms copy back starts
    after B2 and ends before B1: 9 ms of compute + 1 ms, the optimum (10 ms).
    Without the host-to-device row the bound would be the compute bound (9)."""
    g = Graph(chain4())
    st = {}
    assert moment_bound(g, 620, stats=st) == pytest.approx(10.0, abs=1e-9)
    assert st["moment_step"].startswith("B2")
    assert moment_bound(g, 720) == pytest.approx(9.0, abs=1e-9)   # liveness fits


@pytest.mark.parametrize("trace, device", [(chain4, None), (chain5, None), (chain5, SLOW),
                                           (residual, None), (residual, SLOW)])
def test_moment_bound_never_exceeds_the_brute_forced_optimum(trace, device):
    from dataclasses import replace

    g = Graph(trace() if device is None else replace(trace(), device=device))
    above_compute = sum(b > g.compute_ms + EPS for b in below_brute_force(g, moment_bound))
    if device is SLOW:
        assert above_compute   # on a slow link the bound says more than compute


def below_brute_force(g, bound) -> list[float]:
    """``bound(g, budget)`` at each of :func:`budgets`, each checked to be at most
    the best schedule known (the brute force's, or optimal's plan if faster),
    and so is the policy's own ``schedule_bound_ms``."""
    out = []
    for budget in budgets(g):
        b = bound(g, budget)
        best = brute_best(g, budget)
        s, r = run_optimal(g, budget)
        if r.feasible:
            best = min(best, r.iteration_ms)
        assert math.isfinite(best), budget
        assert b <= best + EPS, (budget, b, best)
        assert s.stats["schedule_bound_ms"] <= best + EPS
        out.append(b)
    return out


def test_moment_bound_below_every_heuristic_on_random_dags():
    """Every registered policy's feasible plan is a schedule, so its simulated
    time is at least the bound (random DAGs, four budgets each, with a slow
    link on half of them so that copies cost)."""
    checked = above = 0
    for seed, g in random_graphs():
        for budget in budgets(g):
            b = moment_bound(g, budget)
            above += b > g.compute_ms + EPS
            checked += below_every_policy(g, budget, b, seed)
    assert checked > 200 and above > 10   # the sweep has teeth


def random_graphs(n: int = 30):
    """(seed, graph) of ``n`` random DAGs, a slow link on the odd seeds (copies cost)."""
    from dataclasses import replace

    for seed in range(n):
        t = synth.random_dag(seed, 6 + seed % 10)
        yield seed, Graph(replace(t, device=SLOW) if seed % 2 else t)


def below_every_policy(g, budget, b, seed) -> int:
    """How many registered policies have a feasible plan at ``budget``; each
    one's simulated time is checked to be at least the bound ``b``."""
    checked = 0
    for p in names():
        if get(p).needs - {"backward"} or (get(p).needs and not any(
                s[0] == "B" for s in g.route)):
            continue
        r = simulate(g, plan(p, PlanContext(g, budget)), budget, record=False)
        if r.feasible:
            checked += 1
            assert b <= r.iteration_ms + EPS, (seed, budget, p, b, r.iteration_ms)
    return checked


@pytest.mark.parametrize("name", ["k40c_alexnet_b128", "k40c_vgg16_b32"])
def test_moment_bound_below_heuristics_on_shipped_traces(name):
    from pathlib import Path

    from snsim.trace.io import load

    g = Graph(load(str(Path(__file__).resolve().parent.parent / "traces" / f"{name}.json")))
    for f in (1.05, 1.25, 2.0):
        budget = int(f * g.lower_bound_bytes)
        b = moment_bound(g, budget, seconds=5.0)
        for p in ("superneurons", "utp", "liveness", "dtr", "cost-aware"):
            r = simulate(g, plan(p, PlanContext(g, budget)), budget, record=False)
            if r.feasible:
                assert b <= r.iteration_ms + EPS, (f, p)


def head():
    """VGG-16's head in miniature: data X0 10 -> conv X1 300 (reads inputs,
    10 ms) -> act X2 300 (reads output, 0.5 ms) -> conv X3 300 (reads inputs)
    -> loss.  X1 has no backward reader; X2 is read by B3 and B2."""
    from conftest import L, make

    return make([
        L(0, "data", [], 10),
        L(1, "conv", [0], 300, params=10, fwd=10.0, bwd=10.0, reads=["inputs"]),
        L(2, "act", [1], 300, fwd=0.5, bwd=0.5, reads=["output"]),
        L(3, "conv", [2], 300, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(4, "loss", [3], 4, fwd=0.25, bwd=0.25, reads=["inputs"]),
    ], "head")


def test_a_tensor_only_a_recomputation_reads_is_back_before_that_recomputation():
    """head() at its lower bound 940: at B4's start (11.75 ms of forward) X2
    does not fit beside the step.  Remade from X1 (0.5 ms), X1 must be on the
    device when the remake runs, before B3: kept (no room either), remade (10
    ms) or copied back.  Copied back, it was offloaded after F1 (10 -> 13 ms,
    so B4 starts at 13 at the earliest), and its copy back (3 ms) starts
    after B4 (0.25) and ends before B3, after which 12.5 ms of compute
    remain: 13 + 0.25 + 3 + 12.5 = 28.75.  The bound used to let X1's copy
    back end any time before the iteration's end (26.25: it saw 1.75 of the
    4.85 ms the optimum pays); the brute force's best is 29.6, the MILP's
    29.35."""
    g = Graph(head())
    assert g.lower_bound_bytes == 940 and g.compute_ms == pytest.approx(24.5)
    st = {}
    b = moment_bound(g, 940, stats=st)
    assert b == pytest.approx(28.75, abs=1e-6)
    assert st["moment_step"].startswith("B4")
    assert b <= brute_best(g, 940) + EPS
    s, r = run_optimal(g, 940)
    assert r.feasible and b <= r.iteration_ms + EPS
    # the policy's bound is the larger of the moment's and the window's (the
    # whole route: 28.85, with X1's copy back and its offload on one timeline)
    assert s.stats["window_bound_ms"] == pytest.approx(28.85, abs=1e-6)
    assert s.stats["schedule_bound_ms"] == pytest.approx(28.85, abs=1e-6)

"""The window bound (``snsim.policies.optimal.window``): a lower bound on every
schedule's time over consecutive route steps, checked against brute-forced
optima of tiny traces, against every heuristic's simulated plans on random
DAGs and on the shipped ResNet-50, and hand-worked where it is tight."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from snsim.graph import Graph
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.sim import simulate

highspy = pytest.importorskip("highspy")

from snsim.policies.optimal.bound import moment_bound  # noqa: E402
from snsim.policies.optimal.window import window_bound  # noqa: E402
from test_optimal import SLOW, brute_best, chain4, chain5, residual, run_optimal  # noqa: E402
from test_optimal_bound import (below_brute_force, below_every_policy, budgets,  # noqa: E402
                                head, random_graphs)

EPS = 1e-6


def test_chain4_window_bound_is_the_hand_worked_optimum():
    """chain4 at 620 (its lower bound): X0 cannot stay through B2 and cannot
    be recomputed, so it is copied back (1 ms) after B2 starts and before B1:
    9 ms of compute + 1 ms, the optimum; at 720 liveness fits (9 ms)."""
    g = Graph(chain4())
    st = {}
    assert window_bound(g, 620, stats=st) == pytest.approx(10.0, abs=1e-6)
    assert st["window_steps"] == len(g.route)
    assert window_bound(g, 720) == pytest.approx(9.0, abs=1e-6)


@pytest.mark.parametrize("trace, device", [(chain4, None), (chain5, None), (chain5, SLOW),
                                           (residual, None), (residual, SLOW), (head, None),
                                           (head, SLOW)])
def test_window_bound_never_exceeds_the_brute_forced_optimum(trace, device):
    g = Graph(trace() if device is None else replace(trace(), device=device))
    below_brute_force(g, window_bound)


def test_window_bound_below_every_heuristic_on_random_dags():
    """Every registered policy's feasible plan is a schedule, so its simulated
    time is at least the bound (random DAGs, four budgets each, a slow link
    on half of them); and the window says more than the moment somewhere."""
    checked = above = 0
    for seed, g in random_graphs():
        for budget in budgets(g):
            b = window_bound(g, budget)
            above += b > moment_bound(g, budget) + 1e-3
            checked += below_every_policy(g, budget, b, seed)
    assert checked > 200 and above > 5   # the sweep has teeth


def test_window_bound_below_heuristics_on_resnet50_and_above_the_moment():
    """ResNet-50 b32 at 1.05x the lower bound: every heuristic that fits is
    slower than the bound; the last 20 steps (stage 1's backward) say more
    than the best single moment."""
    from pathlib import Path

    from snsim.trace.io import load

    g = Graph(load(str(Path(__file__).resolve().parent.parent / "traces"
                       / "k40c_resnet50_b32.json")))
    budget = int(1.05 * g.lower_bound_bytes)
    b = window_bound(g, budget, seconds=8.0, tails=(20,))   # 387.3 ms in 5 s alone (moment: 383.9)
    assert b > moment_bound(g, budget, seconds=3.0, exact=1) + 1.0
    for p in ("superneurons", "utp", "cost-aware"):
        r = simulate(g, plan(p, PlanContext(g, budget)), budget, record=False)
        if r.feasible:
            assert b <= r.iteration_ms + EPS, p


def test_a_step_that_does_not_fit_alone_is_infinite():
    g = Graph(chain4())
    assert window_bound(g, 600) == math.inf


def test_window_reaches_the_brute_forced_optimum_where_one_moment_does_not():
    """chain5 at its lower bound (340): the best single moment sees 8.5 ms,
    the brute force's best schedule takes 9.5; the whole route as one window
    links the moments (what one step keeps, the next has or must bring back
    or remake) and proves 9.5: that schedule is optimal.  On the slow link
    the window proves 19.75 where the moment proves 14 (the best found: 25.5)."""
    g = Graph(chain5())
    assert moment_bound(g, 340) == pytest.approx(8.5, abs=1e-6)
    assert window_bound(g, 340) == pytest.approx(9.5, abs=1e-6)
    assert brute_best(g, 340) == pytest.approx(9.5, abs=1e-6)
    g = Graph(chain5(SLOW))
    assert moment_bound(g, 340) == pytest.approx(14.0, abs=1e-6)
    assert window_bound(g, 340) == pytest.approx(19.75, abs=1e-6)


def test_a_shorter_tail_is_tried_and_the_time_is_kept():
    """Each tail is a model of its own: the last 2 steps of chain5 on the
    slow link say less than the whole route; the stats name the window that
    said most and the time spent stays within the seconds given."""
    g = Graph(chain5(SLOW))
    st = {}
    b = window_bound(g, 340, seconds=5.0, stats=st, tails=(2, 100))
    assert b == pytest.approx(19.75, abs=1e-6)
    assert st["window_steps"] == len(g.route) and st["window_s"] < 5.5
    assert window_bound(g, 340, tails=(2,)) < b


def test_time_the_milp_leaves_goes_to_the_longer_window(monkeypatch):
    """When the MILP ends early and the plan is still above the bound, the
    time left before the deadline is given to the longest tail again (a
    longer search proves more there); its bound is kept only if larger."""
    import snsim.policies.optimal as opt

    calls = []
    real = opt.window_bound

    def spy(g, cap, seconds, stats=None, tails=opt.TAILS):
        calls.append((round(seconds, 1), tails))
        return real(g, cap, seconds, stats, tails)

    monkeypatch.setattr(opt, "window_bound", spy)
    monkeypatch.setattr(opt, "LEFTOVER_MIN_S", 1.0)
    monkeypatch.setattr(opt, "LEFTOVER_GAP", -1.0)   # even at the bound
    g = Graph(chain5(SLOW))
    s, r = run_optimal(g, 340, seconds=8)
    assert len(calls) == 2 and calls[1][1] == (max(opt.TAILS),) and calls[1][0] >= 1.0
    assert s.stats["window_bound_ms"] == pytest.approx(19.75, abs=1e-6)
    assert s.stats["schedule_bound_ms"] <= r.iteration_ms + EPS
    assert s.stats["solve_s"] <= 8.0 + 0.5
    monkeypatch.setattr(opt, "LEFTOVER_GAP", 0.01)
    calls.clear()
    s, r = run_optimal(g, 340, seconds=8)
    # the bound every schedule obeys decides, not the class's: a cutoff proves
    # nothing about schedules outside the class
    gap_left = r.iteration_ms > s.stats["schedule_bound_ms"] * 1.01
    assert len(calls) == (2 if gap_left else 1)

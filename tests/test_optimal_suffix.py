"""The class's suffix bound (``snsim.policies.optimal.suffix``): the MILP's
rows of its last stages alone are a relaxation of the class, so their
optimum is never above the class optimum (tiny traces and random DAGs,
every suffix length), equals it for the whole route, and is infeasible
when capped below it; ``capped`` uses it for models too large to solve."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from snsim.graph import Graph
from snsim.policies.base import PlanContext

highspy = pytest.importorskip("highspy")

from snsim.policies import optimal  # noqa: E402
from snsim.policies.optimal import capped, heuristic_plans  # noqa: E402
from snsim.policies.optimal.formulation import build  # noqa: E402
from snsim.policies.optimal.solve import solve  # noqa: E402
from snsim.policies.optimal.suffix import (  # noqa: E402
    split_bound, stages, suffix_bound, suffix_milp)
from test_optimal import SLOW, chain4, chain5, residual  # noqa: E402
from test_optimal_bound import random_graphs  # noqa: E402

EPS = 1e-6


def class_optimum(g, budget, cutoff=None):
    sol = solve(build(g, budget, cutoff=cutoff).milp, 20)
    return sol.objective if sol.status == "optimal" else math.inf


def check_suffixes(g, budget) -> int:
    """Every suffix of the class model is at most its optimum, the whole route's
    equal to it; a suffix infeasible only where the class is empty.  How many
    suffixes were strictly below the optimum (the sweep's teeth)."""
    opt = class_optimum(g, budget)
    f = build(g, budget)
    K = len(g.route)
    of = stages(f)
    below = 0
    for first in range(K + 1):
        sol = solve(suffix_milp(f, first, of), 20)
        if sol.status == "infeasible":
            assert math.isinf(opt), (budget, first)
            continue
        assert sol.status == "optimal", (budget, first, sol.status)
        assert sol.objective <= opt + EPS, (budget, first, sol.objective, opt)
        if first == 0:
            assert sol.objective == pytest.approx(opt, abs=EPS)
        below += sol.objective < opt - 1e-3
    return below


@pytest.mark.parametrize("trace, device", [(chain4, None), (chain5, None), (chain5, SLOW),
                                           (residual, None)])
def test_every_suffix_bounds_the_class_optimum(trace, device):
    g = Graph(trace() if device is None else trace(device))
    lb = g.lower_bound_bytes
    for budget in (lb, int(lb * 1.1), int(lb * 1.3)):
        check_suffixes(g, budget)


def test_suffixes_bound_the_class_on_random_dags():
    below = 0
    for seed, g in random_graphs(12):
        lb = g.lower_bound_bytes
        for budget in (lb, int(lb * 1.2)):
            below += check_suffixes(g, budget)
    assert below > 20   # short suffixes do leave time out: the check has teeth


@pytest.mark.parametrize("trace, device", [(chain5, SLOW), (residual, None)])
def test_capped_below_the_optimum_every_full_suffix_is_infeasible(trace, device):
    """Capped below the class optimum the whole-route suffix has no solution
    (``suffix_bound`` says so: inf, True); capped at it, the bound is the
    optimum and nothing is infeasible."""
    g = Graph(trace() if device is None else trace(device))
    budget = int(g.lower_bound_bytes * 1.1)
    opt = class_optimum(g, budget)
    assert suffix_bound(build(g, budget, cutoff=opt - 1e-3), 20.0) == (math.inf, True)
    st: dict = {}
    b, none = suffix_bound(build(g, budget, cutoff=opt + 1e-6), 20.0, st)
    assert not none and b == pytest.approx(opt, abs=EPS)
    assert st["suffix_steps"] == len(g.route) and st["suffix_s"] >= 0


def test_an_lp_suffix_bounds_by_its_optimum():
    """The LP relaxation alone (no MILP after it) gives its optimum as the bound:
    above 0, at most the class optimum; chain5 on the slow link at 1.1x, where
    the capped LP says 10.86 ms against the optimum's 14.75 (test_optimal)."""
    g = Graph(chain5(SLOW))
    budget = int(g.lower_bound_bytes * 1.1)
    opt = class_optimum(g, budget)
    K = len(g.route)
    b, none = suffix_bound(build(g, budget, cutoff=opt + 1e-6), 20.0, tries=((K, True),))
    assert not none and 0 < b <= opt + EPS
    assert b == pytest.approx(10.86 - g.optimizer_ms, abs=1e-6)


def test_capped_bounds_a_large_model_by_its_suffixes(monkeypatch):
    """With every model counted large, ``capped`` answers from the suffixes:
    chain5 on the slow link at 440 (optimum 9 ms, test_optimal): told a plan
    runs at 8.9 ms no suffix reaches it and the class has plans (status
    ``cutoff``, the bound the cutoff); told 9.5 ms, the bound is the class
    optimum (status ``split-bound``, no plan of its own); below the lower
    bound the class is empty (``infeasible``, bound 0)."""
    monkeypatch.setattr(optimal, "SUFFIX_NONZEROS", 0)
    g = Graph(chain5(SLOW))
    plans = heuristic_plans(PlanContext(g, 440))
    sol, _ = capped(g, 440, None, 20.0, plans, {}, 8.9)
    assert sol.status == "cutoff" and sol.values is None
    assert sol.bound == pytest.approx(8.9 - g.optimizer_ms, abs=1e-9)
    st: dict = {}
    sol, _ = capped(g, 440, None, 20.0, plans, st, 9.5)
    assert sol.status == "split-bound" and sol.values is None
    assert sol.bound + g.optimizer_ms == pytest.approx(9.0, abs=1e-6)
    assert st["suffix_steps"] == len(g.route)
    sol, _ = capped(g, g.lower_bound_bytes - 1, None, 20.0, [], {}, 100.0)
    assert sol.status == "infeasible" and sol.bound == 0.0


def test_resnet50_suffix_proves_the_cutoff_where_the_full_model_is_unsolved():
    """K40c ResNet-50 b32 at 1.5x its lower bound: the capped model (1M
    nonzeros) has no LP solution in minutes, its last 80 stages none at all
    below 1.0509 x compute (superneurons' polished plan): no plan of the
    class is that fast.  The last 40 stages alone do not prove it, nor the
    LP relaxation of the last 80 since the class swaps gradients (a block
    input's gradient may leave the device while its branch's backward runs):
    their MILP does, in about 10 s."""
    from snsim.trace.io import load

    g = Graph(load("traces/k40c_resnet50_b32.json"))
    cap = int(g.lower_bound_bytes * 1.5)
    f = build(g, cap, cutoff=1.0509 * g.compute_ms - g.optimizer_ms)
    K = len(g.route)
    of = stages(f)
    sol = solve(suffix_milp(f, K - 40, of).relaxed(), 60)
    assert sol.status == "optimal" and sol.objective < 1.0509 * g.compute_ms
    assert solve(suffix_milp(f, K - 80, of), 120).status == "infeasible"


def check_splits(g, budget) -> int:
    """The stage windows' sum (``split_bound``) at every span is at most the
    class optimum, uncapped and capped at it, equal to it with one window
    over the whole route; how
    often it is above the last window alone (the suffix of the same span):
    the windows before the last said something."""
    opt = class_optimum(g, budget)
    f = build(g, budget)
    K = len(g.route)
    of = stages(f)
    above = 0
    for span in range(1, K + 1):
        st: dict = {}
        b, none = split_bound(f, 60.0, st, span=span)
        if none:
            assert math.isinf(opt), (budget, span)
            continue
        assert b <= opt + EPS, (budget, span, b, opt)
        assert st["suffix_steps"] == K
        if span == K:
            assert b == pytest.approx(opt, abs=EPS)
        last = solve(suffix_milp(f, K - span, of), 20)
        above += last.status == "optimal" and b > last.objective + 1e-3
        # capped at the optimum, no span may call the class empty (the sum's
        # test against the cap included; a relative margin too: HiGHS's
        # presolve called a model capped at 11920.087 + 1e-6 infeasible, at
        # + 1e-7 and + 1e-5 not, random DAG 9)
        b, none = split_bound(build(g, budget, cutoff=opt * (1 + 1e-9) + 1e-6), 60.0, span=span)
        assert not none and b <= opt + EPS, (budget, span, b, opt)
    return above


@pytest.mark.parametrize("trace, device", [(chain5, None), (chain5, SLOW), (residual, None)])
def test_stage_windows_add_up_to_a_bound_on_the_class(trace, device):
    g = Graph(trace() if device is None else trace(device))
    lb = g.lower_bound_bytes
    for budget in (lb, int(lb * 1.1)):
        check_splits(g, budget)


def test_stage_windows_bound_the_class_on_random_dags():
    above = 0
    for seed, g in random_graphs(12):
        lb = g.lower_bound_bytes
        for budget in (lb, int(lb * 1.2)):
            above += check_splits(g, budget)
    assert above > 5   # the earlier windows add time the last one leaves out


def test_stage_windows_capped_below_the_optimum_prove_it():
    """One window over the whole route is the capped model itself: below the
    optimum it has no solution; at it, the bound is the optimum."""
    g = Graph(chain5(SLOW))
    budget = int(g.lower_bound_bytes * 1.1)
    opt = class_optimum(g, budget)
    K = len(g.route)
    assert split_bound(build(g, budget, cutoff=opt - 1e-3), 20.0, span=K) == (math.inf, True)
    st: dict = {}
    b, none = split_bound(build(g, budget, cutoff=opt + 1e-6), 20.0, st, span=K)
    assert not none and b == pytest.approx(opt, abs=EPS)
    assert st["suffix_windows"] and st["suffix_windows"][0][:2] == [0, K]


def test_a_tightened_limit_turns_the_sum_into_a_proof():
    """chain5 on the slow link at 1.1x, capped at the optimum plus 1 ms: the
    one window's bound is the optimum; told meanwhile that a plan runs 1 ms
    under the optimum (``limit``), the same sum proves no plan of the class
    is that fast."""
    g = Graph(chain5(SLOW))
    budget = int(g.lower_bound_bytes * 1.1)
    opt = class_optimum(g, budget)
    K = len(g.route)
    f = build(g, budget, cutoff=opt + 1.0)
    b, none = split_bound(f, 20.0, span=K, limit=lambda: opt + 0.5)
    assert not none and b == pytest.approx(opt, abs=EPS)
    assert split_bound(f, 20.0, span=K, limit=lambda: opt - 1.0) == (math.inf, True)

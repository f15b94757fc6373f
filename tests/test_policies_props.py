"""Property tests: every policy on random DAGs (issue 4).

1000 random traces (``synth.random_dag``), each planned by every registered
policy at one drawn budget between the lower bound and the ``none`` peak.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snsim import synth
from snsim.graph import Graph
from snsim.errors import PolicyError
from snsim.policies import get, names, plan, replay
from snsim.policies.base import trace_features
from snsim.policies.base import PlanContext
from snsim.schedule import verify
from snsim.sim import simulate

RECOMPUTE = ("recompute-speed", "recompute-memory", "cost-aware", "sqrt-n")
DYNAMIC = ("utp", "superneurons", "dtr")


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 24), frac=st.floats(0.0, 1.0))
def test_every_policy_on_random_dags(seed, n, frac):
    g = Graph(synth.random_dag(seed, n))
    lb = g.lower_bound_bytes
    live = simulate(g, plan("liveness", PlanContext(g)), record=False)
    top = simulate(g, plan("none", PlanContext(g)), record=False).peak_bytes
    budget = lb + int(frac * (top - lb))
    have = trace_features(g)
    for p in names():
        if get(p).needs - have:   # e.g. a DAG where no layer requires grad
            with pytest.raises(PolicyError, match=f"policy {p} needs"):
                plan(p, PlanContext(g, budget))
            continue
        s = plan(p, PlanContext(g, budget))
        verify(g, s)
        r = simulate(g, s, budget, record=False)
        again = simulate(g, plan(p, PlanContext(g, budget)), budget, record=False)
        assert (again.iteration_ms, again.peak_bytes, again.feasible) == \
            (r.iteration_ms, r.peak_bytes, r.feasible), p
        if r.feasible:
            assert lb <= r.peak_bytes, p   # (<= budget is what feasible means)
            assert r.iteration_ms >= r.compute_ms - 1e-9, p
            assert r.iteration_ms >= min(g.compute_ms, r.compute_ms) - 1e-9, p
        if p in DYNAMIC and s.infeasible_reason is None:
            assert r.feasible, (p, r.reason)   # the planner's budget check is exact
        if p in RECOMPUTE:
            free = simulate(g, s, None, record=False)
            assert free.peak_bytes <= live.peak_bytes, p
            assert math.isclose(free.recompute_ms, s.stats["recompute_planned_ms"],
                                abs_tol=1e-6), p
        if p == "superneurons" and budget >= live.peak_bytes:
            assert r.feasible and r.iteration_ms == r.compute_ms
            assert r.recompute_ms == 0 and r.stall_ms == 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 24))
def test_dynamic_policies_fit_the_lower_bound(seed, n):
    """The cache can evict any activation, so utp and superneurons fit the
    lower bound on small DAGs; DTR (no swapping) may not."""
    g = Graph(synth.random_dag(seed, n))
    lb = g.lower_bound_bytes
    for p in ("utp", "superneurons"):
        s = plan(p, PlanContext(g, lb))
        verify(g, s)
        r = simulate(g, s, lb, record=False)
        assert r.feasible and r.peak_bytes == lb, (p, r.reason)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 24), frac=st.floats(0.0, 1.0))
def test_planner_replay_matches_simulator(seed, n, frac):
    """replay.estimate_ms (what superneurons ranks its candidates by) gives the
    simulator's iteration time and feasibility; planned_peak its peak when no
    free waits for a copy."""
    g = Graph(synth.random_dag(seed, n))
    lb = g.lower_bound_bytes
    top = simulate(g, plan("none", PlanContext(g)), record=False).peak_bytes
    budget = lb + int(frac * (top - lb))
    for p in names():
        s = plan(p, PlanContext(g, budget))
        r = simulate(g, s, budget, record=False)
        if s.infeasible_reason is not None and p == "dtr":
            assert not r.feasible   # a thrashing dtr plan may fit: its reason decides
            continue
        est = replay.estimate_ms(g, s.ops, budget)
        assert r.feasible == (est < math.inf), p
        if r.feasible:
            assert math.isclose(est, r.iteration_ms, rel_tol=1e-9, abs_tol=1e-9), p
            if r.d2h_bytes == 0:
                assert replay.planned_peak(g, s.ops)[0] == r.peak_bytes, p


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 24), frac=st.floats(0.0, 1.0))
def test_utp_release_mode(seed, n, frac):
    """The release's synchronous cache: valid, within the budget, never
    prefetching ahead (every prefetch is waited for at once)."""
    from snsim.policies.utp import plan_utp
    from snsim.schedule.ops import Prefetch, Wait

    g = Graph(synth.random_dag(seed, n))
    lb = g.lower_bound_bytes
    top = simulate(g, plan("none", PlanContext(g)), record=False).peak_bytes
    budget = lb + int(frac * (top - lb))
    s = plan_utp(PlanContext(g, budget), release=True)
    verify(g, s)
    r = simulate(g, s, budget, record=False)
    assert r.feasible, r.reason
    for k, op in enumerate(s.ops):
        if type(op) is Prefetch:
            assert s.ops[k + 1] == Wait(op.tensor)

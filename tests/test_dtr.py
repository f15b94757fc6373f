"""``dtr``'s victim choice against a brute-force scorer, and its budget curve.

The planner keeps DTR's evicted neighbourhoods as union-find classes and
scores a bounded sample.  Here every eviction is re-scored from scratch: the
connected components of the evicted layers found by a plain search, every
evictable forward result scored with h = cost / (size x staleness).  When no
more than ``SAMPLE`` results are evictable (small graphs) the planner's
victim must be the brute-force minimum; on larger graphs the sampled victim
must still have a finite cost (its neighbourhood within ``CHAIN`` layers).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snsim import synth
from snsim.graph import Graph
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.policies.dtr import CHAIN, HEURISTICS, SAMPLE, Planner, plan_dtr_ops
from snsim.schedule import verify
from snsim.schedule.ops import Schedule
from snsim.sim import simulate
from snsim.trace import load

ROOT = Path(__file__).resolve().parent.parent


def brute_force(p: Planner) -> dict[tuple, float]:
    """unit (tuple of tensors) -> h, for every evictable unit with a finite cost."""
    g, res, pins, ev = p.g, p.resident, p.pins, p.evicted
    adj = {j: set(g.layers[j].inputs) | set(g.consumers[j]) for j in range(g.n)}
    comp: dict[int, int] = {}
    comps: list[list[int]] = []
    for m in sorted(ev):
        if m in comp:
            continue
        comps.append([])
        todo = [m]
        comp[m] = len(comps) - 1
        while todo:
            k = todo.pop()
            comps[-1].append(k)
            for q in adj[k]:
                if q in ev and q not in comp:
                    comp[q] = len(comps) - 1
                    todo.append(q)
    out = {}
    for j in range(1, g.n):
        x, s = ("X", j), ("S", j)
        if x in res:
            if pins.get(x):
                continue
            unit = (x, s) if s in res and not pins.get(s) else (x,)
            near = adj[j]
        elif s in res and not pins.get(s):
            unit, near = (s,), set(g.layers[j].inputs)
        else:
            continue
        size = sum(g.size(t) for t in unit)
        if size <= 0:
            continue
        touched = {comp[k] for k in near if k in ev}
        if 1 + sum(len(comps[c]) for c in touched) > CHAIN:
            continue
        cost = g.layers[j].fwd_ms + sum(g.layers[q].fwd_ms for c in touched for q in comps[c])
        out[unit] = HEURISTICS["dtr"](cost, size, p.clock - res[unit[0]] + 1e-3)
    return out


class Checked(Planner):
    checks: list[tuple[int, bool]] = []   # (candidates, exact) per eviction

    def victim(self):
        want = brute_force(self)
        exact = len(self.pool) <= self.sample
        got = super().victim()
        Checked.checks.append((len(want), exact))
        if exact:
            if not want:
                assert got is None
            else:
                low = min(want.values())
                assert got is not None and tuple(got) in want
                assert math.isclose(want[tuple(got)], low, rel_tol=1e-9), (got, low)
        elif got is not None:
            assert tuple(got) in want   # finite cost: never an over-long chain
        return got


def _budgets(g: Graph, n: int):
    live = simulate(g, plan("liveness", PlanContext(g))).peak_bytes
    lb = g.lower_bound_bytes
    return [lb + (live - lb) * k // n for k in range(n)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(4, 28))
def test_small_graphs_choose_the_exact_heuristics_victim(seed, n):
    g = Graph(synth.random_dag(seed, n))
    assert g.n - 1 <= SAMPLE   # every evictable result is scored
    Checked.checks = []
    for cap in _budgets(g, 4):
        ops, stats, reason = plan_dtr_ops(g, cap, planner=Checked)
        if reason is None:
            verify(g, Schedule("dtr", ops))
    assert all(exact for _, exact in Checked.checks)


def test_the_exact_check_saw_real_choices():
    # the property above is only worth something if evictions with several
    # candidates happened: count them over a fixed set of graphs
    Checked.checks = []
    for seed in range(15):
        g = Graph(synth.random_dag(seed, 20))
        for cap in _budgets(g, 4):
            plan_dtr_ops(g, cap, planner=Checked)
    several = [c for c, _ in Checked.checks if c >= 3]
    assert len(several) >= 20


def test_sampled_victims_are_never_infinite_cost():
    g = Graph(load(ROOT / "traces" / "k40c_resnet50_b32.json"))
    assert g.n > 2 * SAMPLE
    Checked.checks = []
    ops, stats, reason = plan_dtr_ops(g, int(1.5 * g.lower_bound_bytes), planner=Checked)
    assert reason is None and stats["evictions"] > 0
    assert any(not exact for _, exact in Checked.checks)   # the sampled path ran
    verify(g, Schedule("dtr", ops))


def test_recompute_chains_stay_short_on_a_deep_chain():
    # the old planner evicted infinite-cost tensors and re-ran chains ~n layers long
    g = Graph(synth.chain(400))
    ops, stats, reason = plan_dtr_ops(g, int(1.5 * g.lower_bound_bytes))
    run = longest = 0
    for op in ops:
        if getattr(op, "phase", None) == "R":
            run += 1
            longest = max(longest, run)
        elif getattr(op, "phase", None) in ("F", "B"):
            run = 0
    assert longest <= 2 * CHAIN


def test_resnet50_time_does_not_grow_with_the_budget():
    # issue 15: 1.615 at 1.4x but 1.632 at 1.5x.  DTR's greedy eviction is not
    # monotone in general (a larger budget changes every later choice), so this
    # pins the shipped case rather than claiming a theorem.
    g = Graph(load(ROOT / "traces" / "k40c_resnet50_b32.json"))
    times = []
    for f in (1.4, 1.5, 1.6, 2.0, 3.0):
        b = int(f * g.lower_bound_bytes)
        s = plan("dtr", PlanContext(g, b))
        verify(g, s)
        r = simulate(g, s, b, record=False)
        assert r.feasible, f
        times.append(r.iteration_ms)
    assert times == sorted(times, reverse=True), times


def test_unknown_heuristic_is_refused():
    g = Graph(synth.chain(10))
    with pytest.raises(ValueError, match="unknown DTR heuristic"):
        plan_dtr_ops(g, g.lower_bound_bytes, heuristic="nope")

"""``dtr``'s victim choice against a brute-force scorer, its three fixed bugs,
and its budget curve.

The planner keeps DTR's evicted neighbourhoods as union-find classes and
scores every evictable tensor.  Here every eviction is re-scored from
scratch: the connected components of the evicted layers found by a plain
search, every resident unpinned tensor with bytes scored with h = cost /
(size x staleness); the planner's victim must be the brute-force minimum.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import L, make
from snsim import synth
from snsim.graph import Graph
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.policies.dtr import HEURISTICS, Planner, plan_dtr_ops
from snsim.schedule import verify
from snsim.schedule.ops import Compute, Schedule
from snsim.sim import simulate
from snsim.trace import load

ROOT = Path(__file__).resolve().parent.parent


def brute_force(p: Planner) -> dict:
    """tensor -> h, for every resident, unpinned tensor with bytes (not the data layer's)."""
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
    for t, last in res.items():
        j = t[1]
        if t[0] == "G" or j == 0 or pins.get(t) or g.size(t) <= 0:
            continue
        near = set(g.layers[j].inputs) if t[0] == "S" else adj[j]
        touched = {comp[k] for k in near if k in ev}
        cost = g.layers[j].fwd_ms + sum(g.layers[q].fwd_ms for c in touched for q in comps[c])
        stale = p.clock - last
        out[t] = HEURISTICS["dtr"](cost, g.size(t), stale) if stale > 0 else math.inf
    return out


class Checked(Planner):
    checks: list[int] = []   # candidates per eviction

    def victim(self):
        want = brute_force(self)
        got = super().victim()
        Checked.checks.append(len(want))
        if not want:
            assert got is None
        else:
            low = min(want.values())
            assert got in want
            assert want[got] == low or math.isclose(want[got], low, rel_tol=1e-9), (got, low)
        return got


def _budgets(g: Graph, n: int):
    live = simulate(g, plan("liveness", PlanContext(g))).peak_bytes
    lb = g.lower_bound_bytes
    return [lb + (live - lb) * k // n for k in range(n)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(4, 28))
def test_small_graphs_choose_the_exact_heuristics_victim(seed, n):
    g = Graph(synth.random_dag(seed, n))
    Checked.checks = []
    for cap in _budgets(g, 4):
        ops, stats, reason = plan_dtr_ops(g, cap, planner=Checked, thrash_limit=100.0)
        verify(g, Schedule("dtr", ops, cap, stats, reason))


def test_the_exact_check_saw_real_choices():
    # the property above is only worth something if evictions with several
    # candidates happened: count them over a fixed set of graphs
    Checked.checks = []
    for seed in range(15):
        g = Graph(synth.random_dag(seed, 20))
        for cap in _budgets(g, 4):
            plan_dtr_ops(g, cap, planner=Checked, thrash_limit=100.0)
    several = [c for c in Checked.checks if c >= 3]
    assert len(several) >= 20


def test_full_scan_on_a_real_trace_is_the_exact_choice():
    g = Graph(load(ROOT / "traces" / "k40c_resnet50_b32.json"))
    Checked.checks = []
    ops, stats, reason = plan_dtr_ops(g, int(1.5 * g.lower_bound_bytes), planner=Checked)
    assert reason is None and stats["evictions"] > 0
    assert max(Checked.checks) > 32   # more candidates than the old sample scored
    verify(g, Schedule("dtr", ops))


def zero_byte_trace(n_zero: int = 60):
    """data, then a chain of 4 big layers, each followed by n_zero/4 zero-byte
    side layers hanging off it (views, empty results), then the loss."""
    layers, big = [L(0, "data", [], 10)], []
    for b in range(4):
        i = len(layers)
        layers.append(L(i, "conv", [i - 1 if b == 0 else big[-1]], 1000, params=1,
                        fwd=1.0, bwd=1.0, reads=["inputs"]))
        big.append(i)
        for _ in range(n_zero // 4):
            layers.append(L(len(layers), "act", [i], 0, fwd=0.1, bwd=0.1))
    side = [j for j in range(1, len(layers)) if j not in big]
    n = len(layers)
    layers.append(L(n, "loss", [big[-1]] + side, 4, fwd=0.1, bwd=0.1, reads=["inputs"]))
    return make(layers, "zero-bytes")


def test_bug_zero_byte_tensors_never_fill_the_candidates():
    # Issue 14, bug 1: the sample was drawn among zero-byte tensors too, and a plan
    # was declared infeasible "after evicting every evictable tensor" while real
    # ones were left.  Zero-byte tensors are never candidates now, sampled or not.
    g = Graph(zero_byte_trace())
    cap = g.lower_bound_bytes + 1500
    for sample in (None, 4):
        d = Planner(g, cap, HEURISTICS["dtr"], sample=sample, full_scan=0)
        assert all(g.size(t) > 0 for ts in d.cands for t in ts)
        planner = functools.partial(Planner, full_scan=0)
        ops, stats, reason = plan_dtr_ops(g, cap, sample=sample, planner=planner)
        assert reason is None and stats["evictions"] > 0, reason
        verify(g, Schedule("dtr", ops))


def test_bug_no_eviction_after_the_first_infeasible_step():
    # Issue 14, bug 2: planning went on evicting after infeasibility (649 s on LSTM
    # at 0.3).  Now the reason names the first step that cannot run, and from it
    # on the route is issued without a budget: no eviction, whole schedule.
    import re

    g = Graph(synth.chain(400))
    cap = g.lower_bound_bytes - 1

    class Counting(Planner):
        after = 0

        def victim(self):
            if self.cap == math.inf:
                Counting.after += 1
            return super().victim()

    ops, stats, reason = plan_dtr_ops(g, cap, planner=Counting)
    assert reason is not None and re.search(r"step [FBR]\d+ ", reason)
    assert Counting.after == 0
    s = plan("dtr", PlanContext(g, cap))
    verify(g, s)
    assert s.infeasible_reason == reason and not simulate(g, s, cap).feasible
    assert [op for op in s.ops if type(op) is Compute and op.phase != "R"] == [
        Compute(*step) for step in g.route]


def test_bug_thrash_limit():
    # Issue 14, bug 3: no thrash limit (11.6x reported where simrd aborts at 2x).
    # A deep chain at its lower bound recomputes far more than its compute.
    g = Graph(synth.chain(60))
    cap = int(1.5 * g.lower_bound_bytes)
    ops, stats, reason = plan_dtr_ops(g, cap, thrash_limit=1000.0)
    assert reason is None and stats["remat_ms"] > g.compute_ms   # more than 2x
    ops, stats, reason = plan_dtr_ops(g, cap)   # the default, 2.0
    assert reason is not None and reason.startswith("thrashing")
    s = plan("dtr", PlanContext(g, cap, thrash_limit=1000.0))
    r = simulate(g, s, cap, record=False)
    assert r.feasible and r.recompute_ms > r.compute_ms
    with pytest.raises(ValueError, match="thrash limit"):
        plan_dtr_ops(g, cap, thrash_limit=1.0)


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


class SampledChecked(Planner):
    """The sampled path's branch and bound against :meth:`Planner.best`, which
    scores every pick."""
    compared = 0

    def best_of(self, picks):
        want = self.best(list(picks))
        got = super().best_of(picks)
        assert got == want, (got, want)
        SampledChecked.compared += 1
        return got


def test_sampled_branch_and_bound_is_the_samples_best():
    # beyond FULL_SCAN candidates a sample is drawn; only picks whose bound does not
    # exceed the best score so far are scored, and the choice must be the one a
    # scan of every pick makes (smallest score, the last drawn of equal ones)
    SampledChecked.compared = 0
    for seed in range(12):
        g = Graph(synth.random_dag(seed, 40))
        for cap in _budgets(g, 4):
            plan_dtr_ops(g, cap, sample=3, thrash_limit=100.0,
                         planner=functools.partial(SampledChecked, full_scan=0))
    g = Graph(load(ROOT / "traces" / "k40c_resnet50_b32.json"))
    plan_dtr_ops(g, int(1.5 * g.lower_bound_bytes), sample=16,
                 planner=functools.partial(SampledChecked, full_scan=0))
    assert SampledChecked.compared > 200


def test_cached_costs_stay_lower_bounds_in_unsplit_classes(monkeypatch):
    # A class over SPLIT_MAX members is not split when a member comes back; the
    # neighbours of that member may lose the whole class (they reached it through
    # the member), so their cached costs must be reset, not only lowered by the
    # member's time (the bug: bounds above the true score on ResNet-2500, where the
    # branch and bound then skipped the best candidate).  SPLIT_MAX 2 puts every
    # small graph in that regime.
    from snsim.policies import dtr_pool

    monkeypatch.setattr(dtr_pool, "SPLIT_MAX", 2)
    seen = [0]

    class Bounded(Planner):
        def victim(self):
            pool = self.pool
            n = len(pool)
            lb = pool.bounds(self.score, self.clock)
            for k in range(n):
                t = pool.t[k]
                if not self.pins.get(t):
                    h = self.exact(t)
                    assert lb[k] <= h * (1 + 1e-9), (t, lb[k], h)
                    seen[0] += 1
            return super().victim()

    for seed in range(20):
        g = Graph(synth.random_dag(seed, 50))
        for cap in _budgets(g, 4):
            plan_dtr_ops(g, cap, planner=Bounded, thrash_limit=100.0)
    assert seen[0] > 1000


def test_early_thrash_test_is_sound():
    # The plan is declared thrashing as soon as the recomputation so far plus the
    # forward time of every evicted layer a later route step still reads exceeds
    # (limit - 1) x compute: each of those must be recomputed at least once.  When
    # that fires, the same plan without a limit must indeed recompute more than
    # the limit (or fail for another reason).
    fired = 0
    graphs = [Graph(synth.chain(60)), Graph(synth.chain(120))] + [
        Graph(synth.random_dag(seed, 40)) for seed in range(15)]
    for g in graphs:
        limit = g.compute_ms   # thrash limit 2.0
        for cap in _budgets(g, 5):
            ops, stats, reason = plan_dtr_ops(g, cap)
            if reason and "owed" in reason:
                fired += 1
                _, free, other = plan_dtr_ops(g, cap, thrash_limit=1e9)
                assert other is not None or free["remat_ms"] > limit, (cap, free)
    assert fired >= 3


def _components(near, evicted):
    seen, comps = set(), []
    for j in sorted(evicted):
        if j in seen:
            continue
        comp, stack = set(), [j]
        seen.add(j)
        while stack:
            k = stack.pop()
            comp.add(k)
            for q in near[k]:
                if q in evicted and q not in seen:
                    seen.add(q)
                    stack.append(q)
        comps.append(frozenset(comp))
    return set(comps)


@pytest.mark.parametrize("seed", range(6))
def test_small_classes_are_the_components_after_every_change(seed):
    # a member leaving its class without a rebuild (at most one evicted neighbour)
    # must leave the same classes, with the same summed time, as a rebuild would
    import random

    from snsim.policies.dtr_pool import Classes

    g = Graph(synth.random_dag(seed, 60) if seed % 2 else synth.chain(60))
    near = [tuple(dict.fromkeys(layer.inputs)) + tuple(c) for layer, c
            in zip(g.layers, g.consumers)]
    fwd = [1.0 + (j % 7) / 8 for j in range(g.n)]   # exact in binary floats
    cls = Classes(near, fwd)
    rng = random.Random(seed)
    for _ in range(400):
        j = rng.randrange(1, g.n)
        if j in cls.evicted:
            cls.remove(j)
        else:
            cls.add(j)
        if cls.dirty:   # rebuilt lazily, before the next use (cost) or change
            cls.rebuild()
        comps = _components(near, cls.evicted)
        got = {}
        for k in cls.evicted:
            got.setdefault(cls.root(k), set()).add(k)
        assert {frozenset(v) for v in got.values()} == comps
        for r, members in got.items():
            assert cls.ms[r] == sum(fwd[k] for k in members)
            assert cls.size(r) == len(members)

"""``superneurons`` measured against the optimum (issue 15): what the
comparison with ``optimal`` changed in it, each with a test that fails
without the change."""

from __future__ import annotations

from pathlib import Path

import pytest

from snsim.graph import Graph
from snsim.policies import plan, replay
from snsim.policies import superneurons as sn
from snsim.policies.base import PlanContext
from snsim.trace.io import load

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("factor", [1.05, 2.0, 3.0])
def test_superneurons_plans_each_prefetch_distance_and_keeps_the_fastest(factor):
    """The best prefetch distance depends on the budget (K40c ResNet-50 b32:
    4 checkpoints ahead is best at 1.05x the lower bound, 16 at 2x and 3x),
    so superneurons is no slower than any candidate at any of its distances
    (with one distance, 4, it was 1.0895 x compute at 3x against 1.0545)."""
    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    ctx = PlanContext(g, int(factor * g.lower_bound_bytes))
    cap = ctx.capacity_bytes
    s = plan("superneurons", ctx)
    assert s.infeasible_reason is None
    got = replay.estimate_ms(g, s.ops, cap)
    keep = sn.layers.checkpoints(g)
    for kind in ("cache-only", "cost-aware"):
        for ahead in (1, 4, 8, 16):
            ops, _, reason = sn.candidate(g, cap, kind, keep, ahead)
            if reason is None:
                assert got <= replay.estimate_ms(g, ops, cap) * (1 + 1e-9), \
                    (kind, ahead)
    assert s.stats["ahead"] in sn.AHEAD


def test_superneurons_plans_a_smaller_cache_too():
    """Given 1.10x the lower bound, the LRU cache evicted later than at 1.05x
    and ran slower there (K40c Inception-v4 b16: 1.1278 against 1.1013 x
    compute); a cache planned at 97% of the budget (which fits it) is timed
    too, so here the larger budget is no slower than the smaller one."""
    g = Graph(load(str(ROOT / "traces" / "k40c_inception_v4_b16.json")))
    ms = {}
    for factor in (1.05, 1.1):
        ctx = PlanContext(g, int(factor * g.lower_bound_bytes))
        s = plan("superneurons", ctx)
        assert s.infeasible_reason is None
        ms[factor] = replay.estimate_ms(g, s.ops, ctx.capacity_bytes)
    assert ms[1.1] <= ms[1.05]


def test_superneurons_recomputes_only_where_memory_is_short():
    """At 3x the lower bound on K40c ResNet-50 b32 recomputing every segment
    left no stall: all its 4.8% over compute was recomputation.  Recomputing
    only the segments of the first quarter (the largest activations) and
    caching the rest is faster (1.0288 against 1.0545 x compute); superneurons
    plans it, and is no slower than cost-aware recomputation of the early
    segments alone at each share it plans."""
    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    ctx = PlanContext(g, 3 * g.lower_bound_bytes)
    cap = ctx.capacity_bytes
    s = plan("superneurons", ctx)
    got = replay.estimate_ms(g, s.ops, cap)
    keep = sn.layers.checkpoints(g)
    every = min(replay.estimate_ms(g, sn.candidate(g, cap, "cost-aware", keep, a)[0], cap)
                for a in sn.AHEAD)
    for until in (0.25, 0.5):
        early = sn.early_only(g, keep, until)
        assert sum(early) > sum(keep)   # later segments are cached, not recomputed
        for a in sn.AHEAD:
            ops, _, reason = sn.candidate(g, cap, "cost-aware", keep, a, until)
            assert reason is None
            assert got <= replay.estimate_ms(g, ops, cap) * (1 + 1e-9)
    assert got < every * 0.98


def test_superneurons_recomputes_a_conv_cheaper_than_its_copy():
    """optimal's plan for K40c VGG-16 b32 at 1.10x the lower bound recomputed
    the first conv (3 input channels) instead of swapping its 392 MB output and
    ran 1.03% faster than superneurons (1.0210 against 1.0316 x compute).
    Checkpoints by cost drop exactly that conv; superneurons plans them and is
    then faster than with every checkpoint by kind, and than the MILP's plan."""
    g = Graph(load(str(ROOT / "traces" / "k40c_vgg16_b32.json")))
    keep = sn.layers.checkpoints(g)
    cheap = sn.cheap_checkpoints(g, keep)
    assert [i for i in range(g.n) if keep[i] != cheap[i]] == [1]
    assert g.layers[1].kind == "conv"
    ctx = PlanContext(g, int(1.1 * g.lower_bound_bytes))
    cap = ctx.capacity_bytes
    s = plan("superneurons", ctx)
    got = replay.estimate_ms(g, s.ops, cap)
    assert s.stats.get("checkpoints") == "by cost"
    by_kind = min(replay.estimate_ms(g, ops, cap)
                  for kind in ("cache-only", "cost-aware") for a in sn.AHEAD
                  for until in sn.UNTIL
                  for ops, _, reason in [sn.candidate(g, cap, kind, keep, a, until)]
                  if reason is None)
    assert got < by_kind * 0.99
    assert got < 1.0210 * g.compute_ms


def test_superneurons_refines_its_plan_within_one_percent_of_the_optimum():
    """Issue 15: optimal's plan for K40c ResNet-50 b32 at 2x the lower bound
    (1.0252 x compute) was superneurons' under other knobs (the first fifth
    recomputed, checkpoints by cost, 8 ahead) with recomputations undone,
    trimmed or swapped.  superneurons now plans those knobs and refines its
    fastest plans the same way (note 9): 1.0879 -> 1.0252 x compute.  The
    plan verifies and the simulator runs it at the time estimated."""
    from snsim.schedule import verify
    from snsim.sim import simulate

    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    budget = 2 * g.lower_bound_bytes
    ctx = PlanContext(g, budget)
    s = plan("superneurons", ctx)
    assert s.stats["refined"] > 0 and s.stats["ahead"] == 8
    verify(g, s)
    r = simulate(g, s, budget, record=False)
    assert r.feasible
    assert r.iteration_ms == pytest.approx(s.stats["estimated_ms"], rel=1e-6)
    assert r.iteration_ms < 1.0252 * 1.01 * g.compute_ms
    # no slower than any plan of its grid unrefined (the one it started from)
    keep = sn.layers.checkpoints(g)
    unrefined = min(replay.estimate_ms(g, sn.candidate(g, ctx.capacity_bytes, "cost-aware",
                                                       kp, a, u)[0], ctx.capacity_bytes)
                    for kp in (keep, sn.cheap_checkpoints(g, keep)) for a in sn.AHEAD
                    for u in sn.UNTIL)
    assert r.iteration_ms < unrefined * 0.97


def test_superneurons_refinement_is_bounded_by_work_not_time(monkeypatch):
    """The refinement stops after REFINE_WORK ops estimated (the swaps' after
    SWAP_PROBE per plan, then SWAP_WORK), so a plan does not depend on the
    machine: with no work allowed
    the grid's best is returned unrefined and no faster; above WIDE_LIMIT
    layers nothing is refined."""
    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b16.json")))
    ctx = PlanContext(g, int(1.5 * g.lower_bound_bytes))
    full = plan("superneurons", ctx)
    assert plan("superneurons", ctx).ops == full.ops
    monkeypatch.setattr(sn, "REFINE_WORK", 0)
    monkeypatch.setattr(sn, "SWAP_WORK", 0)
    monkeypatch.setattr(sn, "SWAP_PROBE", 0)
    none = plan("superneurons", ctx)
    assert "refined" not in none.stats
    assert none.stats["estimated_ms"] > full.stats["estimated_ms"] * 1.02
    monkeypatch.setattr(sn, "WIDE_LIMIT", 10)
    narrow = plan("superneurons", ctx)
    assert "refined" not in narrow.stats and narrow.stats["ahead"] == sn.AHEAD[0]

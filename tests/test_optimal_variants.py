"""``optimal``'s variants of ``superneurons`` (snsim/policies/optimal/variants.py):
other knob settings, polished, beat its own plan polished, and what they
return is a plan like any other (verified, simulated at its time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snsim.graph import Graph
from snsim.policies import plan, replay
from snsim.policies.base import PlanContext
from snsim.policies.optimal import compute_bound_ms
from snsim.policies.polish import polish
from snsim.policies.optimal.variants import best_variant, variant_plans
from snsim.schedule import verify
from snsim.schedule.ops import Schedule
from snsim.sim import simulate
from snsim.trace.io import load

ROOT = Path(__file__).resolve().parent.parent


def test_a_variant_polished_beats_superneurons_polished_and_simulates_at_its_time():
    """K40c ResNet-50 b32 at 3x the lower bound: superneurons' plan polished is
    1.0161 x compute; the first 1/8 recomputed with a 85-90% cache,
    polished, 1.0090-1.0103, within 1% of the moment bound (1.0022; it was
    1.0128 with superneurons' own grid).  The variants are fastest first and
    each fits; the one returned verifies, fits, and the simulator runs it at
    the time the polish estimated."""
    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    budget = int(3.0 * g.lower_bound_bytes)
    ctx = PlanContext(g, budget)
    cap = ctx.capacity_bytes
    s = plan("superneurons", ctx)
    ms = replay.estimate_ms(g, s.ops, cap)
    ms, _, _ = polish(g, cap, s.ops, ms, 10.0)
    found = variant_plans(g, cap, 10.0)
    assert len(found) > 10
    assert [x[0] for x in found] == sorted(x[0] for x in found)
    assert all(replay.planned_peak(g, ops, cap)[1] is None for _, _, ops in found[:5])
    got = best_variant(g, cap, ms, 12.0, 5.0, s.ops)
    assert got is not None
    t, label, ops, changed = got
    assert t < ms * (1 - 0.002) and changed > 0 and "ahead=" in label
    assert t < 1.0125 * compute_bound_ms(g)
    sched = Schedule("variant", ops, budget)
    verify(g, sched)
    r = simulate(g, sched, budget, record=False)
    assert r.feasible and r.peak_bytes <= cap
    assert r.iteration_ms == pytest.approx(t, rel=1e-9)
    assert best_variant(g, cap, t / 2, 2.0, 1.0) is None   # none is that fast

"""A backward step that hands its dying reads to autograd (``bwd_released``), by hand.

handover4: data X0 100 B -> fc X1 300 B (reads its input) -> attention X2 60 B
(reads input and output, saves S2 20 B; backward workspace 250 B; measured
peak 170 B above the level before the step when X1, X2 and S2 are handed to
autograd) -> loss X3 4 B; static 2 x 10 B.  Liveness frees X1, X2, S2 (the
step's dying reads) and G2 (its own output gradient, not a dying read) right
after B2.
"""

from __future__ import annotations

import pytest

from conftest import L, make
from snsim.errors import SnsimError
from snsim.graph import Graph, X
from snsim.policies.base import PlanContext
from snsim.policies.liveness import plan_liveness
from snsim.policies.none import plan_none
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Schedule
from snsim.sim import simulate
from snsim.trace import from_dict
from snsim.trace.io import to_dict
from snsim.trace.model import Workspace


def _trace(released=170):
    return make([
        L(0, "data", [], 100),
        L(1, "fc", [0], 300, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(2, "attention", [1], 60, fwd=1.0, bwd=2.0, reads=["inputs", "output"], extra=20,
          ws=[Workspace("measured", 0, 1.0, 2.0, bwd_bytes=250, bwd_released=released)]),
        L(3, "loss", [2], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "handover4")


def _b2(ops):
    return next(k for k, op in enumerate(ops) if isinstance(op, Compute) and op.step == ("B", 2))


def test_dying_reads_and_effect_by_hand():
    g = Graph(_trace())
    assert g.dying[("B", 2)] == {("X", 1), ("X", 2), ("S", 2)}
    ops = plan_liveness(PlanContext(g)).ops
    k = _b2(ops)
    assert sorted(ledger.dying_reads(g, ops, k)) == [("S", 2), ("X", 1), ("X", 2)]
    assert ledger.hands_over(g, ops, k)
    # B2 allocates G1 (300) and peaks 170 above the level before it: workspace -130
    assert ledger.walk(g, ops)[k] == (300, -130, 0)
    assert ledger.walk(g, ops, check=False)[k] == (300, -130, 0)


def test_peak_and_lower_bound_by_hand():
    g = Graph(_trace())
    s = plan_liveness(PlanContext(g))
    # level before B2: static 20 + X0 100 + X1 300 + X2 60 + S2 20 + G2 60 = 560; + 170
    assert simulate(g, s).peak_bytes == 730
    assert ledger.planned_peak(g, s.ops)[0] == 730
    # B2 alone: reads 440 + 170 (below reads + G1 300 + workspace 250), plus static 20
    assert g.lower_bound_bytes == 630
    # without the field: 560 + G1 300 + workspace 250
    old = Graph(_trace(None))
    assert simulate(old, plan_liveness(PlanContext(old))).peak_bytes == 1110


def test_no_hand_over_unless_the_dying_reads_are_liveness_ones():
    g = Graph(_trace())
    ops = plan_none(PlanContext(g)).ops      # nothing is freed after B2
    k = _b2(ops)
    assert ledger.dying_reads(g, ops, k) == [] and not ledger.hands_over(g, ops, k)
    assert ledger.walk(g, ops)[k] == (300, 250, 0)
    # liveness, but X1 kept until the end: a different set, so the plain workspace
    live = plan_liveness(PlanContext(g)).ops
    kept = [op for op in live if op != Free(X(1))] + [Free(X(1))]
    k = _b2(kept)
    assert not ledger.hands_over(g, kept, k)
    assert ledger.walk(g, kept)[k] == (300, 250, 0)
    assert simulate(g, Schedule("kept", kept)).peak_bytes == 1110


def test_field_round_trips_and_is_checked():
    doc = to_dict(_trace())
    assert doc["layers"][2]["workspace"][0]["bwd_released"] == 170
    assert from_dict(doc, "x").layers[2].workspace[0].bwd_released == 170
    doc["layers"][2]["workspace"][0]["bwd_released"] = -1
    with pytest.raises(SnsimError, match="bwd_released"):
        from_dict(doc, "bad.json")


def test_superneurons_takes_liveness_when_only_the_hand_over_fits():
    """At 800 B, liveness fits (730 B, B2 handing X1, X2, S2 over) but the cache's
    step-by-step check, which cannot count on the hand-over, sees B2 needing its
    whole 250 B workspace; superneurons keeps liveness's plan (pure compute)."""
    from snsim import policies

    g = Graph(_trace())
    s = policies.plan("superneurons", PlanContext(g, 800))
    assert s.stats["plan"] == "liveness" and s.stats["evictions"] == 0
    r = simulate(g, s)
    assert r.feasible and r.peak_bytes == 730
    assert s.ops == plan_liveness(PlanContext(g)).ops

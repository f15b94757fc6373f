"""A backward step in two phases (trace field ``bwd_phases``), worked out by hand.

phases4: data X0 100 B -> fc X1 300 B (reads its input) -> attention X2 60 B
(reads input and output, saves S2 20 B; backward kernels 120 B above the
level, assembly 250 B above the level less its dying reads plus G1) -> loss
X3 4 B; static 2 x 10 B.  Under liveness, right after B2 the schedule frees
X1, X2 and S2 (380 B, its dying reads) and G2 (its own output gradient, which
does not count as dying).
"""

from __future__ import annotations

import pytest

from conftest import L, make
from snsim.errors import SnsimError
from snsim.graph import Graph
from snsim.policies.base import PlanContext
from snsim.policies.liveness import plan_liveness
from snsim.schedule import ledger
from snsim.schedule.ops import Compute
from snsim.sim import simulate
from snsim.trace import from_dict
from snsim.trace.io import to_dict
from snsim.trace.model import Workspace


def _trace(phases=(120, 250)):
    return make([
        L(0, "data", [], 100),
        L(1, "fc", [0], 300, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(2, "attention", [1], 60, fwd=1.0, bwd=2.0, reads=["inputs", "output"], extra=20,
          ws=[Workspace("measured", 0, 1.0, 2.0, bwd_bytes=250, bwd_phases=phases)]),
        L(3, "loss", [2], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "phases4")


def _b2(schedule):
    return next(k for k, op in enumerate(schedule.ops)
                if isinstance(op, Compute) and op.step == ("B", 2))


def test_dying_reads_and_effect_by_hand():
    g = Graph(_trace())
    s = plan_liveness(PlanContext(g))
    k = _b2(s)
    assert sorted(ledger.dying_reads(g, s.ops, k)) == [("S", 2), ("X", 1), ("X", 2)]
    # B2 allocates G1 (300); its peak above the level before it is
    # max(kernels 120, 300 - 380 + assembly 250) = 170, so the workspace is -130
    assert ledger.walk(g, s.ops)[k] == (300, -130, 0)
    assert ledger.walk(g, s.ops, check=False)[k] == (300, -130, 0)


def test_peak_and_lower_bound_by_hand():
    g = Graph(_trace())
    s = plan_liveness(PlanContext(g))
    # level before B2: static 20 + X0 100 + X1 300 + X2 60 + S2 20 + G2 60 = 560; +170
    assert simulate(g, s).peak_bytes == 730
    assert ledger.planned_peak(g, s.ops)[0] == 730
    # B2 alone: max(reads 440 + 120, G1 300 + 250) = 560, plus static 20
    assert g.lower_bound_bytes == 580
    # without the field the step is one phase: 560 + G1 300 + workspace 250
    old = Graph(_trace(None))
    assert simulate(old, plan_liveness(PlanContext(old))).peak_bytes == 1110


def test_nothing_dies_under_none():
    from snsim.policies.none import plan_none

    g = Graph(_trace())
    s = plan_none(PlanContext(g))
    k = _b2(s)
    assert ledger.dying_reads(g, s.ops, k) == []
    assert ledger.walk(g, s.ops)[k] == (300, 250, 0)   # max(120, 300 + 250) - 300


def test_field_round_trips_and_is_checked():
    doc = to_dict(_trace())
    assert doc["layers"][2]["workspace"][0]["bwd_phases"] == [120, 250]
    assert from_dict(doc, "x").layers[2].workspace[0].bwd_phases == (120, 250)
    doc["layers"][2]["workspace"][0]["bwd_phases"] = [1, 2, 3]
    with pytest.raises(SnsimError, match="bwd_phases"):
        from_dict(doc, "bad.json")

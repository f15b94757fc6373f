"""The shared polish (snsim/policies/polish.py): ``optimal`` polishes within a
time, ``superneurons`` refines within a count of plans estimated."""

from __future__ import annotations

from pathlib import Path

from snsim.graph import Graph
from snsim.policies import replay
from snsim.policies import superneurons as sn
from snsim.policies import polish as P
from snsim.policies.base import PlanContext
from snsim.trace.io import load

ROOT = Path(__file__).resolve().parent.parent


def test_greedy_stops_after_its_work_and_its_passes():
    """polish.greedy with a Work of n estimates at most n plans (the rest of the
    work is left to the caller's next plan), and with ``passes=1`` does one
    pass; with no work it returns the plan unchanged."""
    g = Graph(load(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    ctx = PlanContext(g, 2 * g.lower_bound_bytes)
    cap = ctx.capacity_bytes
    ops, _, reason = sn.candidate(g, cap, "cost-aware", sn.layers.checkpoints(g), 4, 0.25)
    assert reason is None
    ms = replay.estimate_ms(g, ops, cap)
    assert P.refine(g, cap, ops, ms, P.Work(0)) == (ms, ops, 0)
    w = P.Work(7)
    got, _, _ = P.refine(g, cap, ops, ms, w)
    assert w.left == 0 and got <= ms
    w = P.Work()
    once = P.refine(g, cap, ops, ms, w)
    assert once[0] < ms and once[2] > 0 and w.left == float("inf")
    # a second pass of the same order finds nothing more here
    twice = P.greedy(g, cap, ops, ms, float("inf"), P.costliest_first(g), passes=2,
                     backs=P.REFINE_BACKS, dropped=False)
    assert twice[0] == once[0]

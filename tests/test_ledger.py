"""The ledger: each op's memory effect, worked out by hand on chain4.

chain4: data X0 100 B -> conv X1 200 B (reads inputs) -> act X2 200 B (reads
output) -> loss X3 4 B; static 2 x 10 B.
"""

from __future__ import annotations

import pytest

from snsim.errors import ScheduleError
from snsim.graph import Graph, X
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Schedule, Wait
from snsim.sim import simulate
from test_engine import swap_schedule


def _swap():
    """chain4 with X0 offloaded after F1 and brought back for B1 (the engine tests' schedule)."""
    return swap_schedule().ops


def test_effects_by_hand(chain4):
    g = Graph(chain4)
    eff = ledger.walk(g, _swap())
    assert eff[0] == (100, 0, 0)        # F0 makes the data X0 resident
    assert eff[1] == (200, 0, 0)        # X1
    assert eff[2] == (0, 0, 0)          # an offload moves no device bytes
    assert eff[3] == (0, 0, 100)        # free X0
    assert eff[8] == (204, 0, 0)        # the loss's backward makes G3 (4) and its input's G2
    assert eff[10] == (200, 0, 0)       # B2 makes G1
    assert eff[13] == (100, 0, 0)       # a prefetch allocates when issued
    assert eff[15] == (0, 0, 0)         # B1: the data needs no gradient
    # every byte allocated is freed by the end: 100+200+200+4+204+200+100
    assert sum(e[0] for e in eff) == sum(e[2] for e in eff) == 1008
    # without the rules, the same bytes
    assert ledger.walk(g, _swap(), check=False) == eff


def test_resident_saved_extra_is_overwritten_in_place():
    from conftest import L, make
    t = make([L(0, "data", [], 100), L(1, "dropout", [0], 100, fwd=1.0, bwd=1.0, extra=30),
              L(2, "loss", [1], 4, fwd=0.5, bwd=0.5, reads=["inputs"])])
    g = Graph(t)
    ops = [Compute("F", 0), Compute("F", 1), Free(X(1)), Compute("R", 1)]
    eff = ledger.walk(g, ops, route=False)
    assert eff[1] == (130, 0, 0)        # X1 and S1
    assert eff[3] == (100, 0, 0)        # S1 still resident: only X1's bytes
    assert ledger.walk(g, ops, route=False, check=False) == eff


def test_planned_peak_counts_frees_as_immediate(chain4):
    g = Graph(chain4)
    peak, first = ledger.planned_peak(g, _swap())
    assert peak == simulate(g, Schedule("hand", _swap())).peak_bytes
    assert first is None
    _, first = ledger.planned_peak(g, _swap(), capacity=400)
    assert first == 4                            # F2: 20 + X1 200 + X2 200 > 400


def test_effects_are_cached_per_schedule(chain4):
    g = Graph(chain4)
    s = Schedule("hand", _swap())
    a = ledger.effects(g, s)
    assert ledger.effects(g, s) is a
    assert ledger.effects(Graph(chain4), s) is not a   # another graph walks again


def test_walk_names_the_op(chain4):
    with pytest.raises(ScheduleError, match=r"schedule of p: op 1 \(free X1\)"):
        ledger.walk(Graph(chain4), [Compute("F", 0), Free(X(1))], "p", route=False)
    with pytest.raises(ScheduleError, match="waits for X0"):
        ledger.walk(Graph(chain4), [Compute("F", 0), Wait(X(0))], route=False)


def test_grad_bytes_sizes_the_gradient_by_hand():
    """A tuple layer whose 60 B output has one 40 B element that gets a gradient
    (``grad_bytes``): G2 is 40 B, X2 stays 60 B.  data X0 100 -> fc X1 200
    (reads input) -> attention X2 60 (reads nothing) -> loss X3 4; static 2 x 10.
    Liveness level before B2: static 20 + X0 100 + G2 40 = 160 (with G2 = 60 it
    would be 180); B2 allocates G1 200: 360."""
    import dataclasses

    from conftest import L, make
    from snsim.policies.base import PlanContext
    from snsim.policies.liveness import plan_liveness
    from snsim.trace import from_dict
    from snsim.trace.io import to_dict

    attn = dataclasses.replace(L(2, "attention", [1], 60, fwd=1.0, bwd=2.0), grad_bytes=40)
    t = make([L(0, "data", [], 100),
              L(1, "fc", [0], 200, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
              attn, L(3, "loss", [2], 4, fwd=0.5, bwd=0.5, reads=["inputs"])])
    g = Graph(t)
    assert (g.size(("G", 2)), g.size(("X", 2))) == (40, 60)
    ops = plan_liveness(PlanContext(g)).ops
    k = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.step == ("B", 2))
    level = sum(a - f for a, _, f in ledger.walk(g, ops)[:k]) + g.trace.static_bytes
    assert level == 20 + 100 + 40          # X0 and G2 (40 B, not 60) before B2
    assert level + ledger.walk(g, ops)[k][0] == 360
    doc = to_dict(t)
    assert doc["layers"][2]["grad_bytes"] == 40 and from_dict(doc).layers[2].grad_bytes == 40
    doc["layers"][2]["grad_bytes"] = 61
    with pytest.raises(Exception, match="field grad_bytes: 61 is more than output_bytes 60"):
        from_dict(doc)

"""In-place storage (docs/DESIGN.md section 3, "In-place storage"), worked by hand.

A layer with ``inplace_alias`` writes its output into its input's storage
(``ReLU(inplace=True)``): where the input dies at the step, the step allocates
nothing; where the schedule keeps the input (policy ``none``, a host copy),
the output is counted beside it as before.  A trace without the field means
what it always meant.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from snsim.errors import TraceError
from snsim.graph import Graph
from snsim.policies.base import PlanContext
from snsim.policies.liveness import liveness_ops
from snsim.policies.none import plan_none
from snsim.schedule.ledger import in_place_steps, planned_peak, walk
from snsim.schedule.ops import Compute, Free, Offload
from snsim.trace import from_dict, to_dict
from tests.conftest import L, liveness_peak, make


def _net(alias: bool):
    # data (100) -> conv (400 out, 10 B params, reads its input) -> relu in place
    # (400, reads its output) -> fc (40, reads its input) -> loss
    relu = L(2, "act", [1], 400, reads=["output"])
    if alias:
        relu = replace(relu, extra={"inplace": True, "inplace_of": 1, "inplace_alias": True})
    return make([L(0, "data", [], 100), L(1, "conv", [0], 400, params=10, reads=["inputs"]),
                 relu, L(3, "fc", [2], 40, params=10, reads=["inputs"]),
                 L(4, "loss", [3], 4, extra=8)])


def test_the_relu_takes_over_the_conv_output_where_it_dies():
    g = Graph(_net(True))
    ops = liveness_ops(g)
    k = next(k for k, op in enumerate(ops) if isinstance(op, Compute) and op.step == ("F", 2))
    assert isinstance(ops[k + 1], Free) and ops[k + 1].tensor == ("X", 1)
    assert in_place_steps(g, ops) == {k}
    # F2 allocates X2 (400) and gives back X1's 400 as it runs: its level is the
    # level before it.  Statics 2 x 20 = 40; before F2: X0 (conv reads it) + X1 = 500
    nbytes, ws, _ = walk(g, ops, route=False)[k]
    assert (nbytes, ws) == (400, -400)
    # the forward peak moved from F2 (40 + 100 + 400 + 400 = 940) to F3
    # (40 + X0 100 + X2 400 + X3 40 = 580); backward: B2 holds X0, X2, G2 and makes G1
    # (400): 40 + 100 + 400 + 400 + 400 = 1340 in both
    assert liveness_peak(_net(False)) == liveness_peak(_net(True)) == 1340
    # the step's own need: the lower bound counts F2 at X1 only
    assert g.least_step_bytes(("F", 2)) == 400
    assert Graph(_net(False)).least_step_bytes(("F", 2)) == 800


def test_forward_peak_falls_by_the_input_when_it_is_the_peak():
    # no backward reads of the input: conv on the data layer with a 4000 B output;
    # the forward step F2 is the peak out of place
    def net(alias):
        t = _net(alias)
        layers = list(t.layers)
        layers[1] = replace(layers[1], output_bytes=4000)
        layers[2] = replace(layers[2], output_bytes=4000)
        return replace(t, layers=tuple(layers))
    # out of place F2: 40 + X0 100 + X1 4000 + X2 4000 = 8140; in place: 4140.
    # backward B2: 40 + X0 + X2 + G2 + G1 = 40 + 100 + 12000 = 12140 either way
    g_in, g_out = Graph(net(True)), Graph(net(False))
    assert planned_peak(g_out, liveness_ops(g_out))[0] == 12140
    levels_out = _levels(g_out)
    levels_in = _levels(g_in)
    assert levels_out[("F", 2)] == 8140 and levels_in[("F", 2)] == 4140


def _levels(g):
    level = g.trace.static_bytes
    out = {}
    ops = liveness_ops(g)
    for op, (nb, ws, fr) in zip(ops, walk(g, ops, route=False)):
        level += nb - fr
        if isinstance(op, Compute):
            out[op.step] = level + ws
    return out


def test_a_kept_input_is_not_written_over():
    # policy none keeps X1: the relu's output is counted beside it, as without the field
    g = Graph(_net(True))
    sched = plan_none(PlanContext(g))
    assert in_place_steps(g, sched.ops) == frozenset()
    assert planned_peak(g, sched.ops)[0] == planned_peak(Graph(_net(False)),
                                                         plan_none(PlanContext(Graph(_net(False)))).ops)[0]


def test_an_input_with_a_host_copy_is_not_written_over():
    g = Graph(_net(True))
    ops = liveness_ops(g)
    k = next(k for k, op in enumerate(ops) if isinstance(op, Compute) and op.step == ("F", 2))
    ops = ops[:k] + [Offload(("X", 1))] + ops[k:]   # a copy may still be reading X1
    assert in_place_steps(g, ops) == frozenset()


def test_the_field_is_checked_on_load():
    doc = to_dict(_net(True))
    doc["layers"][2]["inplace_of"] = 0
    with pytest.raises(TraceError, match="layer 2 .*inplace_alias: needs inplace_of"):
        from_dict(doc, "t")
    doc["layers"][2]["inplace_of"] = 1
    doc["layers"][2]["inplace_alias"] = "yes"
    with pytest.raises(TraceError, match="inplace_alias"):
        from_dict(doc, "t")


def test_lower_bound_credits_the_in_place_step():
    # a frozen stem (no parameters: no backward) with 4000 B outputs: out of place
    # the largest step is F2 (X1 + X2 = 8000); in place F2 needs only X1 (4000)
    # and the largest is fc's backward B3 (G3 100 + X2 4000 = 4100)
    def net(alias):
        t = _net(alias)
        layers = list(t.layers)
        layers[1] = replace(layers[1], output_bytes=4000, param_bytes=0)
        layers[2] = replace(layers[2], output_bytes=4000)
        return replace(t, layers=tuple(layers))
    g_in, g_out = Graph(net(True)), Graph(net(False))
    assert g_out.lower_bound_bytes - g_out.trace.static_bytes == 8000
    assert g_in.lower_bound_bytes - g_in.trace.static_bytes == 4100

"""Shared parameters (docs/DESIGN.md section 3, "Shared parameters"), by hand.

A parameter that several backward steps differentiate (a module called
twice) has its gradient contributions summed by autograd in a buffer of its
own from the first contributing step to the last: ``("P", owner)``, made by
the first contributor in backward order, needed by the others.  With
``set-to-none`` gradients that buffer is the gradient, born at the first
contributor.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from snsim.errors import TraceError
from snsim.graph import Graph
from snsim.policies.liveness import liveness_ops
from snsim.schedule.ledger import planned_peak
from snsim.trace import from_dict, to_dict
from snsim.training import Training
from tests.conftest import L, make


def _net(shared: bool, training=None):
    # data -> fc1 (owns 1000 B of params) -> act -> fc2 (uses fc1's params again)
    # -> loss; activations 100 B
    fc2 = L(3, "fc", [2], 100, reads=["inputs"])
    if shared:
        fc2 = replace(fc2, extra={"param_shares": [[1, 1000]]})
    t = make([L(0, "data", [], 100), L(1, "fc", [0], 100, params=1000, reads=["inputs"]),
              L(2, "act", [1], 100, reads=["output"]), fc2, L(4, "loss", [3], 4, extra=8)])
    return t.with_training(training) if training is not None else t


def test_the_buffer_lives_from_the_first_contributor_to_the_owner():
    g = Graph(_net(True))
    assert g.param_buffers == {1: (1000, (3, 1))}
    assert ("P", 1) in g.allocs(("B", 3)) and ("P", 1) in g.needs(("B", 1))
    ops = liveness_ops(g)
    frees = [k for k, op in enumerate(ops) if getattr(op, "tensor", None) == ("P", 1)]
    (k,) = frees
    before = [op for op in ops[:k] if type(op).__name__ == "Compute"]
    assert before[-1].step == ("B", 1)   # freed right after the owner's backward
    # B3 (fc2) makes the buffer: static 2 x 1000, X0 (fc1 reads it), X2 (fc2 reads
    # it), G3, and it allocates G2 and P1: 2000 + 100 + 100 + 100 + 100 + 1000 =
    # 3400; B1 still holds it: 2000 + X0 + G1 + P1 = 3200.  Without the buffer the
    # peak is B3's 2400
    assert planned_peak(g, ops)[0] == 3400
    plain = Graph(_net(False))
    assert planned_peak(plain, liveness_ops(plain))[0] == 2400


def test_set_to_none_gradients_are_born_at_the_first_contributor():
    t = Training(optimizer="sgd", grads="set-to-none")
    g = Graph(_net(True, t))
    assert g.param_buffers == {}
    assert g.param_grad_bytes(("B", 3)) == 1000 and g.param_grad_bytes(("B", 1)) == 0
    plain = Graph(_net(False, t))
    assert plain.param_grad_bytes(("B", 3)) == 0 and plain.param_grad_bytes(("B", 1)) == 1000


def test_the_field_is_checked_on_load():
    doc = to_dict(_net(True))
    doc["layers"][3]["param_shares"] = [[4, 10]]
    with pytest.raises(TraceError, match="param_shares: layer 4 is not an earlier layer"):
        from_dict(doc, "t")
    doc["layers"][3]["param_shares"] = [[1, 2000]]
    with pytest.raises(TraceError, match="param_shares: 2000 bytes of layer 1"):
        from_dict(doc, "t")
    doc["layers"][3]["param_shares"] = [[1, 10, 3]]
    with pytest.raises(TraceError, match="not a pair"):
        from_dict(doc, "t")


def test_lower_bound_counts_born_gradients_at_the_first_contributor():
    # set-to-none: fc2's backward makes the shared 1000 B; the bound equals the
    # step-by-step sum of least_step_bytes with the born bytes so far
    t = Training(optimizer="sgd", grads="set-to-none")
    g = Graph(_net(True, t))
    born, best = 0, 0
    for s in g.route:
        born += g.param_grad_bytes(s)
        best = max(best, born + g.least_step_bytes(s))
    best = max(best, born + g.least_step_bytes(g.optimizer_step))
    assert g.lower_bound_bytes == g.trace.static_bytes + best

"""Gradient views (docs/DESIGN.md section 3, "Gradient views"), worked out by hand.

cat2: data X0 100 -> conv1 X1 100 (10 B params, reads inputs)
                  -> conv2 X2 100 (10 B params, reads inputs, 300 B backward workspace)
                     -> act3 X3 100 (reads output)
      concat4 [1, 3] X4 200 (reads nothing) -> loss5 X5 4 (reads inputs).
Static 2 x 20 = 40.  Liveness, above static:
F0 100, F1 200, F2 300, F3 400 (X2 freed: 300), F4 500 (X1 freed: 400: X0 X3 X4),
F5 404 (X5 freed: 400), B5 604 (G5 4 and G4 200; X4 and G5 freed: 400: X0 X3 G4).
Own-storage gradients (no ``grad_views``): B4 makes G1 and G3 (600; G4 freed: 400),
B3 makes G2 (500; X3, G3 freed: 300), B2 300 + 300 workspace = 600, B1 200.
Peak 604 + 40 = 644.
With ``grad_views: [1, 3]`` (torch.cat's backward hands out slices of G4): G1 and G3
are 0 B views and every step needing them needs G4: B4 400, B3 500 (X3 freed:
400: X0 G4 G2), B2 400 + 300 = 700 (G2 freed: 300), B1 300 (G4 freed with it).
Peak 700 + 40 = 740: the 200 B of G4 outlive conv2's backward, as in PyTorch.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import L, make
from snsim.errors import TraceError
from snsim.graph import G, Graph
from snsim.policies import PlanContext, plan
from snsim.schedule import verify
from snsim.sim import simulate
from snsim.trace.io import from_dict, to_dict
from snsim.trace.model import Workspace


def cat2(views=True, extra_consumer=False):
    ws = (Workspace("default", 0, 1.0, 1.0, bwd_bytes=300),)
    layers = [L(0, "data", [], 100),
              L(1, "conv", [0], 100, params=10, fwd=1.0, bwd=1.0, reads=["inputs"]),
              L(2, "conv", [0], 100, params=10, fwd=1.0, bwd=1.0, reads=["inputs"], ws=ws),
              L(3, "act", [2], 100, fwd=1.0, bwd=1.0, reads=["output"]),
              L(4, "concat", [1, 3], 200, fwd=1.0, bwd=1.0),
              L(5, "loss", [4], 4, fwd=1.0, bwd=1.0, reads=["inputs"])]
    if extra_consumer:   # X1 also feeds an add with the concat's output: two contributors
        layers[5] = L(5, "add", [1, 4], 200, fwd=1.0, bwd=1.0)
        layers.append(L(6, "loss", [5], 4, fwd=1.0, bwd=1.0, reads=["inputs"]))
    if views:
        layers[4] = dataclasses.replace(layers[4], extra={"grad_views": [1, 3]})
    return make(layers, "cat2")


def peak(trace):
    g = Graph(trace)
    s = plan("liveness", PlanContext(g))
    verify(g, s)
    return g, simulate(g, s).peak_bytes


def test_own_storage_gradients_peak_at_the_loss_backward():
    g, p = peak(cat2(views=False))
    assert g.grad_view_of == {} and g.size(G(1)) == 100
    assert p == 644


def test_gradient_views_keep_the_concat_gradient_to_the_last_branch():
    g, p = peak(cat2())
    assert g.grad_view_of == {1: 4, 3: 4}
    assert g.size(G(1)) == 0 and g.size(G(3)) == 0 and g.size(G(4)) == 200
    assert G(4) in g.needs(("B", 3)) and G(4) in g.needs(("B", 1))
    assert G(4) not in g.needs(("B", 2))   # B2 needs G2, conv2's own gradient
    assert p == 740
    # the lower bound: B2's own X0 + G2 + 300 B workspace = 500 is the largest step
    # (B5: X4 + G5 + G4 = 404; B1: X0 + G4 = 300, G1 being a 0 B view)
    assert g.lower_bound_bytes == 40 + 500


def test_a_second_contributor_gives_the_gradient_its_own_storage():
    # X1 has two consumers (concat 4 and add 5): autograd sums the two contributions
    # into a new buffer, so G1 is not a view; G3 (act's, concat its only consumer) is
    g = Graph(cat2(extra_consumer=True))
    assert g.grad_view_of == {3: 4}
    assert g.size(G(1)) == 100


def test_grad_views_round_trip_and_are_checked():
    doc = to_dict(cat2())
    assert doc["layers"][4]["grad_views"] == [1, 3]
    assert Graph(from_dict(doc)).grad_view_of == {1: 4, 3: 4}
    doc["layers"][4]["grad_views"] = [2]
    with pytest.raises(TraceError, match="grad_views: layer 2 is not one of its inputs"):
        from_dict(doc)
    doc["layers"][4]["grad_views"] = "1"
    with pytest.raises(TraceError):
        from_dict(doc)


def test_profiler_records_cat_and_add_gradient_views():
    torch = pytest.importorskip("torch")
    from snsim.torchgraph import capture as cap
    from snsim.torchgraph.gradviews import grad_views

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            a, b = self.a(x), self.b(x)
            return torch.cat([a, torch.relu(b)], 1) + torch.cat([b, a], 1).sum(1, keepdim=True)

    for dev in ("cpu", "meta"):
        model = M().to(dev)
        layers = cap.capture(model, torch.zeros(2, 4, device=dev)).layers
        names = [la.name for la in layers]
        a, b, relu = names.index("a"), names.index("b"), names.index("relu")
        cats = [la for la in layers if la.kind == "concat"]
        assert grad_views(cats[0]) == (a, relu) and grad_views(cats[1]) == (b, a)
        add = next(la for la in layers if la.kind == "add")
        # a + b: the gradient itself to the first operand; the broadcast operand's
        # gradient is a sum (its own storage)
        assert grad_views(add) == (add.inputs[0],)
        assert all(grad_views(la) == () for la in layers if la.param_bytes)


def test_concat_whole_step_matches_plain_pytorch():
    pytest.importorskip("torch")
    from snsim.validation.run import Case, validate_case

    for amp in ("off", "bf16"):
        out = validate_case(Case("toymodels:concat", 2, "liveness", repeats=1, warmup=0,
                                 optimizer="adam", amp=amp))
        assert out.max_grad_abs_diff <= 1e-5
        assert abs(out.plain_peak_error) <= 0.001, out.to_dict()   # 1.5% / 7.1% before
        assert out.peak_error == 0.0, out.to_dict()

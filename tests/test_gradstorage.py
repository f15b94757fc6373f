"""Gradient storage (docs/DESIGN.md section 3, "Gradient storage"), worked by hand.

``grad_shares`` says a backward hands an input its own output gradient's
storage (``add``'s pass-through, ``cat``'s slices); the graph then names
storages, and a later contribution is added in place, or summed out of place
into a new buffer where the storage is still shared or only a part of it.
"""

from __future__ import annotations

from dataclasses import replace

from snsim.graph import ADD, COPY, NEW, SHARE, Graph
from tests.conftest import L, liveness_peak, make


def _shares(layer, *ids):
    return replace(layer, extra={"grad_shares": list(ids)})


def _residual(shared: bool):
    # data -> fc1 (10 B params) -> fc2 -> add(fc1, fc2) -> loss; every tensor 100 B
    add = L(3, "add", [1, 2], 100)
    return make([L(0, "data", [], 100), L(1, "fc", [0], 100, params=10, reads=["inputs"]),
                 L(2, "fc", [1], 100, params=10, reads=["inputs"]),
                 _shares(add, 1, 2) if shared else add,
                 L(4, "loss", [3], 4, extra=8)])


def test_add_passes_its_gradient_through_and_the_branch_adds_in_place():
    g = Graph(_residual(True))
    assert g.grad_plan[3] == ((1, SHARE, ("G", 3), None), (2, SHARE, ("G", 3), None))
    assert g.grad_in[2] == g.grad_in[1] == ("G", 3)
    # fc2's backward reads G3 as its own G2 and adds fc1's part into it in place:
    # G2's holder (fc2's own input) is done by then, as autograd's input buffer is
    assert g.grad_plan[2] == ((1, ADD, ("G", 3), ("G", 3)),)
    assert g.allocs(("B", 3)) == () and g.allocs(("B", 2)) == ()
    # B2's level: static 2x20 + X0 + X1 (fc2 reads its input) + G3 = 340, where two
    # buffers G1 and G2 made it 440 (with X0 and X1 kept since B1 reads X0 only:
    # the peak is in the forward otherwise)
    plain = Graph(_residual(False))
    assert plain.allocs(("B", 3)) == (("G", 1), ("G", 2))
    assert liveness_peak(_residual(False)) - liveness_peak(_residual(True)) == 100


def test_a_contribution_while_the_storage_is_still_shared_is_summed_out_of_place():
    # a = fc(x), b = fc(x), c = fc(b), s = a + b, t = s + c, loss(t): after the adds,
    # G_a, G_b, G_c and G_s are all G5's storage; c's backward adds into G_b while
    # G_a (read by a's backward, still to come) holds the same storage, so autograd
    # sums into a new buffer for G_b
    s4 = _shares(L(4, "add", [1, 2], 100), 1, 2)
    t5 = _shares(L(5, "add", [4, 3], 100), 4, 3)
    g = Graph(make([L(0, "data", [], 100), L(1, "fc", [0], 100, params=10, reads=["inputs"]),
                    L(2, "fc", [0], 100, params=10, reads=["inputs"]),
                    L(3, "fc", [2], 100, params=10, reads=["inputs"]), s4, t5,
                    L(6, "loss", [5], 4)]))
    assert [m for _, m, _, _ in g.grad_plan[5]] == [SHARE, SHARE]
    assert [m for _, m, _, _ in g.grad_plan[4]] == [SHARE, SHARE]
    assert g.grad_plan[3] == ((2, COPY, ("G", 2), ("G", 5)),)
    assert g.allocs(("B", 3)) == (("G", 2),)
    assert ("G", 5) in g.needs(("B", 3))
    assert g.grad_in[2] == ("G", 2) and g.grad_in[1] == ("G", 5)


def test_a_slice_of_a_concatenation_is_summed_out_of_place():
    # x -> fc (100 B) -> cat(x1, fc2) (200 B) and a second consumer of x1 before it:
    # G1 is a slice (100 B of G3's 200 B), so the later contribution makes G1 its own
    cat = _shares(L(4, "concat", [1, 3], 200), 1, 3)
    g = Graph(make([L(0, "data", [], 100), L(1, "fc", [0], 100, params=10, reads=["inputs"]),
                    L(2, "fc", [1], 100, params=10, reads=["inputs"]),
                    L(3, "fc", [2], 100, params=10, reads=["inputs"]), cat,
                    L(5, "loss", [4], 4)]))
    assert g.grad_plan[4] == ((1, SHARE, ("G", 4), None), (3, SHARE, ("G", 4), None))
    assert g.grad_plan[2] == ((1, COPY, ("G", 1), ("G", 4)),)
    assert g.size(("G", 4)) == 200 and g.size(("G", 1)) == 100


def test_without_grad_shares_every_gradient_is_its_own_buffer():
    g = Graph(_residual(False))
    assert g.grad_plan[3] == ((1, NEW, ("G", 1), None), (2, NEW, ("G", 2), None))
    assert g.grad_plan[2] == ((1, ADD, ("G", 1), ("G", 1)),)
    assert all(g.grad_in[i] == ("G", i) for i in range(1, 5))


def test_capture_reads_shared_gradients_from_autograd():
    import pytest
    pytest.importorskip("torch")
    from snsim.profile import profiler

    doc = profiler.profile("tests.toymodels:concat", 2, (3, 8, 8), device_model="k40c")
    by_kind = {la["kind"]: la for la in doc["layers"]}
    assert by_kind["concat"]["grad_shares"] == by_kind["concat"]["inputs"]   # slices
    assert "grad_shares" not in by_kind["conv"] and "grad_shares" not in by_kind["act"]
    doc = profiler.profile("tests.families:residual_mlp", None, device_model="k40c")
    adds = [la for la in doc["layers"] if la["kind"] == "add"]
    assert adds and all(la["grad_shares"] == la["inputs"] for la in adds)   # pass-through

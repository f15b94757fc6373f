"""Gradient pieces (docs/DESIGN.md section 3, "Gradient storage"), worked by hand.

``u, v = x.chunk(2)`` read by two layers has one backward node for both
halves: autograd keeps the first half's gradient apart (half the bytes) until
the other layer's backward has made the second, and only then concatenates
them into ``G_x``.  ``grad_pieces`` on each reader says so; layers that read
``x`` whole contribute to ``G_x`` as always, the joined pieces as one more.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from snsim.graph import (ADD, JOIN, JOIN_ADD, JOIN_COPY, NEW, PIECE, PIECE_SHARE, SHARE, Graph,
                         piece, tensor_name)
from snsim.policies import names, plan
from snsim.policies.base import PlanContext
from snsim.policies.liveness import liveness_ops
from snsim.schedule import verify
from snsim.schedule.ledger import effects
from snsim.schedule.ops import Schedule
from snsim.sim import simulate
from tests.conftest import L, liveness_peak, make


def _gated(pieces: bool, loss_reads=()):
    # data 10 -> up (fc, 10 B params) 400 -> chunk: v -> norm 200; u * norm -> mul 200
    # -> loss 4; norm and mul read their inputs, the loss nothing
    norm = L(2, "norm", [1], 200, reads=["inputs"])
    mul = L(3, "other", [1, 2], 200, reads=["inputs"])
    if pieces:
        norm = replace(norm, extra={"grad_pieces": [[1, 200]]})
        mul = replace(mul, extra={"grad_pieces": [[1, 200]]})
    return make([L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"]),
                 norm, mul, L(4, "loss", [3], 4, reads=loss_reads)])


def _levels(trace):
    """Level after each op's allocation (before its frees), per compute step."""
    g = Graph(trace)
    ops = liveness_ops(g)
    level, out = g.trace.static_bytes, {}
    for op, (alloc, ws, free) in zip(ops, effects(g, Schedule("liveness", ops, 1 << 40))):
        level += alloc
        if op.action == "compute":
            out[f"{op.phase}{op.layer}"] = level + ws
        level -= free
    return out


def test_the_first_reader_makes_its_piece_and_the_last_joins_them():
    g = Graph(_gated(True))
    q = piece(3, 1)
    assert tensor_name(q) == "G3.1" and g.size(q) == 200
    # backward order: mul (B3) first, its piece of G1 apart; norm (B2) joins
    assert g.grad_plan[3] == ((1, PIECE, q, None), (2, NEW, ("G", 2), None))
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (q,)),)
    assert g.allocs(("B", 3)) == (q, ("G", 2))
    assert g.allocs(("B", 2)) == (("G", 1),)
    assert q in g.needs(("B", 2)) and ("G", 1) not in g.needs(("B", 3))
    assert q in g.dying[("B", 2)]


def test_levels_by_hand():
    # static 2 x 10 = 20.  Forward: X0 10, X1 400, X2 200, X3 200, X4 4 -> 834;
    # X3 and X4 go after F4 (no backward reads them): 630.
    # B4: + G4 4 + G3 200 = 834; G4 goes: 830.
    # B3 (mul): + its piece of G1 (200) + G2 200 = 1230 (where the whole G1 made
    #   it 1430); G3 and X2 go: 830.
    # B2 (norm): + G1 400 = 1230 (the piece still held); G2, the piece and X1 go: 430.
    # B1: reads G1 and X0: 430.
    got = _levels(_gated(True))
    assert got == {"F0": 30, "F1": 430, "F2": 630, "F3": 830, "F4": 834,
                   "B4": 834, "B3": 1230, "B2": 1230, "B1": 430}
    plain = _levels(_gated(False))
    assert plain["B3"] == 1430 and plain["B2"] == 1030
    assert liveness_peak(_gated(True)) == 1230
    assert liveness_peak(_gated(False)) == 1430
    # lower bound: B3 alone reads G3, X1, X2 and makes its piece and G2: 20 + 1200
    # (B2: G2, X1, the piece, G1: the same); the whole G1 at B3 made it 20 + 1400
    assert Graph(_gated(True)).lower_bound_bytes == 1220
    assert Graph(_gated(False)).lower_bound_bytes == 1420


def test_a_reader_that_does_not_list_its_input_keeps_the_plain_rule():
    t = _gated(True)
    layers = list(t.layers)
    layers[2] = replace(layers[2], extra={})    # norm reads x whole, say
    g = Graph(make(layers))
    assert [m for _, m, _, _ in g.grad_plan[3]] == [NEW, NEW]
    assert liveness_peak(make(layers)) == liveness_peak(_gated(False))


def test_three_readers_two_pieces_wait():
    # data -> fc 300 -> chunk(3): a -> l2, b -> l3, c -> l4; l5 = l2 + l3 + l4 -> loss
    ls = [L(0, "data", [], 10), L(1, "fc", [0], 300, params=10, reads=["inputs"])]
    for i in (2, 3, 4):
        ls.append(replace(L(i, "act", [1], 100, reads=["inputs"]),
                          extra={"grad_pieces": [[1, 100]]}))
    ls += [L(5, "add", [2, 3, 4], 100), L(6, "loss", [5], 4)]
    g = Graph(make(ls))
    assert g.grad_plan[4] == ((1, PIECE, piece(4, 1), None),)
    assert g.grad_plan[3] == ((1, PIECE, piece(3, 1), None),)
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (piece(4, 1), piece(3, 1))),)
    assert g.allocs(("B", 2)) == (("G", 1),)


@pytest.mark.parametrize("budget", [None, "tight"])
def test_every_policy_plans_a_verified_schedule_with_pieces(budget):
    g = Graph(_gated(True, loss_reads=["inputs"]))
    b = None if budget is None else int(1.05 * g.lower_bound_bytes)
    for p in names():
        s = plan(p, PlanContext(g, b))
        verify(g, s)
        r = simulate(g, s, b, record=False)
        if r.feasible:
            assert r.peak_bytes >= g.lower_bound_bytes, p


def _with_whole_reader(first_in_backward: bool):
    # _gated plus tanh(X1) (400 B, reads its output), a whole reader of X1 after
    # the pieces in the forward (first in backward) or before them; both heads
    # meet in a 4 B layer that reads nothing
    def pieces(layer):
        return replace(layer, extra={"grad_pieces": [[1, 200]]})
    if first_in_backward:
        body = [pieces(L(2, "norm", [1], 200, reads=["inputs"])),
                pieces(L(3, "other", [1, 2], 200, reads=["inputs"])),
                L(4, "act", [1], 400, reads=["output"]), L(5, "other", [3, 4], 4)]
    else:
        body = [L(2, "act", [1], 400, reads=["output"]),
                pieces(L(3, "norm", [1], 200, reads=["inputs"])),
                pieces(L(4, "other", [1, 3], 200, reads=["inputs"])),
                L(5, "other", [2, 4], 4)]
    return make([L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"])]
                + body + [L(6, "loss", [5], 4)])


def test_a_whole_reader_first_makes_g_and_the_join_adds_into_it():
    t = _with_whole_reader(True)
    g = Graph(t)
    q = piece(3, 1)
    assert g.grad_plan[4] == ((1, NEW, ("G", 1), None),)
    assert g.grad_plan[3] == ((1, PIECE, q, None), (2, NEW, ("G", 2), None))
    assert g.grad_plan[2] == ((1, JOIN_ADD, ("G", 1), (q, ("G", 1))),)
    assert g.allocs(("B", 2)) == () and {q, ("G", 1)} <= set(g.needs(("B", 2)))
    # static 20.  Forward to 1238 (X0 10, X1 400, X2 200, X3 200, X4 400, X5 4,
    # X6 4); X3 goes after F5, X5 and X6 after F6 (no backward reads them): 1030.
    # B6: + G6 4 + G5 4 = 1038, G6 goes; B5: + G3 200 + G4 400 = 1634, G5 goes;
    # B4 (tanh): + G1 400 = 2030, G4 and X4 go: 1230; B3 (mul): + its piece 200
    # + G2 200 = 1630 (the whole G1 is made already), G3 and X2 go: 1230;
    # B2 (norm): joins into G1 in place: 1230; G2, the piece and X1 go: 430.
    got = _levels(t)
    assert got == {"F0": 30, "F1": 430, "F2": 630, "F3": 830, "F4": 1230, "F5": 1234,
                   "F6": 1038, "B6": 1038, "B5": 1634, "B4": 2030, "B3": 1630,
                   "B2": 1230, "B1": 430}


def test_a_whole_reader_last_adds_into_the_joined_g():
    g = Graph(_with_whole_reader(False))
    q = piece(4, 1)
    assert g.grad_plan[4] == ((1, PIECE, q, None), (3, NEW, ("G", 3), None))
    assert g.grad_plan[3] == ((1, JOIN, ("G", 1), (q,)),)
    assert g.grad_plan[2] == ((1, ADD, ("G", 1), ("G", 1)),)


def test_a_join_into_a_shared_storage_sums_out_of_place():
    # the whole reader is an add that hands X1 its own gradient's storage, which
    # the side branch's gradient shares until its backward runs: the join sums
    # into a new G1, as a plain contribution would (COPY)
    def pieces(layer):
        return replace(layer, extra={"grad_pieces": [[2, 200]]})
    side = L(1, "fc", [0], 400, params=10, reads=["inputs"])
    up = L(2, "fc", [0], 400, params=10, reads=["inputs"])
    layers = [L(0, "data", [], 10), side, up, pieces(L(3, "norm", [2], 200, reads=["inputs"])),
              pieces(L(4, "other", [2, 3], 200, reads=["inputs"])),
              replace(L(5, "add", [2, 1], 400), extra={"grad_shares": [2, 1]}),
              L(6, "other", [4, 5], 4), L(7, "loss", [6], 4)]
    g = Graph(make(layers))
    assert g.grad_plan[5] == ((2, SHARE, ("G", 5), None), (1, SHARE, ("G", 5), None))
    assert g.grad_plan[3] == ((2, JOIN_COPY, ("G", 2), (piece(4, 2), ("G", 5))),)
    assert ("G", 2) in g.allocs(("B", 3)) and ("G", 5) in g.needs(("B", 3))
    for p in names():
        verify(g, plan(p, PlanContext(g, None)))


@pytest.mark.parametrize("first", [True, False])
def test_every_policy_with_a_whole_reader(first):
    g = Graph(_with_whole_reader(first))
    for budget in (None, int(1.05 * g.lower_bound_bytes)):
        for p in names():
            s = plan(p, PlanContext(g, budget))
            verify(g, s)


def test_a_piece_need_is_no_reason_to_remake_its_layer():
    """A gradient piece ``("G<c>", j)`` is a gradient, not layer j's output: a
    plan that drops ``X_j`` recomputes it only where a step reads ``X_j``.
    Here no backward step reads ``X1`` (norm and mul read their outputs), so
    dropping it costs no recomputation, though the join (B2) needs mul's piece
    of ``G1``."""
    from snsim.graph import kind
    from snsim.policies.sequences import recompute_sequence

    t = _gated(True)
    layers = list(t.layers)
    for i in (2, 3):
        layers[i] = replace(layers[i], bwd_reads=frozenset({"output"}))
    g = Graph(replace(t, layers=tuple(layers)))
    assert piece(3, 1) in g.needs(("B", 2)) and kind(piece(3, 1)) == "G"
    assert not any(("X", 1) in g.needs(s) for s in g.route[g.n:])
    keep = [True] * g.n
    keep[1] = False
    seq = recompute_sequence(g, keep, [True] * g.n)
    assert ("R", 1) not in seq
    assert seq == list(g.route)


def _long(layer, j, view, *pieces):
    """``layer`` listing ``[j, bytes, view, piece, bytes, ...]`` (capture note [13])."""
    nb = sum(pieces[1::2])
    return replace(layer, extra={"grad_pieces": [[j, nb, view, *pieces]]})


def _piece_read_twice(last_reads: int = 1):
    # data 10 -> fc 400 -> chunk: v -> norm 200; u * norm -> mul 200; tanh(u) 200;
    # mul + tanh -> add 200 -> loss 4.  Backward: add, tanh, mul, norm.
    # ``last_reads``: the piece norm reads (0: u, which tanh and mul read too)
    return make([L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"]),
                 _long(L(2, "norm", [1], 200, reads=["inputs"]), 1, 0, last_reads, 200),
                 _long(L(3, "other", [1, 2], 200, reads=["inputs"]), 1, 0, 0, 200),
                 _long(L(4, "act", [1], 200, reads=["output"]), 1, 0, 0, 200),
                 L(5, "add", [3, 4], 200), L(6, "loss", [5], 4)])


def test_a_piece_read_twice_is_made_by_the_first_reader_and_added_to_by_the_next():
    g = Graph(_piece_read_twice())
    q = piece(4, 1)
    assert g.grad_plan[4] == ((1, PIECE, q, None),)
    # mul makes nothing new: autograd's buffer adds its u gradient into tanh's
    assert g.grad_plan[3] == ((1, PIECE, None, (q,)), (2, NEW, ("G", 2), None))
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (q,)),)
    assert q in g.needs(("B", 3)) and q not in g.allocs(("B", 3))
    assert q in g.written[("B", 3)]
    # levels: static 20 + X0 10; after F5 X1 400, X2 to X5 200 each: 1230.
    # B5 (add): G3 and G4 200 each, G5 and X3, X5 gone: 1430 -> 1030.
    # B4 (tanh, reads X4): + its piece of G1 (200; the whole G1, 400, under the
    # plain rule); X4 and G4 go.  B3 (mul): + G2; it adds into the piece.  B2
    # (norm): + G1, the piece still held (under the plain rule it was added into G1).
    got, plain = _levels(_piece_read_twice()), _levels(_plain(_piece_read_twice()))
    assert (got["B4"], got["B3"], got["B2"]) == (1430, 1230, 1230)
    assert (plain["B4"], plain["B3"], plain["B2"]) == (1630, 1430, 1030)
    assert liveness_peak(_piece_read_twice()) == 1430


def _plain(trace):
    return make([replace(layer, extra={}) for layer in trace.layers])


def test_a_last_reader_of_a_piece_read_before_joins_it_as_any():
    # all three read u: norm's own gradient of u is added into tanh's piece inside
    # its step (a transient a measured trace carries), then joined
    g = Graph(_piece_read_twice(last_reads=0))
    q = piece(4, 1)
    assert g.grad_plan[4] == ((1, PIECE, q, None),)
    assert g.grad_plan[3][0] == (1, PIECE, None, (q,))
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (q,)),)


def _shared_then_read(last_reads: int, residual: bool = False):
    # fc 400 -> chunk: norm reads piece ``last_reads``, tanh the other, the add
    # reads u (0) and hands it, norm and tanh its own gradient's storage; with
    # ``residual`` the add's output goes through add2 = stem + add, whose
    # gradient storage becomes the add's and the stem's (read last of all).
    # Backward: (add2,) add, tanh, norm (last).
    stem = [L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"])]
    if residual:
        stem = [L(0, "data", [], 10), L(1, "fc", [0], 200, params=10, reads=["inputs"]),
                L(2, "fc", [1], 400, params=10, reads=["inputs"])]
    j = len(stem) - 1
    ls = stem + [
        _long(L(j + 1, "norm", [j], 200, reads=["inputs"]), j, 0, last_reads, 200),
        _long(L(j + 2, "act", [j], 200, reads=["output"]), j, 0, 1 - last_reads, 200),
        replace(L(j + 3, "add", [j, j + 1, j + 2], 200),
                extra={"grad_pieces": [[j, 200, 0, 0, 200]],
                       "grad_shares": [j, j + 1, j + 2]})]
    if residual:
        ls.append(replace(L(j + 4, "add", [1, j + 3], 200), extra={"grad_shares": [1, j + 3]}))
    return make(ls + [L(len(ls), "loss", [len(ls) - 1], 4)])


def test_a_middle_reader_of_a_shared_piece_keeps_the_plain_rule():
    # tanh reads u, which the add's backward handed its own gradient's storage
    assert not Graph(_shared_then_read(1)).piece_groups


def test_a_last_reader_of_a_shared_piece_adds_into_it_where_nothing_else_is_in_it():
    g = Graph(_shared_then_read(0))
    assert g.grad_plan[4][0] == (1, PIECE_SHARE, ("G", 4), None)
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (("G", 4), piece(3, 1))),)
    assert not g.piece_sums_out_of_place   # G4's storage holds only the piece by then


def test_a_last_reader_of_a_shared_piece_sums_apart_where_a_gradient_is_still_in_it():
    # the stem's G1 is add2's storage too, read at B1, after the join at B3
    g = Graph(_shared_then_read(0, residual=True))
    assert g.grad_in[5] == ("G", 6) and g.grad_plan[5][0] == (2, PIECE_SHARE, ("G", 6), None)
    assert g.grad_plan[3] == ((2, JOIN, ("G", 2), (("G", 6), piece(4, 2))),)
    assert g.piece_sums_out_of_place == {(3, ("G", 6))}


def test_two_views_of_one_input_join_apart():
    # fc 400 -> chunk by features: v -> norm, u * norm -> mul; chunk by tokens:
    # q -> tanh, p * tanh -> mul2; mul + mul2 -> add -> loss.
    ls = [L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"]),
          _long(L(2, "norm", [1], 200, reads=["inputs"]), 1, 0, 1, 200),
          _long(L(3, "other", [1, 2], 200, reads=["inputs"]), 1, 0, 0, 200),
          _long(L(4, "act", [1], 200, reads=["output"]), 1, 1, 1, 200),
          _long(L(5, "other", [1, 4], 200, reads=["inputs"]), 1, 1, 0, 200),
          L(6, "add", [3, 5], 200), L(7, "loss", [6], 4)]
    g = Graph(make(ls))
    assert g.piece_groups == {1: ((3, 2), (5, 4))}   # a group per view
    assert g.grad_plan[5][0] == (1, PIECE, piece(5, 1), None)
    assert g.grad_plan[4] == ((1, JOIN, ("G", 1), (piece(5, 1),)),)
    assert g.grad_plan[3][0] == (1, PIECE, piece(3, 1), None)
    assert g.grad_plan[2] == ((1, JOIN_ADD, ("G", 1), (piece(3, 1), ("G", 1))),)


def test_a_piece_in_the_reader_s_own_gradient_storage_waits_there():
    # fc 400 -> chunk: v -> relu 200; u + relu -> add 200 (grad_shares: both) -> loss.
    # The add hands u's piece G5's storage... its own, which relu shares too: no
    # piece tensor; relu's join needs that storage, which lives until then.
    ls = [L(0, "data", [], 10), L(1, "fc", [0], 400, params=10, reads=["inputs"]),
          replace(L(2, "act", [1], 200, reads=["output"]), extra={"grad_pieces": [[1, 200]]}),
          replace(L(3, "add", [1, 2], 200),
                  extra={"grad_pieces": [[1, 200]], "grad_shares": [1, 2]}),
          L(4, "loss", [3], 4)]
    g = Graph(make(ls))
    assert g.grad_plan[3] == ((1, PIECE_SHARE, ("G", 3), None), (2, SHARE, ("G", 3), None))
    assert g.grad_plan[2] == ((1, JOIN, ("G", 1), (("G", 3),)),)
    assert g.allocs(("B", 3)) == () and ("G", 3) in g.needs(("B", 2))
    # static 20 + X0 10; B4: G4 4 + X1 400 = 434, G4 goes.  B3 allocates nothing:
    # 430 (the plain rule made the whole G1 there: 830).  B2 reads X2 200 and G3
    # 200 and makes G1 400: 830 under both.
    plain = [replace(la, extra={k: v for k, v in la.extra.items() if k != "grad_pieces"})
             for la in ls]
    plain[3] = replace(plain[3], extra={"grad_shares": [2]})
    got, was = _levels(make(ls)), _levels(make(plain))
    assert (got["B3"], got["B2"]) == (430, 830) and (was["B3"], was["B2"]) == (830, 830)


def test_a_shared_piece_that_is_not_alone_keeps_the_plain_rule():
    # as above, but the add reads both halves of a three-way chunk (400 of 600 B)
    ls = [L(0, "data", [], 10), L(1, "fc", [0], 600, params=10, reads=["inputs"]),
          replace(L(2, "act", [1], 200, reads=["output"]),
                  extra={"grad_pieces": [[1, 200, 0, 2, 200]]}),
          replace(L(3, "add", [1, 2], 200),
                  extra={"grad_pieces": [[1, 400, 0, 0, 200, 1, 200]], "grad_shares": [1, 2]}),
          L(4, "loss", [3], 4)]
    g = Graph(make(ls))
    assert not g.piece_groups
    # and grad_shares does not make G1 the add's storage: its pieces are not G1
    assert g.grad_plan[3][0] == (1, NEW, ("G", 1), None)


def test_a_reader_of_pieces_and_the_whole_input_contributes_to_both():
    # _gated, but the mul (u * norm(v), first in backward) reads x whole too
    # (grad_whole): its piece waits apart, and its whole contribution makes G1;
    # norm's join adds the pieces into it
    t = _gated(True)
    layers = list(t.layers)
    layers[3] = replace(layers[3], extra={"grad_pieces": [[1, 200]], "grad_whole": [1]})
    g = Graph(make(layers))
    q = piece(3, 1)
    assert g.grad_plan[3] == ((1, PIECE, q, None), (1, NEW, ("G", 1), None),
                              (2, NEW, ("G", 2), None))
    assert g.grad_plan[2] == ((1, JOIN_ADD, ("G", 1), (q, ("G", 1))),)
    assert g.allocs(("B", 3)) == (q, ("G", 1), ("G", 2))

"""The static policies read the budget when one is given (issue 15, "found on
the way": ``vdnn-*`` and ``sqrt-n`` ignored it and stayed 2-29% slow at 3x the
lower bound).  Chain A is the hand-worked chain of tests/test_policies.py
(liveness peak 610 at B4; lower bound 380)."""

from __future__ import annotations

import math

import pytest

from snsim.policies import replay
from snsim.policies.base import PlanContext
from snsim.policies.sqrt_n import default_stride, sqrt_n_keep
from snsim.policies.recompute import plan_recompute

from test_policies import COMPUTE_A, L, SLOW, chain_a, make, moves, run


@pytest.mark.parametrize("policy", ["vdnn-all", "vdnn-conv", "sqrt-n"])
def test_generous_budget_moves_nothing(policy):
    g = chain_a(SLOW)
    s, r = run(g, policy, 610)          # liveness fits exactly
    assert moves(s) == [] and s.stats["recomputed_layers"] == 0
    assert r.feasible and r.iteration_ms == pytest.approx(COMPUTE_A) and r.stall_ms == 0
    s0, r0 = run(g, policy)             # no budget: the static plan, which moves or recomputes
    assert moves(s0) != [] or s0.stats["recomputed_layers"] > 0


def test_vdnn_conv_offloads_only_what_the_budget_needs():
    g = chain_a()
    # 609: liveness (610 at B4) does not fit; offloading X0 alone (10 bytes) does.
    s, r = run(g, "vdnn-conv", 609)
    assert moves(s) == ["offload X0", "free X0", "prefetch X0", "wait X0"]
    assert r.feasible and r.peak_bytes == 600   # liveness's 610 less X0's 10 bytes
    assert s.stats["offloaded_tensors"] == 1 and s.stats["movable_tensors"] == 2
    # 600 is the least any vdnn-conv plan reaches (X2 is read by B3, after B4).
    s, r = run(g, "vdnn-conv", 600)
    assert s.stats["offloaded_tensors"] == 1 and r.feasible and r.peak_bytes == 600
    # Below what the full plan reaches: the full plan, and the simulator's shortfall.
    s, r = run(g, "vdnn-conv", 599)
    assert s.stats["offloaded_tensors"] == 2 and not r.feasible


def deep_chain(k=9):
    """data, then k (conv, act with a 100-byte saved extra) pairs, then the loss."""
    layers = [L(0, "data", [], 10)]
    for j in range(k):
        c, a = 1 + 2 * j, 2 + 2 * j
        layers.append(L(c, "conv", [c - 1], 10, params=1, fwd=1.0, bwd=2.0, reads=["inputs"]))
        layers.append(L(a, "act", [c], 10, fwd=0.5, bwd=0.5, reads=["output"], extra=100))
    layers.append(L(2 * k + 1, "loss", [2 * k], 4, fwd=0.1, bwd=0.1, reads=["inputs"]))
    return make(layers)


def test_sqrt_n_takes_the_smallest_stride_that_fits():
    g = deep_chain()
    live = run(g, "liveness")[1]
    default = run(g, "sqrt-n")[1]
    assert default_stride(g) == 3
    for budget in range(g.lower_bound_bytes, live.peak_bytes + 2, 7):
        s, r = run(g, "sqrt-n", budget)
        fit = [st for st in range(1, default_stride(g) + 1)
               if math.isfinite(replay.estimate_ms(
                   g, plan_recompute("x", PlanContext(g, budget), sqrt_n_keep(g, st),
                                     "speed").ops, budget))]
        if budget >= live.peak_bytes:
            assert s.stats["stride"] == 0 and r.iteration_ms == pytest.approx(live.iteration_ms)
        elif fit:
            assert s.stats["stride"] == min(fit) and r.feasible, budget
            assert r.iteration_ms <= default.iteration_ms + 1e-9
        else:
            assert s.stats["stride"] == default_stride(g)

"""The shared polish (snsim/policies/polish.py): ``optimal`` polishes within a
time, ``superneurons`` refines within a count of plans estimated."""

from __future__ import annotations

import math
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


# --- moves on swaps (snsim/policies/retime.py) -------------------------------
# A hand-made chain (tests/conftest.py's device: 100 bytes take 1 ms on either
# engine): data X0 100 -> conv X1 200 -> conv X2 200 -> conv X3 100 whose
# forward holds a 300-byte workspace -> loss; 60 bytes of parameters and their
# gradients.  X1 is swapped: offloaded after F1, freed after F2, prefetched
# right before its wait, before B2.

from snsim.schedule import ledger  # noqa: E402
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait  # noqa: E402
from snsim.policies import retime  # noqa: E402
from snsim.sim import simulate  # noqa: E402
from snsim.trace.model import Workspace  # noqa: E402
from conftest import L, make  # noqa: E402


def swap_chain(f1_ms: float, reads1=("inputs",)):
    return Graph(make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 200, params=10, fwd=f1_ms, bwd=4.0, reads=list(reads1)),
        L(2, "conv", [1], 200, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(3, "conv", [2], 100, params=10, fwd=1.0, bwd=2.0, reads=["inputs"],
          ws=[Workspace("w", 300, 1.0, 2.0, bwd_bytes=0)]),
        L(4, "loss", [3], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "swap-chain"))


def X(j):
    return ("X", j)


def G(j):
    return ("G", j)


def swap_plan():
    """X1 swapped; the prefetch (index 14) right before its wait."""
    return [Compute("F", 0), Compute("F", 1), Offload(X(1)), Compute("F", 2), Free(X(1)),
            Compute("F", 3), Compute("F", 4), Free(X(4)), Compute("B", 4), Free(X(3)),
            Free(G(4)), Compute("B", 3), Free(X(2)), Free(G(3)), Prefetch(X(1)), Wait(X(1)),
            Compute("B", 2), Free(X(1)), Free(G(2)), Compute("B", 1), Free(X(0)), Free(G(1))]


def checked(g, ops, cap):
    """The plan's estimate, after the verifier's walk and with the simulator agreeing."""
    ledger.walk(g, replay.with_optimizer_step(g, ops))
    assert replay.planned_peak(g, ops, cap)[1] is None
    ms = replay.estimate_ms(g, ops, cap)
    got = simulate(g, Schedule("t", list(ops), cap), cap, record=False)
    assert got.feasible and abs(got.iteration_ms - ms) < 1e-9
    return ms


def test_a_stalled_prefetch_is_issued_sooner():
    """Budget 900.  Compute 16 ms (F1 5); the free of X1 waits for its offload
    (done at 7) before F3's workspace fits: 1 ms; the prefetch issued at 11
    after B3 ends at 13: 2 ms; 19 ms.  Issued before B3 (at 9) it is back at
    11: 17 ms; the level at B3 is then 860.  Keeping X1 instead holds it
    through F3 (960: over); recomputing it takes 5 ms (and no offload: 16 +
    5 = 21)."""
    g, cap = swap_chain(5.0), 900
    ops = swap_plan()
    assert checked(g, ops, cap) == 19.0
    assert replay.planned_peak(g, retime.keep(g, ops, 14), cap)[1] is not None
    assert checked(g, retime.recompute(g, ops, 14), cap) == 21.0
    sooner = retime.earlier(ops, 14, 1)
    assert sooner[11] == Prefetch(X(1)) and sooner[12] == Compute("B", 3)
    assert checked(g, sooner, cap) == 17.0
    ms, got, changed = P.greedy(g, cap, ops, 19.0, math.inf, lambda o, i: -i, swaps=True)
    assert (ms, changed) == (17.0, 1) and checked(g, got, cap) == 17.0
    assert got.index(Prefetch(X(1))) < got.index(Compute("B", 3))


def test_a_swap_is_recomputed_instead():
    """As above with F1 0.5 ms: compute 11.5, 14.5 with the stalls; issued
    sooner 12.5; recomputed (R1 from X0, resident for B1) where the wait was,
    the offload dropped (nothing else reads the host copy, and F3 no longer
    waits for its free): 11.5 + 0.5 = 12.0, the faster."""
    g, cap = swap_chain(0.5), 900
    ops = swap_plan()
    assert checked(g, ops, cap) == 14.5
    assert checked(g, retime.earlier(ops, 14, 1), cap) == 12.5
    new = retime.recompute(g, ops, 14)
    assert Offload(X(1)) not in new and Prefetch(X(1)) not in new and Wait(X(1)) not in new
    assert new[new.index(Compute("B", 2)) - 1] == Compute("R", 1)
    assert checked(g, new, cap) == 12.0
    ms, got, changed = P.greedy(g, cap, ops, 14.5, math.inf, P.costliest_first(g), swaps=True)
    assert (ms, changed) == (12.0, 1) and got == new


def test_a_recomputation_whose_input_does_not_fit_is_rejected():
    """B1 reads X1, not X0: X0 is freed after F1.  Recomputing X1 keeps X0 to
    R1 (its free moved after it): 760 bytes at B3's level, over a 700
    budget; so is the prefetch issued sooner (760) and X1 kept (860).  The
    plan (660 bytes; 11.5 + 1 + 2 = 14.5 ms, the stalls as above) is returned
    unchanged.  Under 760 bytes the recomputation fits: 11.5 + 0.5 = 12.0."""
    g = swap_chain(0.5, reads1=("output",))
    ops = [Compute("F", 0), Compute("F", 1), Free(X(0)), Offload(X(1)), Compute("F", 2),
           Free(X(1)), Compute("F", 3), Compute("F", 4), Free(X(4)), Compute("B", 4),
           Free(X(3)), Free(G(4)), Compute("B", 3), Free(X(2)), Free(G(3)), Prefetch(X(1)),
           Wait(X(1)), Compute("B", 2), Free(G(2)), Compute("B", 1), Free(X(1)), Free(G(1))]
    assert checked(g, ops, 700) == 14.5
    new = retime.recompute(g, ops, 15)
    assert Free(X(0)) in new and new.index(Free(X(0))) == new.index(Compute("R", 1)) + 1
    ledger.walk(g, replay.with_optimizer_step(g, new))
    peak, over = replay.planned_peak(g, new, 700)
    assert peak == 760 and over is not None
    assert checked(g, new, 760) == 12.0
    for order in (lambda o, i: -i, P.costliest_first(g)):
        assert P.greedy(g, 700, ops, 14.5, math.inf, order, swaps=True) == (14.5, ops, 0)


def test_polish_on_swaps_is_never_slower_and_runs():
    """A small synthetic ResNet under the swapping planners at tight budgets:
    the polished plan passes the verifier, fits, and the simulator times it
    as estimated, no slower than the plan it started from (faster where
    swaps stall); superneurons' own plan already has its swaps refined."""
    from snsim import synth
    from snsim.policies import plan
    g = Graph(synth.resnet(blocks=(1, 1), batch=8, image=64))
    faster = 0
    for name in ("utp", "vdnn-all", "superneurons"):
        for f in (1.05, 1.25, 1.5):
            ctx = PlanContext(g, int(f * g.lower_bound_bytes))
            cap = ctx.capacity_bytes
            s = plan(name, ctx)
            ops = list(s.ops)
            if s.infeasible_reason or replay.planned_peak(g, ops, cap)[1] is not None:
                continue   # not a plan the polish starts from
            ms = checked(g, ops, cap)
            got, new, changed = P.polish(g, cap, ops, ms, 30.0)
            assert got <= ms and abs(checked(g, new, cap) - got) < 1e-9
            assert (changed > 0) == (got < ms)
            faster += got < ms - 1e-9
    assert faster >= 3


def test_a_swap_is_recomputed_with_its_missing_input():
    """data X0 -> X1 100 -> X2 200 -> X3 100 (a 300-byte forward workspace)
    -> loss (a 400-byte backward workspace); X1 and X2 swapped, X1 freed
    after F2.  Recomputing X2 alone must keep X1 from its free through F3
    (864 bytes, over 764) and keeping X2 holds it through B4 (964); the
    chain move remakes X1 from the resident input, then X2, and frees X1
    after R2: 764 bytes, the offload of X2 dropped, 10.0 -> 8.5 ms."""
    g = Graph(make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 100, params=10, fwd=0.5, bwd=1.0, reads=["inputs"]),
        L(2, "conv", [1], 200, params=10, fwd=0.5, bwd=1.0, reads=["inputs"]),
        L(3, "conv", [2], 100, params=10, fwd=1.0, bwd=1.0, reads=["inputs"],
          ws=[Workspace("w", 300, 1.0, 2.0, bwd_bytes=0)]),
        L(4, "loss", [3], 4, fwd=0.5, bwd=0.5, reads=["inputs"],
          ws=[Workspace("w", 0, 0.5, 0.5, bwd_bytes=400)]),
    ], "chain-swap"))
    F, B, cap = (lambda j: Compute("F", j)), (lambda j: Compute("B", j)), 764
    ops = [F(0), F(1), Offload(X(1)), F(2), Offload(X(2)), Free(X(1)), F(3), Free(X(2)), F(4),
           Free(X(4)), B(4), Free(X(3)), Free(G(4)), Prefetch(X(2)), Wait(X(2)), B(3),
           Free(X(2)), Free(G(3)), Prefetch(X(1)), Wait(X(1)), B(2), Free(X(1)), Free(G(2)),
           B(1), Free(X(0)), Free(G(1))]
    assert checked(g, ops, cap) == 10.0
    p = ops.index(Prefetch(X(2)))
    assert replay.planned_peak(g, retime.recompute(g, ops, p), cap)[1] is not None
    assert replay.planned_peak(g, retime.keep(g, ops, p), cap)[1] is not None
    new = retime.recompute_chain(g, ops, p)
    b3 = new.index(B(3))
    assert new[b3 - 3:b3] == [Compute("R", 1), Compute("R", 2), Free(X(1))]
    assert Offload(X(2)) not in new and Prefetch(X(2)) not in new
    assert checked(g, new, cap) == 8.5
    assert retime.recompute_chain(g, ops, ops.index(Prefetch(X(1)))) is None   # X0 is there
    ms, got, changed = P.greedy(g, cap, ops, 10.0, math.inf, P.costliest_first(g), swaps=True)
    assert ms < 8.5 + 1e-9 and Compute("R", 1) in got and checked(g, got, cap) == ms

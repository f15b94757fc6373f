"""Exact peaks and times of ``none`` and ``liveness`` on hand-computed cases.

Levels are worked out in the comments: static = 2 x params, then each step's
level = resident + what it allocates (+ workspace), before its frees.
"""

from __future__ import annotations

from snsim.graph import G, Graph, S, X
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.schedule import verify
from snsim.sim import simulate


def run(trace, policy, budget=None):
    g = Graph(trace)
    s = plan(policy, PlanContext(g, budget))
    verify(g, s)
    return g, simulate(g, s, budget)


def test_chain4_graph(chain4):
    g = Graph(chain4)
    assert g.requires_grad == [False, True, True, True]
    assert g.route == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("B", 1)]
    assert g.needs(("B", 3)) == (X(2),)
    assert g.allocs(("B", 3)) == (G(3), G(2))
    assert g.needs(("B", 2)) == (G(2), X(2))      # relu reads its output, not its input
    assert g.needs(("B", 1)) == (G(1), X(0))      # data needs no gradient
    assert g.allocs(("B", 1)) == ()
    # largest step is B2: G2 + X2 + G1 = 600, plus static 20
    assert g.lower_bound_bytes == 620


def test_chain4_none(chain4):
    _, r = run(chain4, "none")
    # 20 static + X 100+200+200+4 + G 4+200+200
    assert r.peak_bytes == 928
    assert r.iteration_ms == r.compute_ms == 9.0
    assert r.stall_ms == 0 and r.recompute_ms == 0


def test_chain4_liveness(chain4):
    _, r = run(chain4, "liveness")
    # F0 120, F1 320, F2 520 (then X1 freed: 320), F3 324 -> 320,
    # B3 524 -> 520, B2 720 (then X2, G2 freed: 320), B1 320
    assert r.peak_bytes == 720
    levels = [(p.what, p.level_bytes) for p in r.timeline]
    assert ("F2", 520) in levels and ("free X1", 320) in levels and ("B2", 720) in levels
    assert levels[-1][1] == 20          # only statics remain
    assert r.iteration_ms == 9.0
    assert r.samples_per_s == 4 / 0.009


def test_forkjoin_gradient_accumulation(forkjoin):
    g = Graph(forkjoin)
    assert g.grad_owner[1] == 3                    # B3 runs first and allocates G1
    assert G(1) in g.allocs(("B", 3)) and G(1) in g.needs(("B", 2))
    assert g.lower_bound_bytes == 32 + 300
    _, none = run(forkjoin, "none")
    assert none.peak_bytes == 32 + 504 + 4 + 400
    _, live = run(forkjoin, "liveness")
    # B4 allocates G2 and G3 over X0, X1, X3, G4: 32 + 300 + 300
    assert live.peak_bytes == 632
    assert live.iteration_ms == 3.0 + 5.0


def test_saved_extra(extras):
    g = Graph(extras)
    assert g.allocs(("F", 1)) == (X(1), S(1))
    assert S(2) in g.needs(("B", 2)) and X(1) not in g.needs(("B", 2))
    _, none = run(extras, "none")
    assert none.peak_bytes == 8 + 100 + 110 + 150 + 4 + 4 + 100 + 100
    _, live = run(extras, "liveness")
    # B3: X0 S1 X2 S2 (260) + static 8 + G3 + G2 (104) = 372
    assert live.peak_bytes == 372


def test_workspace_counts_only_during_its_step(with_workspace):
    g = Graph(with_workspace)
    assert g.workspace_bytes(("F", 1)) == 0 and g.workspace_bytes(("B", 1), 1) == 80
    assert g.step_ms(("F", 1), 1) == 1.0 and g.step_ms(("F", 1)) == 3.0
    assert g.lower_bound_bytes == 10 + 100 + 4 + 100        # B2: X1 + G2 + G1
    from snsim.schedule.ops import Compute, Free, Schedule
    ops = [Compute("F", 0), Compute("F", 1, algo=1), Compute("F", 2), Free(X(2)),
           Compute("B", 2), Free(G(2)), Compute("B", 1, algo=1)]
    s = Schedule("hand", ops)
    verify(g, s)
    r = simulate(g, s)
    # F1 with the fast algorithm: 10 + 100 + 100 + 60 workspace
    assert ("F1", 270) in [(p.what, p.level_bytes) for p in r.timeline]
    # B1: X0 X1 G1 (G2 freed) + 80 workspace
    assert r.peak_bytes == 10 + 300 + 80
    assert r.compute_ms == 0 + 1.0 + 0.5 + 0.5 + 2.0


def test_dead_end_branch_has_no_backward():
    from conftest import L, make
    t = make([L(0, "data", [], 100), L(1, "conv", [0], 100, params=4, fwd=1, bwd=1,
                                         reads=["inputs"]),
              L(2, "act", [1], 50, fwd=1, bwd=1, reads=["output"]),   # dead end
              L(3, "loss", [1], 4, fwd=1, bwd=1, reads=["inputs"])])
    g = Graph(t)
    assert g.requires_grad == [False, True, False, True]
    assert ("B", 2) not in g.route
    _, live = run(t, "liveness")
    # X2 is freed right after F2 makes it
    assert ("free X2", 208) in [(p.what, p.level_bytes) for p in live.timeline]


def test_measure_peak_collects_garbage_before_its_window():
    """A tensor from an earlier window, garbage in a reference cycle, must not
    be freed by a GC pass inside the next window (the peak read low)."""
    import gc

    import torch

    from snsim.execute.memory import measure_peak

    cpu = torch.device("cpu")
    holder = {}

    def make():
        cycle = [torch.ones(250_000)]   # 1 MB, allocated while the profiler tracks it
        cycle.append(cycle)
        holder["x"] = cycle

    enabled = gc.isenabled()
    gc.disable()   # only the collections below
    try:
        measure_peak(make, cpu, 0)
        del holder["x"]   # unreachable now, but not freed: a cycle

        def step():
            gc.collect()   # a GC pass inside the window
            t = torch.ones(1000)
            del t

        assert measure_peak(step, cpu, 0).peak_bytes == 4000
    finally:
        if enabled:
            gc.enable()

"""vDNN's budget bisection asks "does the plan moving the first k tensors fit?" many
times; ``vdnn.fit_test`` answers without building each plan.  It must answer as
walking the plan does (``replay.fits``), for every k, on every kind of graph."""

from __future__ import annotations

import pathlib

import pytest

from conftest import L, make
from snsim import synth
from snsim.graph import Graph
from snsim.inputs import load_trace
from snsim.policies import replay
from snsim.policies.vdnn import fit_test, movable, vdnn_ops
from snsim.trace.model import Workspace
from snsim.training import override

ROOT = pathlib.Path(__file__).parent.parent


def _graphs():
    yield "resnet", Graph(synth.resnet((2, 2, 2, 2), batch=4, image=64))
    yield "inception", Graph(synth.inception_net(batch=4))
    yield "chain", Graph(synth.chain(40))
    for seed in range(6):
        yield f"random{seed}", Graph(synth.random_dag(seed, n=30))
    yield "k40c_resnet50", Graph(load_trace(str(ROOT / "traces" / "k40c_resnet50_b32.json")))
    yield "cpu_resnet18", Graph(load_trace(str(ROOT / "traces" / "cpu_resnet18_b8_64.json")))
    # an optimizer step with temporaries at the end, gradients born in backward
    # a backward step that hands its dying reads to autograd (bwd_released)
    yield "handover4", Graph(make([
        L(0, "data", [], 100),
        L(1, "fc", [0], 300, params=10, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(2, "attention", [1], 60, fwd=1.0, bwd=2.0, reads=["inputs", "output"], extra=20,
          ws=[Workspace("measured", 0, 1.0, 2.0, bwd_bytes=250, bwd_released=170)]),
        L(3, "loss", [2], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "handover4"))
    syn = synth.resnet((2, 2, 2, 2), batch=4, image=64)
    yield "adam", Graph(syn.with_training(override(syn.training, "adam", "set-to-none", False)))


@pytest.mark.parametrize("name,graph", list(_graphs()), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("conv_only", [False, True])
def test_fit_test_equals_walking_each_plan(name, graph, conv_only):
    total = len(movable(graph, conv_only))
    lb = graph.lower_bound_bytes
    full = replay.planned_peak(graph, vdnn_ops(graph, conv_only, 0)[0])[0]
    agree = both = 0
    for cap in sorted({lb, int(1.05 * lb), int(1.3 * lb), (lb + full) // 2, full - 1, full}):
        fits = fit_test(graph, conv_only, cap)
        # the shortcut is taken where it applies (where a step hands over, it walks each plan)
        assert (fits.__name__ == "exact") == (name == "handover4"), name
        ks = range(total + 1) if total <= 120 else sorted({*range(0, total + 1, 7), total})
        answers = []
        for k in ks:
            want = replay.fits(graph, vdnn_ops(graph, conv_only, k)[0], cap)
            assert fits(k) == want, (name, cap, k)
            answers.append(want)
        agree += 1
        both += len(set(answers)) == 2
    assert agree
    if total > 3 and not conv_only and name in ("resnet", "k40c_resnet50"):
        assert both, f"{name}: no budget where some k fit and others did not (test too weak)"


@pytest.mark.parametrize("name,graph", list(_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_sqrt_n_forward_floor_is_a_floor(name, graph):
    """sqrt-n's scan skips a stride whose forward floor is over the budget: the floor
    must be at most the planned level of that plan's last forward step."""
    from snsim.policies import sequences
    from snsim.policies.sqrt_n import default_stride, forward_floor, sqrt_n_keep
    from snsim.schedule import ledger

    every = [True] * graph.n
    for st in range(1, default_stride(graph) + 2):
        keep = sqrt_n_keep(graph, st)
        floor = forward_floor(graph, keep)
        if floor is None:
            continue
        ops = sequences.liveness_seq(graph, sequences.recompute_sequence(graph, keep, every))
        level = graph.trace.static_bytes
        for op, (nb, ws, freed) in zip(ops, ledger.iter_effects(graph, ops)):
            level += nb - freed
            if getattr(op, "step", None) == ("F", graph.n - 1):
                assert floor <= level + ws, (name, st)
                break
        else:
            raise AssertionError("no last forward step")

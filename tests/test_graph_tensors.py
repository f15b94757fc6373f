"""The graph hands out one tuple object per tensor (its key in ``sizes``): the
planners', verifier's and simulator's set and dict lookups then match it by
identity before comparing tuples."""

from __future__ import annotations

from pathlib import Path

import pytest

from snsim import synth
from snsim.graph import Graph
from snsim.inputs import load_trace

ROOT = Path(__file__).resolve().parent.parent


def _graphs():
    yield "resnet", Graph(synth.resnet((1, 1, 2, 1), batch=4, image=32))
    yield "inception", Graph(synth.inception_net(batch=4, image=32, modules=2))
    for seed in range(3):
        yield f"dag{seed}", Graph(synth.random_dag(seed, 14))
    # op-log traces: multi-result layers, views, in-place layers
    yield "gpt", Graph(load_trace(str(ROOT / "traces" / "cpu_gpt_small_b4.json")))
    yield "resnet18", Graph(load_trace(str(ROOT / "traces" / "cpu_resnet18_b8_64.json")))


@pytest.mark.parametrize("name,g", list(_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_one_object_per_tensor(name, g):
    canon = {t: t for t in g.sizes}
    seen = 0
    for m in (g.needs_map, g.allocs_map):
        for step, ts in m.items():
            for t in ts:
                assert canon[t] is t, (name, step, t)
                seen += 1
    for t in g.grad_in:
        assert t is None or canon[t] is t, (name, t)
    for plan in g.grad_plan.values():
        for _, _, store, old in plan:
            assert canon[store] is store and (old is None or canon[old] is old), (name, plan)
    for i, t in g.in_place_of.items():
        assert canon[t] is t, (name, i, t)
    for ts in g.results_of.values():
        assert all(canon[t] is t for t in ts), name
    assert seen > 0

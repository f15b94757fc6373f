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


def _handover_and_in_place():
    from test_handover import _trace
    from test_inplace import _net

    yield "handover4", Graph(_trace())
    yield "in-place", Graph(_net(True))
    yield "gpt", Graph(load_trace(str(ROOT / "traces" / "cpu_gpt_small_b4.json")))
    yield "resnet18", Graph(load_trace(str(ROOT / "traces" / "cpu_resnet18_b8_64.json")))
    yield "resnet50", Graph(load_trace(str(ROOT / "traces" / "k40c_resnet50_b32.json")))


@pytest.mark.parametrize("name,g", list(_handover_and_in_place()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_plain_workspace_table_is_the_ledgers_workspace(name, g):
    """The walk reads a step's workspace from ``Graph.plain_workspace`` where it is
    plain; every compute op's workspace in the walk (checked or not) is still
    what ``ledger.workspace`` works out from the ops around it."""
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import ledger
    from snsim.schedule.ops import Compute, Offload

    plain = g.plain_workspace
    for i, layer in enumerate(g.layers):
        if layer.id not in g.in_place_of:
            assert plain["F"][i] == plain["R"][i] == g.workspace_bytes(("F", i))
        if not layer.workspace or layer.workspace[0].bwd_released is None:
            assert plain["B"][i] == g.workspace_bytes(("B", i))
    checked = 0
    for policy in ("liveness", "superneurons", "sqrt-n", "vdnn-all"):
        for factor in (1.1, 2.0):
            ops = policies.plan(policy, PlanContext(g, int(factor * g.lower_bound_bytes))).ops
            host: set = set()
            for effects in (ledger.walk(g, ops, route=False),
                            ledger.walk(g, ops, route=False, check=False)):
                host.clear()
                for k, (op, (nbytes, ws, _)) in enumerate(zip(ops, effects)):
                    if type(op) is Offload:
                        host.add(op.tensor)
                    if type(op) is Compute and op.phase != "O":
                        grads = g.param_grad_bytes(op.step)
                        assert ws == ledger.workspace(g, ops, k, nbytes - grads, host), \
                            (name, policy, factor, k, op)
                        checked += 1
    assert checked


@pytest.mark.parametrize("name,g", list(_handover_and_in_place()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_alloc_bytes_table(name, g):
    """The walks read a step's bytes, when none of what it allocates is resident,
    from ``Graph.alloc_bytes_table``: the sum of its allocations' sizes."""
    for phase, table in g.alloc_bytes_table.items():
        assert len(table) == g.n
        for i, nbytes in enumerate(table):
            allocs = g.allocs_map.get((phase, i))
            assert nbytes == (None if allocs is None else sum(g.size(t) for t in allocs)), \
                (name, phase, i)

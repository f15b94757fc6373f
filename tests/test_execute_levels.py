"""The executor's memory after each op is the ledger's, where saved extras
move: an attention layer's ``S_i`` (its probabilities saved twice, one
storage) offloaded, freed and brought back; and a recomputation of a layer
whose ``S_i`` is still resident (the ledger overwrites it in place)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from snsim.execute.executor import Executor  # noqa: E402
from snsim.execute.memory import mark_window, per_op_levels, quiet_stderr  # noqa: E402
from snsim.graph import Graph  # noqa: E402
from snsim.policies.base import PlanContext  # noqa: E402
from snsim.policies.liveness import plan_liveness  # noqa: E402
from snsim.schedule import ledger, verify  # noqa: E402
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait  # noqa: E402
from snsim.validation.run import Case, Session, build_program  # noqa: E402

CASE = Case("gpt:layers=1,heads=2,width=64,vocab=200", 4, "liveness", (32,))


@pytest.fixture(scope="module")
def gpt():
    torch.set_num_threads(1)
    graph = Graph(Session().trace(CASE))
    attn = next(i for i, layer in enumerate(graph.layers) if layer.kind == "attention")
    return graph, attn


def levels_against_ledger(graph, ops) -> dict:
    """Per op index: the executor's memory after it minus the ledger's level
    there (the executor's baseline subtracted first: it counts parameters and
    the input the trace counts as static)."""
    sched = Schedule("test", ops)
    verify(graph, sched)
    ms, example, program = build_program(CASE)
    batch = example.cpu().numpy().copy()
    ex = Executor(program, graph, sched, torch.device("cpu"))
    try:
        ex.prepare(fresh=True)
        ex.step(batch)
        existing = program.existing_bytes() + ex.state_bytes()
        with quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                     profile_memory=True) as prof:
            ex.release()
            mark_window()
            with torch.profiler.record_function("snsim#-1"):
                ex.prepare(fresh=True)
            ex.step(batch, annotate=True)
    finally:
        ex.close()
    measured = per_op_levels(prof)
    level, out = graph.trace.static_bytes, {}
    for k, (nbytes, _, freed) in enumerate(ledger.walk(graph, ops)):
        level += nbytes - freed
        if k in measured:
            out[k] = existing + measured[k][1] - level
    return out


def liveness_ops(graph):
    return list(plan_liveness(PlanContext(graph)).ops)


def test_saved_extras_come_back_as_one_allocation_per_storage(gpt):
    graph, a = gpt
    s = ("S", a)
    assert graph.size(s) > 0
    ops = liveness_ops(graph)
    f = next(k for k, o in enumerate(ops) if type(o) is Compute and o.step == ("F", a))
    ops[f + 1:f + 1] = [Offload(s), Wait(s), Free(s)]
    b = next(k for k, o in enumerate(ops) if type(o) is Compute and o.step == ("B", a))
    ops[b:b] = [Prefetch(s), Wait(s)]
    diff = levels_against_ledger(graph, ops)
    assert diff[b] == diff[f], (diff[b], diff[f])   # the prefetch: not a buffer per record


def test_recompute_with_saved_extras_resident_holds_them_once(gpt):
    """The attention layer recomputed before its backward (with the layer
    making its input) while its ``S_a`` is still resident: the ledger
    overwrites ``S_a``; the executor lets the forward's records go first."""
    graph, a = gpt
    ops = liveness_ops(graph)
    b = next(k for k, o in enumerate(ops) if type(o) is Compute and o.step == ("B", a))
    held = resident(graph, ops[:b])
    assert ("S", a) in held and ("X", a) not in held
    chain = [j for j in (a - 1, a) if ("X", j) not in held]
    assert all(t in held or t[1] in chain for j in chain for t in graph.needs_map[("R", j)])
    ops[b:b + 1] = ([Compute("R", j) for j in chain] + [Free(("X", j)) for j in chain[:-1]]
                    + [ops[b], Free(("X", a))])
    diff = levels_against_ledger(graph, ops)
    f = next(k for k, o in enumerate(ops) if type(o) is Compute and o.step == ("F", a))
    r = b + len(chain) - 1   # the attention's recomputation
    assert diff[r] == diff[f], (diff[r], diff[f])


def resident(graph, ops) -> set:
    held = set()
    for o in ops:
        if type(o) is Compute:
            held.update(graph.allocs_map[o.step])
        elif type(o) in (Free,):
            held.discard(o.tensor)
        elif type(o) is Prefetch:
            held.add(o.tensor)
    return held

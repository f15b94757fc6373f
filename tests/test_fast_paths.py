"""The simulate path's shortcuts give what the plain code gives (issue 13).

Each shortcut has a plain form beside it: records made in C against their
constructor, the column-wise semantic check against the layer-by-layer loop
(on randomly broken documents), the per-graph op tables against fresh ops, the
ledger's shared effects against each op's bytes worked out, the lower bound's table form against ``least_step_bytes``, the per-graph step
bytes against the per-step sums, an estimate told a limit against the whole one, and the CLI's parser for
one command against the whole parser.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import pytest

from snsim.errors import TraceError
from snsim.graph import Graph
from snsim import policies, synth
from snsim.policies import layers, polish, replay, retime, sequences, superneurons
from snsim.policies.base import PlanContext
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Wait
from snsim.trace import io, load
from snsim.trace.model import Layer, Workspace, make_records
from snsim.training import override

ROOT = Path(__file__).resolve().parent.parent
R50 = ROOT / "traces" / "k40c_resnet50_b32.json"


def test_make_records_equals_the_constructor():
    rows = [(1, "a", "conv", (0,), 8, 4, 0.5, 1.0, frozenset({"inputs"}), 0,
             (Workspace("x", 0, 0.5, 1.0),), None, {"k": 1}),
            (2, "b", "act", (1,), 8, 0, 0.1, 0.2, frozenset(), 4, (), 3, {})]
    made = make_records(Layer, *zip(*rows))
    assert made == [Layer(*row) for row in rows]
    assert [m.extra for m in made] == [{"k": 1}, {}]   # extra is not compared by ==
    assert make_records(Compute, ["F", "B"], [3, 2], [0, 1]) == [Compute("F", 3),
                                                                  Compute("B", 2, 1)]
    assert hash(make_records(Free, [("X", 1)])[0]) == hash(Free(("X", 1)))
    with pytest.raises(ValueError, match="fields"):
        make_records(Compute, ["F"], [1])


def test_layers_equal_a_layer_by_layer_build():
    doc = json.loads(R50.read_text())
    plain = []
    for raw in doc["layers"]:
        ws = tuple(Workspace(w["algo"], int(w["bytes"]), float(w["fwd_ms"]),
                             float(w["bwd_ms"]), w.get("bwd_bytes"), w.get("bwd_released"))
                   for w in raw.get("workspace", ()))
        extra = {k: v for k, v in raw.items() if k not in io._LAYER_KEYS}
        plain.append(Layer(raw["id"], raw["name"], raw["kind"], tuple(raw["inputs"]),
                           raw["output_bytes"], raw["param_bytes"], raw["fwd_ms"],
                           raw["bwd_ms"], frozenset(raw["bwd_reads"]),
                           raw.get("saved_extra_bytes", 0), ws, raw.get("grad_bytes"),
                           extra))
    got = load(R50).layers
    assert list(got) == plain
    assert [list(g.extra.items()) for g in got] == [list(p.extra.items()) for p in plain]


def _broken(doc: dict, rng: random.Random) -> dict:
    doc = copy.deepcopy(doc)
    layers = doc["layers"]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(layers))
        raw = layers[i]
        kind = rng.randrange(8)
        if kind == 0:
            raw["id"] = rng.choice([i + 1, i - 1, 0, float(i)])
        elif kind == 1:
            raw["inputs"] = [rng.randrange(len(layers) + 3)]
        elif kind == 2:
            raw["inputs"] = []
        elif kind == 3:
            raw["fwd_ms"] = rng.choice([float("inf"), float("nan"), 3.0])
        elif kind == 4:
            raw["kind"] = "data"
        elif kind == 5:
            raw["grad_bytes"] = raw["output_bytes"] + rng.choice([0, 1])
        elif kind == 6 and raw.get("workspace"):
            raw["workspace"][0]["bwd_ms"] = float("inf")
        else:
            raw["inputs"] = raw["inputs"] + [i]
    return doc


@pytest.mark.parametrize("seed", range(3))
def test_column_check_never_passes_what_the_loop_refuses(seed):
    doc = json.loads(R50.read_text())
    rng = random.Random(seed)
    for _ in range(60):
        bad = _broken(doc, rng)
        try:
            io._semantic_loop(bad["layers"], "t")
            loop_ok = True
        except TraceError:
            loop_ok = False
        if io._semantic_ok(bad["layers"]):
            assert loop_ok
        if loop_ok and io._RARE_KEYS.isdisjoint(set().union(*bad["layers"])):
            assert io._semantic_ok(bad["layers"])   # the shortcut is taken where it can be


def test_op_tables_give_the_ops_made_fresh():
    g = Graph(load(R50))
    tables = sequences.op_tables(g)
    seq = list(g.route) + [("R", 3)]
    assert tables.computes(seq) == [Compute(*s) for s in seq]
    tables.add_frees(g.sizes)
    assert all(tables.free[t] == Free(t) for t in g.sizes)
    assert tables.wait[("X", 1)].tensor == ("X", 1)   # made on first lookup
    for table, cls in ((tables.wait, Wait), (tables.prefetch, Prefetch),
                       (tables.offload, Offload)):
        op = table[("S", 7)]
        assert op == cls(("S", 7)) and type(op) is cls and hash(op) == hash(cls(("S", 7)))
        assert repr(op) == repr(cls(("S", 7)))


@pytest.mark.parametrize("name", ["k40c_resnet50_b32.json", "k40c_inception_v4_b16.json",
                                  "cpu_gpt_small_b4.json"])
def test_step_bytes_table_equals_the_per_step_sums(name):
    g = Graph(load(ROOT / "traces" / name))
    table = layers.step_bytes_table(g)
    for phase, i in g.route:
        step = (phase, i)
        assert table[phase][i] == g.step_bytes(step) + g.workspace_bytes(step)
        assert g.needs_bytes_table[phase][i] == sum(g.size(t) for t in g.needs(step))
        assert g.alloc_bytes_table[phase][i] == sum(g.size(t) for t in g.allocs(step))


@pytest.mark.parametrize("name,grads", [("k40c_resnet50_b32.json", None),
                                        ("k40c_resnet50_b32.json", "set-to-none"),
                                        ("cpu_gpt_small_b4.json", None)])
def test_shared_effects_equal_the_bytes_worked_out(name, grads):
    """A free releases its tensor's bytes; a step that makes all of its outputs with
    its first algorithm allocates them (and, set-to-none, its parameters' gradients)
    and holds its workspace; a step whose workspace the ledger works out from the
    ops around it (in place, a measured hand-over) has no shared effect."""
    trace = load(ROOT / "traces" / name)
    if grads:
        trace = trace.with_training(override(trace.training, None, grads))
    g = Graph(trace)
    assert g.grads_born == bool(grads)
    frees, steps = ledger.shared_effects(g)
    assert frees == {t: (0, 0, g.size(t)) for t in g.sizes}
    shared = 0
    for phase, i in list(g.route) + [("R", i) for i in range(g.n)]:
        step = (phase, i)
        fx = steps[phase][i]
        if g.plain_workspace[phase][i] is None:
            assert fx is None
            continue
        born = g.param_grad_bytes(step)
        assert fx == (sum(g.size(t) for t in g.allocs(step)) + born,
                      g.workspace_bytes(step), 0)
        shared += 1
    assert shared > g.n   # most steps have one
    assert ledger.shared_effects(g) is ledger.shared_effects(g)   # once per graph


@pytest.mark.parametrize("factor", [1.05, 1.5, 3.0])
def test_estimate_with_a_limit_is_exact_up_to_it(factor):
    """replay.estimate_ms with ``limit``: the makespan where it is at most the limit,
    else a value above the limit and at most the makespan, up to rounding (it may
    stop early)."""
    g = Graph(load(R50))
    cap = int(g.lower_bound_bytes * factor)
    for kind in ("cache-only", "cost-aware"):
        ops = superneurons.candidate(g, cap, kind, layers.checkpoints(g))[0]
        ms = replay.estimate_ms(g, ops, cap)
        for limit in (0.0, ms * 0.5, ms * 0.99, ms, ms * 1.01, math.inf):
            got = replay.estimate_ms(g, ops, cap, limit)
            if ms <= limit:
                assert got == ms
            else:
                assert limit < got <= ms * (1 + 1e-12)   # its sums round apart


def resumed_equal_whole(g, cap, ops, moves) -> int:
    """How many of ``moves`` (plans changed from ``ops`` in one place) were
    estimated; each :class:`replay.Resumable` estimate is checked against the
    whole replay's, with and without a limit."""
    base = replay.Resumable(g, ops, cap)
    assert base.ms == replay.estimate_ms(g, ops, cap)
    n = 0
    for new in moves:
        if new is None:
            continue
        whole = replay.estimate_ms(g, new, cap)
        for limit in (math.inf, base.ms, whole, 0.5 * whole):
            got = base.estimate(new, limit)
            if whole <= limit:
                assert got == whole
            else:
                assert limit < got <= whole * (1 + 1e-12)
        n += 1
    return n


def one_place_moves(g, ops):
    """The polish's moves of every recomputation and every prefetch of ``ops``."""
    for i, o in enumerate(ops):
        if type(o) is Compute and o.phase == "R":
            yield from polish.variants(g, ops, i)
    for p in retime.waits(ops):
        yield from retime.variants(g, ops, p)


@pytest.mark.parametrize("name,factor", [("k40c_resnet50_b16.json", 1.10),
                                         ("k40c_inception_v4_b16.json", 1.05),
                                         ("cpu_resnet18_b8_64.json", 1.05),
                                         ("cpu_gpt_small_b4.json", 1.1)])
def test_resumed_estimate_equals_the_whole_one(name, factor):
    """replay.Resumable (replay's note 4): a plan changed in one place,
    replayed from the state kept before the change, gives the whole replay's
    figure (cut short above a limit as the whole one may be)."""
    g = Graph(load(ROOT / "traces" / name))
    cap = int(g.lower_bound_bytes * factor)
    ops = list(policies.plan("superneurons", PlanContext(g, cap)).ops)
    assert resumed_equal_whole(g, cap, ops, one_place_moves(g, ops)) > 100


def test_resumed_estimate_keeps_the_host_copies_made_before_it(monkeypatch):
    """A resumed replay starts from the host copies the base's replay had made:
    a dying read with a host copy is not handed to autograd (DESIGN 3,
    "Dying reads"), so a backward step's workspace depends on an offload issued
    long before it.  handover4 (tests/test_handover.py) with X1 offloaded after
    F1: B2 keeps its plain 250 B workspace (1110 B peak); forgetting the copy on
    resuming would hand X1 over and fit a budget the plan does not fit."""
    from test_handover import _trace
    monkeypatch.setattr(replay.Resumable, "EVERY", 1)   # a state before every compute
    g = Graph(_trace())
    live = list(policies.plan("liveness", PlanContext(g)).ops)
    f1 = live.index(Compute("F", 1))
    base = live[:f1 + 1] + [Offload(("X", 1))] + live[f1 + 1:]
    b2 = base.index(Compute("B", 2))
    moved = base[:b2] + [Offload(("X", 0))] + base[b2:]   # differs right before B2
    for cap, want in ((1110, True), (1000, False)):
        whole = replay.estimate_ms(g, moved, cap)
        assert math.isfinite(whole) is want
        resumed = replay.Resumable(g, base, cap)
        assert any(f1 + 1 < k < b2 for k in resumed.at)   # resumed after the offload
        assert resumed.estimate(moved) == whole


def test_resumed_estimate_on_random_plans():
    """The same on random DAGs' plans of every policy that swaps or recomputes,
    at tight budgets, with moves anywhere in the plan."""
    checked = 0
    for seed in range(20):
        g = Graph(synth.random_dag(seed, 6 + seed % 10))
        for factor in (1.05, 1.3):
            cap = int(g.lower_bound_bytes * factor)
            for name in ("superneurons", "dtr", "vdnn-all", "sqrt-n"):
                s = policies.plan(name, PlanContext(g, cap))
                if s.infeasible_reason is not None or not replay.fits(g, s.ops, cap):
                    continue
                ops = list(s.ops)
                checked += resumed_equal_whole(g, cap, ops, one_place_moves(g, ops))
                # and plans cut anywhere: the tail dropped from a random op on
                rng = random.Random(seed)
                for _ in range(3):
                    k = rng.randrange(len(ops))
                    checked += resumed_equal_whole(g, cap, ops, [ops[:k] + ops[k + 1:]])
    assert checked > 200


@pytest.mark.parametrize("name", ["k40c_resnet50_b32.json", "cpu_gpt_small_b4.json",
                                  "k40c_inception_v4_b16.json"])
def test_lower_bound_equals_the_least_step_bytes_form(name):
    g = Graph(load(ROOT / "traces" / name))
    born = best = 0
    for s in g.route:
        born += g.param_grad_bytes(s)
        best = max(best, g.least_step_bytes(s) + born)
    if g.optimizer_step:
        best = max(best, born + g.least_step_bytes(g.optimizer_step))
    assert g.lower_bound_bytes == g.trace.static_bytes + best


def test_one_command_parser_parses_as_the_whole_one():
    from snsim.cli import CORE_COMMANDS, build_parser

    line = ["simulate", str(R50), "--policy", "liveness", "--json", "--budget", "1.5xlb"]
    assert vars(build_parser("simulate").parse_args(line)) == \
        vars(build_parser().parse_args(line))
    sub = build_parser("info")._subparsers._group_actions[0]
    assert set(sub.choices) == set(CORE_COMMANDS)   # the others' modules not imported
    assert {"profile", "import"} <= set(build_parser()._subparsers._group_actions[0].choices)

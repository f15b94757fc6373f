"""Profiler (issue 3) on tiny models: exact structure, bytes, reads, errors."""

from __future__ import annotations

import argparse
import math
import operator
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
nn = torch.nn

from snsim.errors import SnsimError  # noqa: E402
from snsim.torchgraph import capture as cap  # noqa: E402
from snsim.profile import command, profiler, zoo  # noqa: E402
from snsim.trace import from_dict, load  # noqa: E402

BYTE_FIELDS = ("output_bytes", "param_bytes", "saved_extra_bytes")


# ------------------------------------------------------------------ tiny models
class Chain(nn.Module):
    """conv -> bn -> relu (in place) -> max-pool -> dropout -> flatten (a view) -> fc."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = self.drop(self.pool(self.relu(self.bn(self.conv(x)))))
        return self.fc(torch.flatten(x, 1))


class Residual(nn.Module):
    """conv -> relu -> conv, plus the block input (add), relu; one ReLU module called twice."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(3 * 8 * 8, 4)

    def forward(self, x):
        y = self.relu(x + self.c2(self.relu(self.c1(x))))
        return self.fc(y.flatten(1))


class Concat(nn.Module):
    """Two convolutions of one input joined by a channel concatenation."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 5, 3, padding=1)
        self.fc = nn.Linear(7 * 8 * 8, 3)

    def forward(self, x):
        return self.fc(torch.cat([self.a(x), self.b(x)], 1).view(x.shape[0], -1))


class Untraceable(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return x
        return -x


def _profile(model_cls, batch=2, shape=(3, 8, 8), **kw):
    return _doc(model_cls(), batch, shape, **kw)


def _doc(model, batch, shape, device_model=None, repeats=1, warmup=0):
    """Profile an in-memory model through the same path as the command."""
    if device_model:
        model = model.to_empty(device="meta")
    spec = profiler.ModelSpec(type(model).__name__, model, shape, torch.float32)
    orig = profiler.resolve
    profiler.resolve = lambda *_a, **_k: spec
    try:
        return profiler.profile("tiny", batch, shape, device="cpu" if not device_model else None,
                                device_model=device_model, repeats=repeats, warmup=warmup)
    finally:
        profiler.resolve = orig


def _brief(doc):
    return [(la["kind"], la["inputs"]) for la in doc["layers"]]


# ------------------------------------------------------------- structure, exact
def test_chain_layers_inputs_and_bytes_exact():
    doc = _profile(Chain)
    assert _brief(doc) == [("data", []), ("conv", [0]), ("bn", [1]), ("act", [2]),
                           ("pool", [3]), ("dropout", [4]), ("fc", [5]), ("loss", [6])]
    b = 2
    out = [la["output_bytes"] for la in doc["layers"]]
    assert out == [4 * b * 3 * 64, 4 * b * 4 * 64, 4 * b * 4 * 64, 4 * b * 4 * 64,
                   4 * b * 4 * 16, 4 * b * 4 * 16, 4 * b * 5, 4]
    params = [la["param_bytes"] for la in doc["layers"]]
    assert params == [0, 4 * (4 * 3 * 9 + 4), 4 * 8, 0, 0, 0, 4 * (64 * 5 + 5), 0]


def test_bwd_reads_and_saved_extra_per_kind():
    layers = {la["kind"]: la for la in _profile(Chain)["layers"]}
    b = 2
    assert layers["conv"]["bwd_reads"] == ["inputs"] and "saved_extra_bytes" not in layers["conv"]
    assert layers["act"]["bwd_reads"] == ["output"] and "saved_extra_bytes" not in layers["act"]
    # max-pool: autograd keeps its input and int64 indices (one per output), not the output
    assert layers["pool"]["bwd_reads"] == ["inputs"]
    assert layers["pool"]["saved_extra_bytes"] == 8 * b * 4 * 4 * 4
    # dropout: reads nothing, keeps its mask (float32 in PyTorch's CPU path)
    assert layers["dropout"]["bwd_reads"] == []
    assert layers["dropout"]["saved_extra_bytes"] == 4 * b * 4 * 4 * 4
    # batch norm: reads its input, keeps per-channel mean and inverse std
    assert layers["bn"]["bwd_reads"] == ["inputs"]
    assert layers["bn"]["saved_extra_bytes"] == 2 * 4 * 4
    # the loss keeps its log-softmax (batch x classes) and a scalar, not the logits
    assert layers["loss"]["saved_extra_bytes"] == 4 * b * 5 + 4
    assert layers["loss"]["bwd_reads"] == []


def test_inplace_relu_profiled_out_of_place_and_restored():
    model = Chain()
    doc = _doc(model, 2, (3, 8, 8))
    act = doc["layers"][3]
    assert act["inplace"] is True and act["inplace_of"] == 2
    assert "saved_extra_bytes" not in act  # the saved output is not counted again
    assert model.relu.inplace is True


def test_residual_add_and_module_called_twice():
    doc = _profile(Residual)
    assert _brief(doc) == [("data", []), ("conv", [0]), ("act", [1]), ("conv", [2]),
                           ("add", [0, 3]), ("act", [4]), ("fc", [5]), ("loss", [6])]
    names = [la["name"] for la in doc["layers"]]
    assert names[2] != names[5] and names[2] == "relu"
    assert doc["layers"][4]["bwd_reads"] == []
    # data needs no gradient; conv c1's backward skips dX (only weights)
    assert doc["layers"][1]["bwd_ms"] > 0


def test_concat_and_view_fold():
    doc = _profile(Concat)
    assert _brief(doc) == [("data", []), ("conv", [0]), ("conv", [0]), ("concat", [1, 2]),
                           ("fc", [3]), ("loss", [4])]
    assert doc["layers"][3]["output_bytes"] == 4 * 2 * 7 * 64
    assert doc["layers"][3]["bwd_reads"] == []


@pytest.mark.parametrize("model_cls", [Chain, Residual, Concat])
def test_output_bytes_match_real_tensors_and_fx_graph(model_cls):
    """Every layer's output_bytes is numel x element size of the tensor fx computes."""
    torch.manual_seed(0)
    model = model_cls().train()
    x = torch.randn(2, 3, 8, 8)
    got = cap.capture(model, x)
    gm = got.graph_module
    seen: dict[int, torch.Tensor] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            lid = got.node_layer.get(n.name)
            if lid is not None and lid not in seen and isinstance(out, torch.Tensor):
                seen[lid] = out.clone()
            return out

    Rec(gm).run(x)
    calls = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    folded = [n for n in calls if got.node_layer[n.name] is not None
              and any(got.node_layer[n.name] == got.node_layer[m.name] for m in calls if m is not n
                      and list(gm.graph.nodes).index(m) < list(gm.graph.nodes).index(n))
              or got.node_layer[n.name] is None]
    assert len(got.layers) == 1 + len(calls) - len(folded) + 1  # data + layers + loss
    for lid, layer in enumerate(got.layers[:-1]):
        t = seen[lid]
        assert layer.output_bytes == t.numel() * t.element_size(), layer.name
        assert layer.shape == tuple(t.shape)


# ---------------------------------------------------------- measured vs modeled
@pytest.mark.parametrize("model_cls", [Chain, Residual, Concat])
def test_measured_and_modeled_agree_on_bytes(model_cls):
    measured, modeled = _profile(model_cls), _profile(model_cls, device_model="k40c")
    assert _brief(measured) == _brief(modeled)
    for a, b in zip(measured["layers"], modeled["layers"]):
        for key in BYTE_FIELDS + ("bwd_reads",):
            assert a.get(key, 0) == b.get(key, 0), (a["name"], key)
    assert measured["source"]["kind"] == "measured"
    assert modeled["source"]["kind"] == "modeled" and modeled["source"]["device_model"] == "k40c"
    assert modeled["device"]["memory_bytes"] == 12 * 2**30


def test_zoo_gpt_bytes_agree_and_attention_layer():
    spec = "gpt:layers=1,heads=2,width=16,vocab=50"
    a = profiler.profile(spec, 2, (8,), repeats=1, warmup=0)
    b = profiler.profile(spec, 2, (8,), device_model="h100")
    for x, y in zip(a["layers"], b["layers"]):
        assert all(x.get(k, 0) == y.get(k, 0) for k in BYTE_FIELDS), x["name"]
    kinds = [la["kind"] for la in a["layers"]]
    assert kinds.count("attention") == 1 and kinds[1] == "embedding"
    assert a["layers"][0]["output_bytes"] == 2 * 8 * 8  # int64 token ids
    assert a["input_dtype"] == "int64"


def test_times_positive_and_finite():
    for doc in (_profile(Residual, repeats=2, warmup=1), _profile(Residual, device_model="v100")):
        for la in doc["layers"][1:]:
            for key in ("fwd_ms", "bwd_ms"):
                assert math.isfinite(la[key]) and la[key] > 0, (la["name"], key)
        src = doc["source"]
        if src["kind"] == "measured":
            assert src["step_ms"] > 0 and src["layers_total_ms"] > 0
            assert "no PCIe link" in src["link"]["kind"]
            for la in doc["layers"][1:]:   # every layer's median lies inside its spread
                assert la["fwd_ms_p10"] <= la["fwd_ms"] <= la["fwd_ms_p90"], la["name"]
                assert la["bwd_ms_p10"] <= la["bwd_ms"] <= la["bwd_ms_p90"], la["name"]
        for la in doc["layers"]:
            if la["kind"] == "conv":  # DESIGN 2: the first entry carries the layer's times
                first = la["workspace"][0]
                assert (first["fwd_ms"], first["bwd_ms"]) == (la["fwd_ms"], la["bwd_ms"])
                assert first["bytes"] >= 0
                if src["kind"] == "modeled":
                    assert la["workspace"] == [{**first, "bytes": 0}]
        assert "workspace" in src


def test_zoo_resnet_configs():
    entry, _ = zoo.lookup("resnet-2500")
    assert zoo.RESNET_STAGES[2498] == (6, 32, 788, 6) and entry.input_shape == (3, 227, 227)
    with torch.device("meta"):
        model = zoo.lookup("resnet50")[0].build((3, 227, 227))
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert convs == 53  # 49 in the blocks' main paths + 4 projection shortcuts
    with pytest.raises(SnsimError, match="unknown ResNet depth"):
        zoo.lookup("resnet-77")


# ------------------------------------------------------------- command + errors
def _args(**kw):
    ns = argparse.Namespace(model=None, batch=2, input_shape=None, device=None,
                            device_model=None, repeats=1, warmup=0, out=None, no_progress=True,
                            list_models=False, list_device_models=False)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usermods.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def good():
            return nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(2 * 6 * 6, 3)), (3, 8, 8)
        def not_a_module():
            return 42
        class Bad(nn.Module):
            def forward(self, x):
                return x if x.sum() > 0 else -x
        def untraceable():
            return Bad(), (3, 4, 4)
        def boom():
            raise RuntimeError("broken constructor")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_command_writes_loadable_trace(user_module, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert command.run(_args(model="usermods:good", out=str(out))) == 0
    trace = load(out)
    assert [la.kind for la in trace.layers] == ["data", "conv", "act", "fc", "loss"]
    assert trace.source["kind"] == "measured" and "wrote" in capsys.readouterr().out
    out2 = tmp_path / "m.json"
    command.run(_args(model="usermods:good", device_model="a100", out=str(out2)))
    assert [la.output_bytes for la in load(out2).layers] == [la.output_bytes for la in trace.layers]


@pytest.mark.parametrize("kw, msg", [
    ({"model": "nosuchmodel"}, "unknown model 'nosuchmodel'"),
    ({"model": "no_such_pkg.mod:fn"}, "cannot import module 'no_such_pkg.mod'"),
    ({"model": "usermods:missing"}, "has no function 'missing'"),
    ({"model": "usermods:not_a_module"}, "returned int, not a torch.nn.Module"),
    ({"model": "usermods:untraceable"}, "torch.fx cannot trace"),
    ({"model": "usermods:boom"}, "raised RuntimeError: broken constructor"),
    ({"model": "gpt:depth=3"}, "has no parameter 'depth'"),
    ({"model": "resnet18", "input_shape": "3,x,4"}, "bad --input-shape"),
    ({"model": "resnet18", "input_shape": "3,224"}, "takes an input shape of 3 numbers"),
    ({"model": "resnet18", "device_model": "gtx480"}, "unknown device model 'gtx480'"),
    ({"model": "resnet18", "batch": 0}, "--batch must be at least 1"),
    ({"model": "resnet18", "batch": 1, "input_shape": "3,32,32"},
     "failed on inputs of shape 1x512x1x1: ValueError"),
    ({"model": "resnet18", "device_model": "k40c", "device": "cpu"}, "cannot be combined"),
])
def test_bad_inputs_one_line_and_no_file(user_module, tmp_path, kw, msg):
    out = tmp_path / "never.json"
    with pytest.raises(SnsimError, match=msg) as err:
        command.run(_args(out=str(out), **kw))
    assert "\n" not in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_model_that_cannot_train_is_an_error():
    class DoubleInplace(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.a, self.b = nn.Conv2d(3, 2, 1), nn.ReLU(True), nn.ReLU(True)
            self.fc = nn.Linear(2 * 4 * 4, 2)

        def forward(self, x):
            return self.fc(self.b(self.a(self.conv(x))).flatten(1))

    with pytest.raises(SnsimError, match="the model's own training step fails"):
        _doc(DoubleInplace(), 2, (3, 4, 4))


def test_cuda_unavailable_is_an_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SnsimError, match="cuda"):
        command.run(_args(model="resnet18", device="cuda", out=str(tmp_path / "c.json")))


def test_cli_lists_and_help_without_torch_import():
    import subprocess
    import sys

    code = ("import sys, snsim.cli; snsim.cli.build_parser(); "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip() == "False", res.stderr
    from snsim.cli import main

    assert main(["profile", "--list-device-models"]) == 0
    assert main(["profile", "--list-models"]) == 0


def test_trace_validates_and_compact_dump_round_trips(tmp_path):
    doc = _profile(Concat)
    path = tmp_path / "c.json"
    profiler.write(doc, path)
    import json

    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    assert from_dict(doc).layers[-1].kind == "loss"


def test_meta_memo_changes_nothing(monkeypatch):
    """Memoized modeled capture (note [6]) equals a full run, field for field."""
    spec, shape = "resnet50", (3, 32, 32)
    fast = profiler.profile(spec, 2, shape, device_model="k40c")
    monkeypatch.setattr(cap, "MEMO", False)
    slow = profiler.profile(spec, 2, shape, device_model="k40c")
    assert fast["layers"] == slow["layers"]


def test_cli_profile_smoke_and_error_exit(user_module, tmp_path, capsys):
    from snsim.cli import main

    out = tmp_path / "cli.json"
    assert main(["profile", "--model", "usermods:good", "--batch", "2", "--repeats", "1",
                 "--warmup", "0", "--no-progress", "--out", str(out)]) == 0
    assert load(out).layers[-1].kind == "loss"
    capsys.readouterr()
    assert main(["profile", "--model", "usermods:not_a_module", "--batch", "2",
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("snsim: error:") and "\n" not in err
    assert not (tmp_path / "x.json").exists()


# ------------------------------------------------------------- property test


class RandomNet(nn.Module):
    """A random stack of conv/bn/relu/pool/dropout with optional residual adds and concats."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        mods, c = [], 3
        for k, op in enumerate(ops):
            if op in ("conv", "res", "cat"):
                mods.append(nn.Conv2d(c, c if op == "res" else 4, 3, padding=1))
                c = c + 4 if op == "cat" else (c if op == "res" else 4)
            elif op == "bn":
                mods.append(nn.BatchNorm2d(c))
            elif op == "relu":  # relu_ after relu would clobber the output relu saved
                mods.append(nn.ReLU(inplace=k == 0 or ops[k - 1] != "relu"))
            elif op == "pool":
                mods.append(nn.MaxPool2d(3, 1, 1))
            else:
                mods.append(nn.Dropout(0.3))
        self.body = nn.ModuleList(mods)
        self.fc = nn.Linear(c * 6 * 6, 3)

    def forward(self, x):
        for op, mod in zip(self.ops, self.body):
            if op == "res":
                x = x + mod(x)
            elif op == "cat":
                x = torch.cat([x, mod(x)], 1)
            else:
                x = mod(x)
        return self.fc(x.flatten(1))


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["conv", "bn", "relu", "pool", "drop", "res", "cat"]),
                           min_size=1, max_size=6))
def test_property_random_nets_bytes_agree_and_are_exact(ops):
    torch.manual_seed(0)
    measured = _doc(RandomNet(ops), 2, (3, 6, 6))
    modeled = _doc(RandomNet(ops), 2, (3, 6, 6), device_model="p100")
    assert _brief(measured) == _brief(modeled)
    for a, b in zip(measured["layers"], modeled["layers"]):
        assert all(a.get(k, 0) == b.get(k, 0) for k in BYTE_FIELDS), a["name"]
        assert a["output_bytes"] == (4 * math.prod(a["shape"]) if a["shape"] else 4)
        assert all(i < a["id"] for i in a["inputs"])
    assert len(measured["layers"]) == 1 + len(ops) + ops.count("res") + ops.count("cat") + 2


def test_out_of_memory_while_timing_is_one_line():
    from snsim.profile import measure

    def oom(x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    op = cap.LayerOp(oom, [torch.zeros(2)])
    with pytest.raises(SnsimError, match="out of device memory .* smaller --batch"):
        measure.time_layers([None, op], measure.Clock(torch.device("cpu")), 0, 1,
                            step=lambda: None)


def test_cuda_code_paths_with_a_fake_cuda(monkeypatch):
    """No GPU here: run the CUDA-only branches on CPU kernels with fake events and counters."""
    from snsim.profile import measure

    class Event:
        clock = [0.0]

        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self):
            Event.clock[0] += 1.0
            self.t = Event.clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    peaks = iter(range(1000, 10**6, 1000))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: next(peaks))
    clock = measure.Clock(torch.device("cuda"))
    assert clock.once(lambda: 3)[1] == 3
    conv = nn.Conv2d(3, 4, 3)
    op = cap.LayerOp(conv, [torch.randn(2, 3, 6, 6)], list(conv.parameters()))
    entries, first = measure.conv_workspaces(op, clock, 1, 2)
    assert [e["algo"] for e in entries] == ["cudnn-heuristic", "cudnn-benchmark"]
    assert all(e["bytes"] > 0 and e["bwd_bytes"] > 0 for e in entries)
    assert first["fwd_ms"] == entries[0]["fwd_ms"] == 1.0
    layer = cap.CapturedLayer("c", "conv", (0,), 1, 1, 0, ("inputs",), (1,), "float32", op)
    t = {"fwd_ms": 2.0, "bwd_ms": 3.0}
    profiler._add_workspace(layer, t, torch.device("cuda"), clock, 0, 1, measure)
    assert (t["workspace"][0]["fwd_ms"], t["workspace"][0]["bwd_ms"]) == (2.0, 3.0)



def test_measured_profile_closes_every_executor(monkeypatch):
    """The transient measurement and the step timing close the executors they
    open (the transient one never did: its copy-engine pool was left open)."""
    from snsim.execute.executor import Executor
    from snsim.profile import steptimes, transients

    opened, closed = [], []

    class Counting(Executor):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            opened.append(self)

        def close(self):
            closed.append(self)
            super().close()

    monkeypatch.setattr(transients, "Executor", Counting)
    monkeypatch.setattr(steptimes, "Executor", Counting)
    _profile(Residual)
    # transients (policy none), the dying-reads hand-over (liveness: Residual's
    # add frees its inputs right after its backward) and the step timing
    assert len(opened) == 3 and closed == opened


def test_step_timing_reports_progress_per_step():
    """time_steps ticks once per training step (warm-up and timed), which the
    profile's "executor steps" bar counts."""
    from snsim.graph import Graph
    from snsim.profile.steptimes import time_steps
    from snsim.torchgraph.program import Program

    torch.manual_seed(0)
    model = Residual()
    doc = _doc(model, 2, (3, 8, 8))
    example = torch.randn(2, 3, 8, 8)
    ticks = []
    times = time_steps(Program(model, example), Graph(from_dict(doc)), example.numpy().copy(),
                       torch.device("cpu"), 2, 3, tick=lambda: ticks.append(1))
    assert len(ticks) == 2 + 3 and times


class _Unpacks(nn.Module):
    """``q, k, v = t`` (eager: unbind), ``t[0] + t[1]`` (eager: select)."""

    def __init__(self, explicit: bool):
        super().__init__()
        self.explicit = explicit
        self.fc = nn.Linear(4, 12)

    def forward(self, x):
        t = self.fc(x).view(x.shape[0], 3, 4).transpose(0, 1)
        if self.explicit:
            q, k, v = t[0], t[1], t[2]
        else:
            q, k, v = t
        return q * k + v


def test_tensor_unpacking_is_one_unbind_as_in_eager_pytorch():
    """Capture note [8]: unpacking becomes one ``torch.unbind`` (a view, so no
    layer), explicit indexing stays ``select``; a module's tuple unpacks by
    plain getitem (the LSTM below) and is left alone."""
    from snsim.torchgraph.capture import capture

    def targets(model, x):
        # the call_function targets, getitem named by what it indexes (x.shape[0]: getattr)
        cap = capture(model, x)
        return [(n.target, getattr(n.args[0], "target", None))
                if n.target is operator.getitem else n.target
                for n in cap.graph_module.graph.nodes if n.op == "call_function"], cap

    x = torch.randn(5, 4)
    got, cap = targets(_Unpacks(False), x)
    assert got.count(torch.unbind) == 1
    assert got.count((operator.getitem, torch.unbind)) == 3
    assert [layer.kind for layer in cap.layers] == ["data", "fc", "other", "add", "loss"]
    got, _ = targets(_Unpacks(True), x)
    assert torch.unbind not in got and got.count((operator.getitem, "transpose")) == 3

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 4, batch_first=True)

        def forward(self, x):
            out, (h, c) = self.rnn(x)
            return out[:, -1] + h[0]

    got, _ = targets(Rnn(), torch.randn(2, 3, 4))
    assert torch.unbind not in got



def test_tuple_layer_gradient_counts_the_elements_read():
    """Capture note [9]: ``a, _ = attn(h, h, h)`` reads the output, not the
    weights, so the layer's gradient is the output's bytes alone."""
    from snsim.torchgraph.capture import capture

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            a, _ = self.attn(x, x, x)
            return a.mean(dim=1)

    layer = next(t for t in capture(Attn(), torch.randn(3, 5, 8)).layers if t.kind == "attention")
    out, weights = 3 * 5 * 8 * 4, 3 * 5 * 5 * 4
    assert (layer.output_bytes, layer.grad_bytes) == (out + weights, out)

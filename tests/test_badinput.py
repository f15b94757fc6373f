"""Bad input, as a new user gives it: traces, CLI arguments, profile, validate,
suite files and output paths.

Each case must end in exit 2 with ONE line on stderr that names what is wrong
(and where), no traceback, nothing on stdout, no output file left behind, every
input file byte for byte as it was, and no slow work done first: the simulator
and the profiler are replaced by functions that fail the test if called.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import pytest

from snsim.cli import main

ROOT = pathlib.Path(__file__).parent.parent
BASE = json.loads((ROOT / "traces" / "cpu_alexnet_b16_128.json").read_text())
MODELED = str(ROOT / "traces" / "k40c_alexnet_b128.json")


def _doc(**top) -> dict:
    doc = json.loads(json.dumps(BASE))
    doc.update(top)
    return doc


def _layer(doc: dict, i: int, **fields) -> dict:
    doc["layers"][i].update(fields)
    return doc


def _drop(doc: dict, key: str) -> dict:
    del doc[key]
    return doc


def _j(doc) -> bytes:
    return json.dumps(doc).encode()


# trace file contents: name -> bytes (written as t.json)
TRACES = {
    "not-json": (b"{this is not json", "invalid JSON at line 1"),
    "empty-file": (b"", "invalid JSON"),
    "top-level-list": (b"[1, 2, 3]", "t.json"),
    "no-schema": (_j(_drop(_doc(), "schema")), "schema"),
    "wrong-schema": (_j(_doc(schema="snsim.trace/9")), "unsupported schema version"),
    "no-layers": (_j(_doc(layers=[])), "layers"),
    "batch-zero": (_j(_doc(batch=0)), "batch"),
    "batch-string": (_j(_doc(batch="two")), "batch"),
    "id-not-index": (_j(_layer(_doc(), 3, id=7)), "must equal its index"),
    "input-ahead": (_j(_layer(_doc(), 3, inputs=[5])), "not an earlier layer"),
    "input-missing": (_j(_layer(_doc(), 3, inputs=[99])), "does not exist"),
    "negative-bytes": (_j(_layer(_doc(), 2, output_bytes=-5)), "layer"),
    "unknown-kind": (_j(_layer(_doc(), 2, kind="warp")), "warp"),
    "bad-bwd-reads": (_j(_layer(_doc(), 2, bwd_reads=["everything"])), "everything"),
    "nan-time": (_j(_doc()).replace(b'"fwd_ms": 8.448315', b'"fwd_ms": NaN'), "must be finite"),
    "inf-literal": (_j(_doc()).replace(b'"fwd_ms": 8.448315', b'"fwd_ms": Infinity'),
                    "must be finite"),
    "overflow-number": (_j(_doc()).replace(b'"fwd_ms": 8.448315', b'"fwd_ms": 1e400'),
                        "must be finite"),
    "last-not-loss": (_j(_layer(_doc(), len(BASE["layers"]) - 1, kind="fc")),
                      "the last layer must be the loss"),
    "deep-nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "binary": (b"\xff\xfe\x00\x01\x89PNG", "cannot read"),
    "no-device-bandwidth": (_j(_doc(device={"name": "x", "memory_bytes": 10**9})), "device"),
    "control-chars-in-name": (_j(_layer(_layer(_doc(), 3, id=9), 3,
                                        name="evil\x1b[2J\nname")), "evil\\x1b[2J\\nname"),
}


@pytest.fixture
def guarded(monkeypatch):
    """The simulator and the profiler fail the test if a bad case reaches them."""
    import snsim.sim

    def no_work(*a, **k):
        raise AssertionError("slow work started before the input was checked")

    monkeypatch.setattr(snsim.sim, "simulate", no_work)
    try:
        import snsim.profile.profiler as profiler
    except ImportError:  # no torch: profile cases skip themselves
        return
    monkeypatch.setattr(profiler, "profile", no_work)


def _digest(folder: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _check(capsys, tmp_path, argv, message, outputs=()):
    before = _digest(tmp_path)
    try:
        code = main([a.replace("{d}", str(tmp_path)) for a in argv])
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert out == "", out
    assert err.startswith("snsim: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert message in err, err
    assert _digest(tmp_path) == before          # inputs untouched, nothing new written
    for o in outputs:
        assert not pathlib.Path(o.replace("{d}", str(tmp_path))).exists()


@pytest.mark.parametrize("content, message", list(TRACES.values()), ids=list(TRACES))
@pytest.mark.parametrize("command", ["simulate", "info"])
def test_bad_trace(capsys, tmp_path, guarded, command, content, message):
    (tmp_path / "t.json").write_bytes(content)
    argv = [command, "{d}/t.json"] + (["--timeline", "{d}/m.png"] if command == "simulate"
                                      else [])
    _check(capsys, tmp_path, argv, message, outputs=["{d}/m.png"])


def test_trace_is_a_directory(capsys, tmp_path, guarded):
    (tmp_path / "d").mkdir()
    _check(capsys, tmp_path, ["info", "{d}/d"], "cannot read")


def test_trace_does_not_exist(capsys, tmp_path, guarded):
    _check(capsys, tmp_path, ["simulate", "{d}/none.json"], "no such file")


GOOD = ["simulate", "{d}/t.json"]
SIMULATE = {
    # lost data: an output that is an input or another output
    "chrome-trace-is-the-trace": (GOOD + ["--policy", "none", "--chrome-trace", "{d}/t.json"],
                                  "is the input trace"),
    "timeline-is-the-trace": (GOOD + ["--timeline", "{d}/t.json"], "is the input trace"),
    "timeline-via-dotdot": (GOOD + ["--timeline", "{d}/../" + "{base}/t.json"],
                            "is the input trace"),
    "outputs-collide": (GOOD + ["--policy", "none", "--timeline", "{d}/o.png",
                                "--chrome-trace", "{d}/o.png"], "are the same file"),
    "chrome-trace-symlink-to-trace": (GOOD + ["--policy", "none", "--chrome-trace",
                                              "{d}/link.json"], "is the input trace"),
    # budgets
    "budget-word": (GOOD + ["--budget", "lots"], "cannot read size 'lots'"),
    "budget-negative": (GOOD + ["--budget", "-1"], "cannot read size '-1'"),
    "budget-empty": (GOOD + ["--budget", ""], "cannot read size ''"),
    "budget-overflow": (GOOD + ["--budget", "1e400"], "larger than any memory"),
    "budget-huge-unit": (GOOD + ["--budget", "1e30TiB"], "larger than any memory"),
    "budget-huge-xlb": (GOOD + ["--budget", "1e300xlb"], "larger than any memory"),
    "budget-below-lb": (GOOD + ["--budget", "1MiB"], "impossible budget '1MiB'"),
    "budget-zero-xlb": (GOOD + ["--budget", "0xlb"], "positive finite multiple"),
    "budget-nan-xlb": (GOOD + ["--budget", "nanxlb"], "positive finite multiple"),
    "budget-word-xlb": (GOOD + ["--budget", "twoxlb"], "cannot read budget 'twoxlb'"),
    # policies, devices, plots
    "unknown-policy": (GOOD + ["--policy", "bogus"], "unknown policy 'bogus'"),
    "unknown-device": (GOOD + ["--device", "tpu9"], "unknown device model 'tpu9'"),
    "timeline-jpg": (GOOD + ["--timeline", "{d}/m.jpg"], "cannot tell the format from '.jpg'"),
    "timeline-no-ext": (GOOD + ["--timeline", "{d}/m"], "no extension"),
    "timeline-no-folder": (GOOD + ["--timeline", "{d}/nodir/m.png"], "does not exist"),
    "timeline-is-folder": (GOOD + ["--timeline", "{d}/sub.png"], "it is a folder"),
    "timeline-unwritable": (GOOD + ["--timeline", "/proc/snsim-m.png"], "cannot write"),
    "chrome-trace-all": (GOOD + ["--policy", "all", "--chrome-trace", "{d}/c.json"],
                         "needs one policy"),
    "no-such-option": (GOOD + ["--budgte", "1GiB"], "unrecognized arguments"),
    "no-trace-argument": (["simulate"], "the following arguments are required: trace"),
    "no-command": ([], "required: command"),
    "unknown-command": (["simulat", "{d}/t.json"], "invalid choice: 'simulat'"),
    "control-chars-in-policy": (GOOD + ["--policy", "x\x1b[2Jy"], "x\\x1b[2Jy"),
    # schedule and info
    "schedule-all": (["schedule", "{d}/t.json", "--policy", "all"],
                     "schedule needs one policy, got 'all'"),
    "schedule-bogus": (["schedule", "{d}/t.json", "--policy", "bogus"], "got 'bogus'"),
    "schedule-budget": (["schedule", "{d}/t.json", "--budget", "3 apples"],
                        "cannot read size '3 apples'"),
    "info-two-traces": (["info", "{d}/t.json", "{d}/t.json"], "unrecognized arguments"),
}


@pytest.mark.parametrize("argv, message", list(SIMULATE.values()), ids=list(SIMULATE))
def test_bad_simulate_argument(capsys, tmp_path, guarded, argv, message):
    (tmp_path / "t.json").write_bytes(_j(BASE))
    (tmp_path / "sub.png").mkdir()
    os.symlink(tmp_path / "t.json", tmp_path / "link.json")
    argv = [a.replace("{base}", tmp_path.name) for a in argv]
    _check(capsys, tmp_path, argv, message,
           outputs=["{d}/m.png", "{d}/o.png", "{d}/c.json", "{d}/m.jpg", "{d}/m"])


PROFILE = ["profile", "--model", "alexnet", "--batch", "2", "--input-shape", "3,32,32"]
PROFILE_CASES = {
    "no-arguments": (["profile"], "needs --model, --out"),
    "no-out": (PROFILE, "needs --out"),
    "batch-zero": (["profile", "--model", "alexnet", "--batch", "0", "--out", "{d}/p.json"],
                   "--batch must be at least 1, got 0"),
    "batch-word": (["profile", "--model", "alexnet", "--batch", "two"],
                   "invalid int value: 'two'"),
    "repeats-zero": (PROFILE + ["--repeats", "0", "--out", "{d}/p.json"], "--repeats"),
    "warmup-negative": (PROFILE + ["--warmup", "-1", "--out", "{d}/p.json"], "--warmup"),
    "shape-letters": (["profile", "--model", "alexnet", "--batch", "2", "--input-shape", "a,b",
                       "--out", "{d}/p.json"], "bad --input-shape 'a,b'"),
    "shape-zero": (["profile", "--model", "alexnet", "--batch", "2", "--input-shape", "3,0,4",
                    "--out", "{d}/p.json"], "bad --input-shape '3,0,4'"),
    "unknown-device-model": (PROFILE + ["--device-model", "k80x", "--out", "{d}/p.json"],
                             "unknown device model 'k80x'"),
    "device-and-device-model": (PROFILE + ["--device-model", "k40c", "--device", "cpu",
                                           "--out", "{d}/p.json"], "cannot be combined"),
    "device-choice": (PROFILE + ["--device", "tpu", "--out", "{d}/p.json"],
                      "invalid choice: 'tpu'"),
    "out-no-folder": (PROFILE + ["--out", "{d}/nodir/p.json"], "does not exist"),
    "out-is-folder": (PROFILE + ["--out", "{d}"], "it is a folder"),
    "out-unwritable": (PROFILE + ["--out", "/proc/snsim-p.json"], "cannot write"),
}


@pytest.mark.parametrize("argv, message", list(PROFILE_CASES.values()), ids=list(PROFILE_CASES))
def test_bad_profile_argument(capsys, tmp_path, guarded, argv, message):
    pytest.importorskip("torch")
    _check(capsys, tmp_path, argv, message, outputs=["{d}/p.json"])


# A model function's own answers can only be checked by calling it (inside the
# profiler, before any capture or timing), so these run without the guard.
FUNCTION_CASES = {
    "function-fractional-shape": (["profile", "--model", "toymodels:fractional_shape",
                                   "--batch", "2", "--out", "{d}/p.json"],
                                  "input shape (4.5,) that is not a sequence of integers"),
    "function-data-dependent": (["profile", "--model", "toymodels:data_dependent",
                                 "--out", "{d}/p.json"],
                                "without data-dependent control flow"),
    "function-batch-disagrees": (["profile", "--model", "toymodels:data_dependent",
                                  "--batch", "3", "--out", "{d}/p.json"], "batch"),
}


@pytest.mark.parametrize("argv, message", list(FUNCTION_CASES.values()), ids=list(FUNCTION_CASES))
def test_bad_model_function(capsys, tmp_path, argv, message):
    pytest.importorskip("torch")
    _check(capsys, tmp_path, argv, message, outputs=["{d}/p.json"])


VAL = ["validate", "--model", "toymodels:residual", "--batch", "2"]
VALIDATE = {
    "no-model": (["validate", "--batch", "2"], "needs --model"),
    "unknown-model": (["validate", "--model", "resnet19", "--batch", "2"],
                      "unknown model 'resnet19'"),
    "model-parameter": (["validate", "--model", "gpt:seq=64", "--batch", "2"],
                        "has no parameter 'seq'"),
    "shape-length": (["validate", "--model", "alexnet", "--batch", "2", "--input-shape", "32"],
                     "takes an input shape of 3 numbers"),
    "batch-zero": (["validate", "--model", "toymodels:residual", "--batch", "0"], "--batch"),
    "repeats-zero": (VAL + ["--repeats", "0"], "--repeats"),
    "unknown-policy": (VAL + ["--policy", "bogus"], "unknown policy 'bogus'"),
    "policy-all": (VAL + ["--policy", "all"], "unknown policy 'all'"),
    "budget-word": (VAL + ["--budget", "lots"], "--budget 'lots'"),
    "budget-overflow": (VAL + ["--budget", "1e400"], "larger than any memory"),
    "shape-bad": (VAL + ["--input-shape", "3,x"], "bad --input-shape"),
    "device-choice": (VAL + ["--device", "tpu"], "invalid choice: 'tpu'"),
    "trace-modeled": (VAL + ["--trace", MODELED], "is a modeled trace"),
    "trace-missing": (VAL + ["--trace", "{d}/none.json"], "no such file"),
    "trace-deep": (VAL + ["--trace", "{d}/deep.json"], "nested too deeply"),
    "trace-not-loss": (VAL + ["--trace", "{d}/noloss.json"], "must be the loss"),
    "trace-other-batch": (VAL + ["--trace", "{d}/t.json"], "is for batch 16"),
    "trace-other-device": (VAL + ["--trace", "{d}/cuda.json", "--device", "cpu"],
                           "was measured on cuda"),
    "suite-missing": (["validate", "--suite", "{d}/none.toml"], "none.toml"),
    "suite-out-is-the-suite": (["validate", "--suite", "{d}/s.toml", "--out", "{d}/s.toml"],
                               "exists and is not a folder"),
    "suite-out-unwritable": (["validate", "--suite", "{d}/s.toml", "--out", "/proc/snsim-rep"],
                             "cannot create report folder /proc/snsim-rep"),
    "suite-out-under-a-file": (["validate", "--suite", "{d}/s.toml", "--out", "{d}/t.json/rep"],
                               "cannot create report folder"),
}


@pytest.mark.parametrize("argv, message", list(VALIDATE.values()), ids=list(VALIDATE))
def test_bad_validate_argument(capsys, tmp_path, guarded, argv, message):
    pytest.importorskip("torch")
    from snsim.profile.profiler import cpu_name

    here = _doc()
    here["source"] = {**here["source"], "device_name": cpu_name()}  # no cross-CPU warning
    (tmp_path / "t.json").write_bytes(_j(here))
    (tmp_path / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    (tmp_path / "noloss.json").write_bytes(TRACES["last-not-loss"][0])
    cuda = _doc()
    cuda["source"] = {**cuda["source"], "device": "cuda"}
    (tmp_path / "cuda.json").write_bytes(_j(cuda))
    (tmp_path / "s.toml").write_text(
        '[suite]\nname = "s"\n[tolerance]\npeak_error_median = 0.1\npeak_error_max = 0.1\n'
        'time_error_median = 0.1\ntime_error_max = 0.1\ngrad_abs_max = 1e-5\n'
        '[[case]]\nmodel = "toymodels:residual"\nbatch = 2\npolicies = ["none"]\n')
    _check(capsys, tmp_path, argv, message)


def test_validate_warns_for_another_processor(tmp_path):
    """A trace measured on another CPU model is compared, with a warning."""
    pytest.importorskip("torch")
    from snsim.profile.profiler import cpu_name
    from snsim.validation.command import check_case
    from snsim.validation.run import Case

    doc = _doc()
    doc["source"] = {**doc["source"], "device_name": "Zilog Z80"}
    path = tmp_path / "t.json"
    path.write_bytes(_j(doc))
    warning = check_case(Case(model="alexnet", batch=16, policy="none"), str(path))
    assert "Zilog Z80" in warning and "across processors" in warning
    doc["source"]["device_name"] = cpu_name()
    path.write_bytes(_j(doc))
    assert check_case(Case(model="alexnet", batch=16, policy="none"), str(path)) is None


@pytest.mark.parametrize("argv", [["info"], ["simulate", "--policy", "none"],
                                  ["simulate", "--policy", "all", "--budget", "1.01xlb"]])
def test_control_characters_never_reach_the_terminal(capsys, tmp_path, argv):
    """Names from a user's file are printed with control characters escaped."""
    doc = _doc(model="evil\x1b[2J")
    for la in doc["layers"]:
        la["name"] = f"L\x07{la['id']}"
    (tmp_path / "t.json").write_bytes(_j(doc))
    assert main([argv[0], str(tmp_path / "t.json"), *argv[1:]]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "evil\\x1b[2J" in out

"""Bad suite files: one line naming the file and what is wrong, exit 2, no report folder."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from snsim.cli import main  # noqa: E402
from snsim.validation.suite import Suite, SuiteCase, load_suite  # noqa: E402

GOOD_TOL = """
[tolerance]
peak_error_median = 0.03
peak_error_max = 0.1
time_error_median = 0.1
time_error_max = 0.25
grad_abs_max = 1e-5
"""
CASE = """
[[case]]
model = "resnet18"
batch = 2
input_shape = [3, 32, 32]
policies = ["liveness"]
"""


def _suite(**over):
    parts = {"suite": '[suite]\nname = "t"\nrepeats = 1\n', "tol": GOOD_TOL, "case": CASE}
    parts.update(over)
    return "".join(parts.values())


def test_training_keys_are_read_and_checked(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(_suite(case=CASE + 'optimizer = "adamw"\ngrads = "set-to-none"\namp = "bf16"\n'))
    c = load_suite(p).cases[0]
    assert (c.optimizer, c.grads, c.amp) == ("adamw", "set-to-none", "bf16")
    p.write_text(_suite(case=CASE + 'optimizer = "lamb"\n'))
    with pytest.raises(Exception, match="optimizer must be one of none, sgd, momentum"):
        load_suite(p)


BAD = [
    (_suite(suite='[suite]\nrepeats = "abc"\n'), "[suite] repeats must be an integer"),
    (_suite(suite="[suite]\nrepeats = -3\n"), "[suite] repeats must be an integer of at least 1"),
    (_suite(suite="[suite]\nwarmup = 1.5\n"), "[suite] warmup must be an integer"),
    (_suite(suite="suite = 3\n"), "[suite] must be a table"),
    (_suite(suite="[suite]\nbugdet = 1\n"), "[suite] has unknown key 'bugdet'"),
    (_suite(case=CASE.replace("batch = 2", 'batch = "two"')), "case 1: batch must be an integer"),
    (_suite(case=CASE.replace('["liveness"]', "[]")), "case 1: policies must be a non-empty"),
    (_suite(case=CASE.replace('["liveness"]', '"liveness"')), "policies must be a non-empty list"),
    (_suite(case=CASE + 'bugdet = "1.2xlb"\n'), "case 1 has unknown key 'bugdet'"),
    (_suite(case=CASE.replace("[3, 32, 32]", '"3,32,32"')), "input_shape must be a list"),
    (_suite(case=CASE.replace('["liveness"]', '["livenes"]')), "unknown policy 'livenes'"),
    (_suite(case=CASE + 'budget = "12 apples"\n'), "budget"),
    (_suite(case=CASE + "budget = 3\n"), "case 1: budget must be a string"),
    (_suite(case=""), "needs at least one [[case]]"),
    (_suite(tol=GOOD_TOL.replace("grad_abs_max = 1e-5", "")), "needs a number for grad_abs_max"),
    (_suite(tol=GOOD_TOL + "peak_eror_max = 1\n"), "[tolerance] has unknown key"),
    (_suite() + "[extra]\n", "unknown table 'extra'"),
    ("[suite\n", "invalid TOML"),
    (_suite(case=CASE + CASE.replace("resnet18", "resnet19")), "case 2 (resnet19): unknown model"),
    (_suite(case=CASE.replace("[3, 32, 32]", "[32, 32]")), "takes an input shape of 3 numbers"),
    (_suite(case=CASE.replace('"resnet18"', '"gpt:seq=128"')), "has no parameter 'seq'"),
    (_suite(case=CASE + 'optimizer = "adam"\noffload_optimizer = "yes"\n'),
     "offload_optimizer must be true or false"),
    (_suite(case=CASE + "offload_optimizer = true\n"), "needs an optimizer with a step"),
    (_suite(case=CASE + 'optimizer = "adam"\noffload_optimizer = true\n'),
     "offload_optimizer is an option of the swapping policies, not of liveness"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_suite_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "s.toml"
    path.write_text(text)
    before = path.read_bytes()
    out = tmp_path / "rep"
    assert main(["validate", "--suite", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not out.exists()            # nothing written, not even an empty folder
    assert path.read_bytes() == before


def test_binary_file_and_directory(tmp_path, capsys):
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe\x00\x01garbage")
    assert main(["validate", "--suite", str(binary)]) == 2
    assert "not a text (TOML) file" in capsys.readouterr().err
    assert main(["validate", "--suite", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_out_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(_suite())
    out = tmp_path / "taken"
    out.write_text("keep me")
    assert main(["validate", "--suite", str(path), "--out", str(out)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert out.read_text() == "keep me"


def test_good_suite_is_a_typed_record(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(_suite())
    s = load_suite(path)
    assert isinstance(s, Suite) and s.repeats == 1 and s.warmup == 2 and s.name == "t"
    assert s.cases == (SuiteCase("resnet18", 2, ("liveness",), (3, 32, 32), None),)
    assert s.tolerance.grad_abs_max == 1e-5


def test_infeasible_predictions_stay_out_of_the_statistics():
    """A case the simulator predicts infeasible ran truncated: its errors do not
    enter the medians or the failures; all infeasible is a failure of its own."""
    import pandas as pd

    from snsim.validation.suite import Tolerance, check

    tol = Tolerance(0.03, 0.1, 0.1, 0.25, 1e-5)
    row = dict(label="m/p", peak_error=0.01, time_error=0.02, max_grad_abs_diff=0.0,
               feasible=True)
    df = pd.DataFrame([row, {**row, "label": "m/q", "peak_error": 0.9, "time_error": 0.986,
                             "feasible": False}])
    v = check(df, tol)
    assert (v.peak_median, v.peak_max, v.time_median, v.time_max) == (0.01, 0.01, 0.02, 0.02)
    assert v.failures == ()
    v = check(df[~df["feasible"]], tol)
    assert v.failures == ("no case was predicted feasible: nothing to compare",)

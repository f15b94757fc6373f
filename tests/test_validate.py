"""Validation in CI: a small subset of the suite, and the command's smoke runs."""

from __future__ import annotations

import json
import pathlib

import pytest

pytest.importorskip("torch")

from snsim.cli import main  # noqa: E402
from snsim.validation.run import Case, Session, validate_case  # noqa: E402

SESSION = Session()
R18 = str(pathlib.Path(__file__).parent.parent / "traces" / "cpu_resnet18_b8_64.json")


@pytest.mark.parametrize("model, shape, policy, budget", [
    ("toymodels:residual", None, "liveness", None),
    ("toymodels:residual", None, "utp", "1.2xlb"),
    ("toymodels:concat", None, "cost-aware", None),
    ("gpt:layers=1,heads=2,width=64,vocab=200", (32,), "superneurons", None),
])
def test_predicted_peak_matches_measured(model, shape, policy, budget):
    out = validate_case(Case(model, 4, policy, shape, budget, repeats=2, warmup=1), SESSION)
    assert out.max_grad_abs_diff <= 1e-5
    assert abs(out.peak_error) <= 0.10, out.to_dict()
    assert out.measured_step_ms > 0 and out.predicted_step_ms > 0   # no timing assertion


def test_validate_json(capsys):
    code = main(["validate", "--model", "toymodels:concat", "--batch", "2", "--policy",
                 "best", "--repeats", "1", "--warmup", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("policy", "predicted_peak_bytes", "measured_peak_bytes", "peak_error",
                "predicted_step_ms", "measured_step_ms", "time_error", "max_grad_abs_diff",
                "feasible"):
        assert key in out
    assert out["policy"] != "best"


def test_validate_suite_writes_report(tmp_path, capsys):
    suite = tmp_path / "tiny.toml"
    suite.write_text("""
[suite]
name = "tiny"
repeats = 1
warmup = 0
baselines = true
[tolerance]
peak_error_median = 0.10
peak_error_max = 0.10
time_error_median = 10.0
time_error_max = 10.0
grad_abs_max = 1e-5
[[case]]
model = "toymodels:residual"
batch = 2
policies = ["liveness", "cost-aware"]
""")
    code = main(["validate", "--suite", str(suite), "--out", str(tmp_path / "rep")])
    out = capsys.readouterr().out
    assert code == 0, out
    names = sorted(p.name for p in (tmp_path / "rep").iterdir())
    assert names == ["report.md", "results.csv", "results.json", "scatter.png"]
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "Verdict: PASS" in report and "autograd" in report


@pytest.mark.parametrize("argv, message", [
    (["validate", "--batch", "2"], "needs --model"),
    (["validate", "--model", "nosuchmodel", "--batch", "2"], "nosuchmodel"),
    (["validate", "--model", "toymodels:concat", "--batch", "2", "--policy", "bogus"],
     "unknown policy 'bogus'"),
    (["validate", "--suite", "/nonexistent.toml"], "no such suite file"),
    (["validate", "--model", "resnet18", "--batch", "4", "--trace",
      R18], "is for batch 8, input [3, 64, 64]"),
    (["validate", "--model", "resnet18", "--batch", "8", "--trace",
      R18], "does not describe resnet18 at this input"),
])
def test_validate_errors(capsys, argv, message):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_real_run_shows_its_phases(capsys):
    """The real run (after the profile's own bars) reports each phase on stderr."""
    session = Session(progress=True)
    validate_case(Case("toymodels:residual", 2, "liveness", repeats=1, warmup=0), session)
    err = capsys.readouterr().err
    phases = ["build the model", "gradients against autograd", "peak memory", "step time"]
    at = [err.find(p) for p in phases]
    assert -1 not in at and at == sorted(at), err[-2000:]
    assert session.bar is None   # closed


def test_validate_infeasible_plan_shows_no_peak_error(capsys):
    """A plan the simulator finds infeasible has a partial prediction: no error beside it."""
    code = main(["validate", "--model", "toymodels:residual", "--batch", "4", "--policy",
                 "sqrt-n", "--budget", "1.0xlb", "--repeats", "1", "--warmup", "0",
                 "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    assert "INFEASIBLE" in text
    peak_line = next(line for line in text.splitlines() if "peak memory" in line)
    assert "no prediction to compare" in peak_line and "error" not in peak_line
    assert "predicted" not in next(line for line in text.splitlines() if "step time" in line)


def test_grad_difference_matches_overflow_element_for_element():
    """An fp16 backward that overflowed its loss scale (the step GradScaler skips)
    agrees when both sides overflowed in the same elements; one side only, or a
    different element, is a difference."""
    import torch

    from snsim.validation.run import grad_difference

    inf, nan = float("inf"), float("nan")
    a = torch.tensor([1.0, inf, 3.0, nan])
    assert grad_difference(["w"], [a], [torch.tensor([1.0, inf, 3.5, nan])]) == (0.5, "w")
    for other in ([1.0, 2.0, 3.0, nan], [1.0, -inf, 3.0, nan], [inf, 1.0, 3.0, nan],
                  [1.0, inf, 3.0, 4.0]):
        assert grad_difference(["w"], [a], [torch.tensor(other)]) == (inf, "w")
    assert grad_difference(["w"], [torch.tensor([inf])], [torch.tensor([inf])]) == (0.0, None)
    assert grad_difference(["w"], [torch.tensor([2.0])], [None]) == (2.0, "w")

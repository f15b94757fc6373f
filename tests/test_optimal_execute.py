"""Policy optimal's plans run for real: ``snsim validate --policy optimal``,
and the MILP's own decoded plan (gradient swaps, recomputations) in the
executor against plain autograd (issue 15: "the real executor can run it")."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("highspy")

from snsim.cli import main  # noqa: E402
from snsim.graph import Graph  # noqa: E402
from snsim.policies.finishing import finish  # noqa: E402
from snsim.policies.optimal.decode import decode  # noqa: E402
from snsim.policies.optimal.formulation import build  # noqa: E402
from snsim.policies.optimal.solve import solve  # noqa: E402
from snsim.policies.replay import with_optimizer_step  # noqa: E402
from snsim.schedule import verify  # noqa: E402
from snsim.schedule.ops import Compute, Offload, Prefetch  # noqa: E402
from snsim.sim import simulate  # noqa: E402
from snsim.validation import run  # noqa: E402
from snsim.validation.run import Case, Session  # noqa: E402

SESSION = Session()


def test_validate_runs_optimal_by_name(capsys):
    code = main(["validate", "--model", "toymodels:residual", "--batch", "4", "--policy",
                 "optimal", "--budget", "1.0xlb", "--time-limit", "5", "--repeats", "1",
                 "--warmup", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["policy"] == "optimal" and out["feasible"]
    stats = out["policy_stats"]
    assert stats["source"] and stats["status"] and stats["optimality_gap"] is not None
    assert abs(out["peak_error"]) <= 0.01, out
    assert out["max_grad_abs_diff"] <= 1e-5


def test_validate_text_names_the_plan_optimal_returned(capsys):
    code = main(["validate", "--model", "toymodels:concat", "--batch", "2", "--policy",
                 "optimal", "--time-limit", "5", "--serial", "--repeats", "1", "--warmup", "0",
                 "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    line = next(x for x in text.splitlines() if x.strip().startswith("plan"))
    assert "optimal's status" in line and "gap" in line


@pytest.mark.parametrize("argv, message", [
    (["--time-limit", "0"], "expected a positive number of seconds, not '0'"),
    (["--policy", "bogus"], "optimal"),   # the reference policy is among the choices
])
def test_validate_optimal_errors(capsys, argv, message):
    base = ["validate", "--model", "toymodels:concat", "--batch", "2", "--policy", "optimal"]
    try:
        code = main(base + argv)
    except SystemExit as exc:   # argparse's own refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def milp_predict(info: dict, h2d_scale: float = 1.0):
    """A ``run.predict`` that plans with the MILP alone (solved, decoded) on the
    trace with its host link ``h2d_scale`` times as fast, and predicts on the
    trace as profiled."""
    def predict(graph, policy, budget, options=None):
        dev = graph.trace.device
        slow = dataclasses.replace(dev, h2d_Bps=dev.h2d_Bps * h2d_scale,
                                   d2h_Bps=dev.d2h_Bps * h2d_scale)
        plan_g = Graph(dataclasses.replace(graph.trace, device=slow))
        f = build(plan_g, budget)
        sol = solve(f.milp, 30)
        assert sol.status == "optimal", sol.status
        ops, peak = decode(f, sol.values)
        sched = finish("optimal", graph, with_optimizer_step(graph, ops), budget, {})
        verify(graph, sched)
        if h2d_scale == 1.0:   # the model's time and peak are the simulator's
            r = simulate(plan_g, sched, budget)
            assert r.iteration_ms == pytest.approx(sol.objective + graph.optimizer_ms,
                                                   rel=1e-6, abs=1e-3)
            assert r.peak_bytes == peak
        info["grad_swaps"] = sum(1 for o in ops if type(o) is Offload and o.tensor in f.grads)
        info["recomputes"] = sum(1 for o in ops if type(o) is Compute and o.phase == "R")
        # saved extras brought back after their layer's recomputation made new ones
        remade = set()
        info["extras_back_after_remake"] = 0
        for o in ops:
            if type(o) is Compute and o.phase == "R" and ("S", o.layer) in graph.allocs_map[o.step]:
                remade.add(("S", o.layer))
            elif type(o) is Prefetch and o.tensor in remade:
                info["extras_back_after_remake"] += 1
        return sched, simulate(graph, sched, budget)
    return predict


@pytest.mark.parametrize("model, batch, shape, h2d_scale, what", [
    ("resnet18", 2, (3, 32, 32), 1.0, "grad_swaps"),
    ("toymodels:residual", 4, None, 1e-4, "recomputes"),
])
def test_milp_plan_runs_for_real(monkeypatch, model, batch, shape, h2d_scale, what):
    """The MILP's decoded plan at the lower bound, executed: the executor's peak
    is the prediction and its gradients are autograd's.  With the trace's own
    link it swaps gradients (ResNet-18's block inputs'); with a link 10^4 times
    slower it recomputes."""
    info: dict = {}
    monkeypatch.setattr(run, "predict", milp_predict(info, h2d_scale))
    out = run.validate_case(Case(model, batch, "optimal", shape, "1.0xlb", repeats=1,
                                 warmup=0), SESSION)
    assert info[what] > 0, info
    assert out.feasible
    assert abs(out.peak_error) <= 0.005, out.to_dict()
    assert out.max_grad_abs_diff <= 1e-5


SUITE = """
[suite]
name = "opt"
repeats = 1
warmup = 0
baselines = false
time_limit = {limit}
[tolerance]
peak_error_median = 0.01
peak_error_max = 0.01
time_error_median = 10.0
time_error_max = 10.0
grad_abs_max = 1e-5
[[case]]
model = "toymodels:residual"
batch = 2
budget = "1.0xlb"
policies = ["optimal", "superneurons"]
"""


def test_validate_suite_runs_optimal_with_its_time_limit(tmp_path, capsys):
    suite = tmp_path / "opt.toml"
    suite.write_text(SUITE.format(limit=5))
    code = main(["validate", "--suite", str(suite), "--out", str(tmp_path / "rep")])
    out, err = capsys.readouterr()
    assert code == 0, out
    assert "case/s" not in err   # no progress bars where stderr is not a terminal
    got = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert got["provenance"]["config"]["time_limit"] == 5.0
    assert [r["policy"] for r in got["results"]] == ["optimal", "superneurons"]


@pytest.mark.parametrize("limit", ["0", "-3", "'soon'", "true"])
def test_validate_suite_refuses_a_bad_time_limit(tmp_path, capsys, limit):
    suite = tmp_path / "opt.toml"
    suite.write_text(SUITE.format(limit=limit))
    code = main(["validate", "--suite", str(suite), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and "time_limit must be a positive number of seconds" in err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("model, factor", [
    ("transposed_linear", 1.1), ("transposed_linear", 1.2), ("transposed_linear", 1.3),
    ("mha_classifier", 1.0), ("mha_classifier", 1.2), ("lstm_lm", 1.0),
])
def test_milp_rows_count_the_hand_over_a_measured_trace_measured(model, factor):
    """A measured trace's backward step that hands its dying reads to autograd
    peaks at ``bwd_released`` above its level (the ledger's rule), not at its
    allocation and workspace: more on a transposed-linear model (644 B at B3:
    its MILP plan at 1.2x ran 27 B over budget when the row counted the
    latter), less on an attention model (81,920 against 262,144 B at B2: the
    class was empty at 1.0x-1.2x, where superneurons fits) and the LSTM LM
    (empty at 1.0x).  The row counts the hand-over's, or the step's own where
    a dying read's latest copy is an offload (``formulation.step_peaks``);
    the plan fits, its decoded peak and time are the simulator's."""
    graph = Graph(Session().trace(Case(f"tests.families:{model}", None, "optimal")))
    cap = int(graph.lower_bound_bytes * factor)
    f = build(graph, cap)
    sol = solve(f.milp, 30)
    assert sol.status == "optimal"
    ops, peak = decode(f, sol.values)
    sched = finish("optimal", graph, with_optimizer_step(graph, ops), cap, {})
    verify(graph, sched)
    r = simulate(graph, sched, cap)
    assert r.feasible, r.reason
    assert r.peak_bytes == peak <= cap
    assert r.iteration_ms == pytest.approx(sol.objective + graph.optimizer_ms, rel=1e-6, abs=1e-6)

"""`snsim experiment`: the list, every experiment's --quick run with its four files,
and bad input refused in one line before any work."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest

from snsim.cli import main
from snsim.experiments import EXPERIMENTS, names, paper_names

PAPER = ["peak-memory", "memory-timeline", "max-depth", "max-batch", "throughput", "overlap",
         "link-whatif", "fidelity", "budget-sweep"]
REFERENCE = ["optimality-gap"]   # not in `all`: needs highspy (snsim[optimal])
HAVE_HIGHS = importlib.util.find_spec("highspy") is not None


def test_list(capsys):
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr()[0].splitlines()
    assert [line.split()[0] for line in out] == names() == PAPER + REFERENCE
    assert paper_names() == PAPER


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp")
    for name in PAPER + (REFERENCE if HAVE_HIGHS else []):  # in this process; they share
        assert main(["experiment", name, "--quick", "--out", str(out),   # the points' cache
                     "--workers", "1", "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("name", PAPER + REFERENCE)
def test_quick_run_writes_csv_png_pdf_config(quick_out, name):
    if name in REFERENCE and not HAVE_HIGHS:
        pytest.skip("needs highspy")
    t = pd.read_csv(quick_out / f"{name}.csv")
    assert len(t) > 0
    assert (quick_out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (quick_out / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    cfg = json.loads((quick_out / f"{name}.config.json").read_text())
    assert cfg["config"]["experiment"] == name and cfg["config"]["quick"] is True
    assert cfg["rows"] == len(t) and cfg["versions"]["snsim"]


def test_quick_max_depth_separates_policies(quick_out):
    t = pd.read_csv(quick_out / "max-depth.csv").set_index("policy")
    d = t.depth.fillna(0)  # `none` fits no member of the family in the quick budget
    assert d["superneurons"] > d["liveness"] > 0 and d["none"] <= d["liveness"]
    for p in t.index:  # the first failing depth is the next one of the family
        assert t.first_failing_depth[p] == (d[p] + 3 if d[p] else 137)
    assert t.x_liveness["liveness"] == 1.0


def test_quick_peak_memory_least_is_at_most_every_feasible_peak(quick_out):
    t = pd.read_csv(quick_out / "peak-memory.csv")
    ok = t[t.feasible]
    least = ok[ok.least].set_index(["network", "policy"]).peak_bytes
    assert (ok.peak_bytes.values >= least.reindex(
        list(zip(ok.network, ok.policy))).values).all()
    sn = ok[ok.least & (ok.policy == "superneurons")]
    assert (sn.peak_bytes <= 1.0 * sn.lower_bound_bytes * 1.0 + 1).all()  # reaches the bound


@pytest.mark.parametrize("argv,words", [
    (["nope"], "unknown experiment"),
    ([], "NAME or --list"),
    (["peak-memory", "--workers", "0"], "--workers"),
    (["peak-memory", "--scheduler", "localhost:8786"], "tcp://"),
])
def test_bad_input_is_one_line(capsys, tmp_path, argv, words):
    assert main(["experiment", *argv, "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_out_that_is_a_file(capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["experiment", "overlap", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr()[1]


def test_every_entry_loads():
    for e in EXPERIMENTS.values():
        assert callable(e.load())


def test_experiment_on_a_dask_cluster(tmp_path, capsys):
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        assert main(["experiment", "budget-sweep", "--quick", "--out", str(tmp_path),
                     "--scheduler", cluster.scheduler_address, "--no-progress"]) == 0
    t = pd.read_csv(tmp_path / "budget-sweep.csv")
    assert len(t) == 15 and t.feasible.any()
    cfg = json.loads((tmp_path / "budget-sweep.config.json").read_text())
    assert cfg["config"]["scheduler"] == cluster.scheduler_address


def test_a_repeated_max_depth_plans_no_probe(quick_out):
    first = pd.read_csv(quick_out / "max-depth.csv")
    assert main(["experiment", "max-depth", "--quick", "--out", str(quick_out), "--workers",
                 "1", "--no-progress"]) == 0
    again = pd.read_csv(quick_out / "max-depth.csv")
    assert (again.planned == 0).all() and (again.probes == first.probes).all()
    cols = ["policy", "depth", "peak_bytes", "iteration_ms", "first_failing_depth"]
    assert again[cols].equals(first[cols])


def test_parquet_copy(tmp_path, capsys):
    import importlib.util

    argv = ["experiment", "overlap", "--quick", "--out", str(tmp_path), "--workers", "1",
            "--no-progress", "--parquet"]
    if importlib.util.find_spec("pyarrow") is None:
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "pyarrow" in err
        assert not list(tmp_path.iterdir())
        return
    assert main(argv) == 0
    csv = pd.read_csv(tmp_path / "overlap.csv")
    pq = pd.read_parquet(tmp_path / "overlap.parquet")
    assert list(pq.columns) == list(csv.columns) and len(pq) == len(csv)


@pytest.mark.skipif(not HAVE_HIGHS, reason="needs highspy")
def test_quick_optimality_gap_puts_every_heuristic_at_or_above_the_optimum(quick_out):
    """``optimal`` returns the best heuristic's plan when that is faster, so no
    heuristic runs faster than its row; its time is at or above both bounds."""
    t = pd.read_csv(quick_out / "optimality-gap.csv")
    assert set(t.policy) == {"optimal", "superneurons", "dtr", "utp", "cost-aware", "sqrt-n",
                             "vdnn-all"}
    opt = t[t.policy == "optimal"]
    assert opt.feasible.all() and len(opt) == 2 * 3   # two traces, three budgets
    assert (opt.over_optimal == 1.0).all()
    assert (opt.iteration_ms >= opt.bound_ms * (1 - 1e-9)).all()
    assert (opt.bound_ms >= opt.schedule_bound_ms * (1 - 1e-9)).all()
    assert (opt.schedule_bound_ms >= opt.compute_ms * (1 - 1e-9)).all()
    h = t[(t.policy != "optimal") & t.feasible]
    assert len(h) and (h.over_optimal >= 1 - 1e-9).all()
    assert (t[~t.feasible].over_optimal.isna()).all()


def test_optimality_gap_runs_optimal_in_one_process_beside_other_workers(quick_out, tmp_path):
    """With several workers (or a cluster) each point's ``optimal`` keeps to one
    busy process (its option ``serial``): the workers fill the cores."""
    from snsim.experiments.base import Options
    from snsim.experiments.optimality import optimal_options

    assert optimal_options(Options(tmp_path, workers=1), 20.0) == (("time_limit", 20.0),)
    assert optimal_options(Options(tmp_path, workers=2), 20.0) == (
        ("serial", True), ("time_limit", 20.0))
    assert optimal_options(Options(tmp_path, workers=1, scheduler="tcp://x:1"), 20.0)[0] == (
        "serial", True)
    if HAVE_HIGHS:   # the quick run here had one worker
        cfg = json.loads((quick_out / "optimality-gap.config.json").read_text())
        assert cfg["config"]["serial"] is False


def test_optimality_gap_without_the_solver_is_one_line(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "highspy", None)
    out_dir = tmp_path / "figs"
    assert main(["experiment", "optimality-gap", "--quick", "--out", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "snsim[optimal]" in err
    assert not out_dir.exists()   # checked before --out is made


def test_missing_input_is_one_line_before_any_output(tmp_path, monkeypatch, capsys):
    """fidelity without the validation report it reads: refused before --out is made."""
    from pathlib import Path

    from snsim.experiments import fidelity

    monkeypatch.setattr(fidelity, "REPORT", Path("no-such-report") / "results.csv")
    monkeypatch.chdir(tmp_path)
    out_dir = tmp_path / "figs"
    assert main(["experiment", "fidelity", "--out", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "validation report" in err
    assert not out_dir.exists()

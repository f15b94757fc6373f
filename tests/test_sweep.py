"""Sweeps: one row per point, cached by content, resumed after an interrupt, on local
processes and on a Dask LocalCluster; and the evaluation record they are made of."""

from __future__ import annotations

import json
import pathlib

import pytest

from snsim.evaluate import evaluate, evaluate_many
from snsim.graph import Graph
from snsim.sweep import Point, TraceSpec, grid, point_key, run_sweep

ROOT = pathlib.Path(__file__).parent.parent
SMALL = str(ROOT / "traces" / "cpu_resnet18_b8_64.json")
R50 = TraceSpec("resnet", stages=(3, 4, 6, 3), batch=2, device_model="k40c")


def _points():
    return grid([TraceSpec("file", path=SMALL), R50], ["liveness", "superneurons", "none"],
                budget_factor=[1.0, 1.5])


def test_evaluate_record(chain4):
    g = Graph(chain4)
    e = evaluate(g, "liveness")
    assert e.policy == "liveness" and e.feasible and e.result.peak_bytes == e.row()["peak_bytes"]
    assert e.plan_s >= 0 and e.simulate_s >= 0 and "policy_stats" not in e.row()
    many = evaluate_many(g, ["none", "liveness"], budget_bytes=10**6)
    assert [m.policy for m in many] == ["none", "liveness"]
    assert many[1].result.peak_bytes == e.result.peak_bytes


def test_sweep_rows_and_infeasible_reasons(tmp_path):
    res = run_sweep(_points(), tmp_path / "c", progress=False)
    t = res.table
    assert len(t) == 12 and res.computed == 12 and res.cached == 0
    assert set(t.policy) == {"liveness", "superneurons", "none"}
    # at the lower bound `none` cannot fit; its row says why
    bad = t[(t.policy == "none") & (t.budget_factor == 1.0)]
    assert not bad.feasible.any() and bad.reason.str.len().min() > 0
    assert (t[t.feasible].peak_bytes <= t[t.feasible].budget_bytes).all()
    again = run_sweep(_points(), tmp_path / "c", progress=False)
    assert again.computed == 0 and again.cached == 12
    assert again.table.drop(columns=["plan_s", "simulate_s"]).equals(
        t.drop(columns=["plan_s", "simulate_s"]))


def test_key_follows_the_trace_content(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(pathlib.Path(SMALL).read_text())
    p = Point(TraceSpec("file", path=str(a)), "liveness")
    k1 = point_key(p)
    from snsim.sweep import trace_sha256

    doc = json.loads(a.read_text())
    doc["layers"][1]["fwd_ms"] += 1.0
    a.write_text(json.dumps(doc))
    trace_sha256.cache_clear()
    assert point_key(p) != k1
    assert point_key(Point(R50, "liveness")) != point_key(Point(R50, "none"))
    # planner options (optimal's time limit) are part of the point
    o = [point_key(Point(R50, "optimal", options=(("time_limit", s),))) for s in (5.0, 60.0)]
    assert o[0] != o[1] != point_key(Point(R50, "optimal"))


def test_key_follows_the_code_version(tmp_path, monkeypatch):
    """A sweep rerun into the same cache after snsim's source changed (a policy
    fixed) recomputes its points instead of returning the old rows."""
    from snsim.search import cache

    pts = grid([TraceSpec("file", path=SMALL)], ["liveness", "none"], budget_factor=[1.5])
    first = run_sweep(pts, tmp_path / "c", progress=False)
    assert first.computed == 2
    assert run_sweep(pts, tmp_path / "c", progress=False).cached == 2
    k = point_key(pts[0])
    monkeypatch.setattr(cache, "code_sha256", lambda: "0" * 64)   # another code version
    assert point_key(pts[0]) != k
    again = run_sweep(pts, tmp_path / "c", progress=False)
    assert again.computed == 2 and again.cached == 0
    stored = json.loads((tmp_path / "c" / f"{point_key(pts[0])}.json").read_text())
    assert stored["code_sha256"] == "0" * 64


def test_interrupted_sweep_resumes_without_losing_a_point(tmp_path):
    pts = _points()
    seen = []

    def stop_after_three(i, row):
        seen.append(i)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(pts, tmp_path / "c", progress=False, on_point=stop_after_three)
    files = sorted((tmp_path / "c").glob("*.json"))
    assert len(files) == 3 and not list((tmp_path / "c").glob(".*"))  # no partial file
    redo = []
    res = run_sweep(pts, tmp_path / "c", progress=False, on_point=lambda i, r: redo.append(i))
    assert res.cached == 3 and res.computed == len(pts) - 3
    assert not set(redo) & set(seen) and sorted(redo + seen) == list(range(len(pts)))


def _many():
    return grid([R50], ["liveness", "superneurons", "sqrt-n"],
                budget_factor=[1.0 + k / 20 for k in range(40)])


def test_killed_sweep_process_resumes(tmp_path):
    """A real Ctrl-C (SIGINT to the whole process group, as a terminal sends it) to a
    sweep on two worker processes, mid-run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            "from test_sweep import _many\nfrom snsim.sweep import run_sweep\n"
            f"run_sweep(_many(), {str(tmp_path / 'c')!r}, workers=2, progress=False)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((tmp_path / "c").glob("*.json"))) < 3:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err  # it was stopped mid-run
    assert not list((tmp_path / "c").glob(".*"))  # no temporary file left behind
    kept = {p.name for p in (tmp_path / "c").glob("*.json")}
    assert 3 <= len(kept) < len(_many())
    for p in (tmp_path / "c").glob("*.json"):
        json.loads(p.read_text())  # every file whole
    res = run_sweep(_many(), tmp_path / "c", progress=False)
    assert res.cached == len(kept) and res.cached + res.computed == len(_many())


def test_local_processes_equal_in_process(tmp_path):
    a = run_sweep(_points(), tmp_path / "a", progress=False).table
    b = run_sweep(_points(), tmp_path / "b", workers=2, progress=False).table
    cols = ["policy", "feasible", "peak_bytes", "iteration_ms", "budget_bytes"]
    assert a[cols].equals(b[cols])


def test_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        addr = cluster.scheduler_address
        assert addr.startswith("tcp://127.0.0.1:")
        d = run_sweep(_points(), tmp_path / "d", scheduler=addr, progress=False)
    a = run_sweep(_points(), tmp_path / "a", progress=False).table
    cols = ["policy", "feasible", "peak_bytes", "iteration_ms", "budget_bytes"]
    assert d.computed == 12 and d.table[cols].equals(a[cols])


def test_bad_scheduler_is_one_error(tmp_path):
    pytest.importorskip("dask.distributed")
    from snsim.errors import SnsimError

    with pytest.raises(SnsimError, match="Dask scheduler"):
        run_sweep(_points()[:1], tmp_path / "x", scheduler="tcp://127.0.0.1:1")

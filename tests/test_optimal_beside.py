"""The split bound worked out beside the heuristics in a child process
(``snsim.policies.optimal.beside``, note 3 of the package): the same bound
as in-process on the tiny traces, the child's last sum kept when it is
killed, and no child left behind when planning fails."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from snsim.graph import Graph
from snsim.policies.base import PlanContext

pytest.importorskip("highspy")

from snsim.policies import optimal, plan  # noqa: E402
from snsim.policies.optimal import beside, child  # noqa: E402
from test_optimal import SLOW, chain5, residual  # noqa: E402
from test_optimal_deadline import children  # noqa: E402

posix = pytest.mark.skipif(not child.available(), reason="needs os.fork")
proc = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")


def planned(g, budget, monkeypatch, on: bool) -> dict:
    monkeypatch.setattr(optimal, "SUFFIX_NONZEROS", 0)   # every model counts as large
    monkeypatch.setattr(optimal, "BESIDE", on)
    return plan("optimal", PlanContext(g, budget, {"time_limit": 20.0})).stats


@posix
@pytest.mark.parametrize("trace, device, factor", [(chain5, SLOW, 1.1), (residual, None, 1.1),
                                                   (chain5, SLOW, 1.0)])
def test_beside_gives_the_in_process_bound(trace, device, factor, monkeypatch):
    g = Graph(trace() if device is None else trace(device))
    budget = int(g.lower_bound_bytes * factor)
    here = planned(g, budget, monkeypatch, False)
    there = planned(g, budget, monkeypatch, True)
    assert there["status"] == here["status"]
    assert there["bound_ms"] == pytest.approx(here["bound_ms"], abs=1e-6)
    assert there.get("milp_columns") == here.get("milp_columns")
    if here["status"] == "split-bound":
        assert there["suffix_windows"] == here["suffix_windows"]


@posix
def test_collect_keeps_the_last_sum_of_a_killed_child():
    def work(channel):
        channel.send("size", {"columns": 3, "rows": 2})
        channel.send("bound", 1.5)
        channel.send("bound", 2.5)
        time.sleep(30)
    t = time.perf_counter()
    bs = beside.Beside(10.0)
    bs.running = child.start(work)
    got = beside.collect(bs, time.perf_counter() + 0.5)
    assert time.perf_counter() - t < 2.0
    assert not got.done and not got.small and got.status == "time-limit"
    assert got.bound == 2.5 and (got.columns, got.rows) == (3, 2)
    bs.running = child.start(lambda channel: time.sleep(30))
    assert beside.collect(bs, time.perf_counter() + 0.2) is None


@posix
def test_the_child_reads_the_cutoff_the_parent_tightens():
    bs = beside.Beside(5.0)

    def work(channel):
        ends = time.perf_counter() + 5.0
        while bs.cutoff() == 5.0 and time.perf_counter() < ends:
            time.sleep(0.01)
        return bs.cutoff()
    bs.running = child.start(work)
    bs.tighten(3.0)
    out = bs.running.collect(time.perf_counter() + 10.0)
    assert out.done and out.final == 3.0


@posix
@proc
def test_a_failure_while_the_child_works_leaves_no_child(monkeypatch):
    """The polish raises while the bound's child works: the child is killed
    and reaped before the error reaches the caller."""
    monkeypatch.setattr(optimal, "SUFFIX_NONZEROS", 0)
    started = []
    real = beside.start
    monkeypatch.setattr(beside, "start", lambda *a: started.append(1) or real(*a))

    def broken(*a, **k):
        raise RuntimeError("polish broke")
    monkeypatch.setattr(optimal, "polish", broken)
    g = Graph(chain5(SLOW))
    before = children()
    with pytest.raises(RuntimeError, match="polish broke"):
        plan("optimal", PlanContext(g, int(g.lower_bound_bytes * 1.1), {"time_limit": 20.0}))
    assert started and children() == before


@posix
@proc
def test_a_large_model_is_bounded_beside_within_the_limit():
    """ResNet-50 b16 at 1.25x (1M nonzeros): the bound comes from the child,
    the plan ends with its limit, and no child is left."""
    from snsim.trace.io import load

    g = Graph(load(str(Path(__file__).resolve().parents[1] / "traces" /
                       "k40c_resnet50_b16.json")))
    before = children()
    t = time.perf_counter()
    s = plan("optimal", PlanContext(g, int(1.25 * g.lower_bound_bytes), {"time_limit": 12.0}))
    took = time.perf_counter() - t
    assert took < 12.0 + 1.0
    st = s.stats
    assert st["status"] in ("split-bound", "time-limit", "cutoff"), st["status"]
    assert st["milp_columns"] > 100_000 and s.infeasible_reason is None
    assert math.isfinite(st["bound_ms"]) and st["bound_ms"] >= st["schedule_bound_ms"]
    assert 0.0 <= st["optimality_gap"] < 0.2 and st["suffix_s"] > 0
    assert children() == before


@posix
def test_the_child_asks_whether_the_class_has_a_plan():
    """chain5 on the slow link at 440 bytes (optimum 9 ms, test_optimal),
    bounded in the child: capped at 8.9 ms the windows leave no plan and the
    class has one (``cutoff``, the bound the cap); capped at 9.5 ms the bound
    is the optimum (``split-bound``); below the lower bound the class is
    empty (``infeasible``)."""
    from snsim.policies.optimal import heuristic_plans, settle

    g = Graph(chain5(SLOW))

    def run(cap, cutoff):
        plans = heuristic_plans(PlanContext(g, cap)) if cap >= g.lower_bound_bytes else []
        route = cutoff - g.optimizer_ms

        def then(sol, seconds, route):
            return settle(g, cap, None, seconds, plans, route, 0.0, sol, None)[0]
        ends = time.perf_counter() + 20.0
        return beside.collect(beside.start(g, cap, None, route, 0, ends, 5.0, then), ends + 1)

    got = run(440, 8.9)
    assert got.done and got.status == "cutoff"
    assert got.bound == pytest.approx(8.9 - g.optimizer_ms, abs=1e-9)
    got = run(440, 9.5)
    assert got.done and got.status == "split-bound"
    assert got.bound == pytest.approx(9.0 - g.optimizer_ms, abs=1e-6)
    got = run(g.lower_bound_bytes - 1, 100.0)
    assert got.done and got.status == "infeasible" and got.bound == 0.0


@posix
def test_serial_keeps_to_one_process(monkeypatch, tmp_path):
    """The option ``serial`` (``snsim simulate --serial``) starts no child beside
    the heuristics, and gives the bound the in-process search gives."""
    g = Graph(chain5(SLOW))
    budget = int(g.lower_bound_bytes * 1.1)
    monkeypatch.setattr(optimal, "SUFFIX_NONZEROS", 0)

    def no(*a, **k):
        raise AssertionError("a child was started beside the heuristics")
    monkeypatch.setattr(beside, "start", no)
    st = plan("optimal", PlanContext(g, budget, {"time_limit": 20.0, "serial": True})).stats
    monkeypatch.setattr(optimal, "BESIDE", False)
    want = plan("optimal", PlanContext(g, budget, {"time_limit": 20.0})).stats
    assert st["status"] == want["status"]
    assert st["bound_ms"] == pytest.approx(want["bound_ms"], abs=1e-6)

    from snsim.cli import main
    trace = tmp_path / "chain5.json"
    from snsim.trace.io import save
    save(chain5(SLOW), str(trace))
    assert main(["simulate", str(trace), "--policy", "optimal", "--budget", str(budget),
                 "--time-limit", "10", "--serial", "--json"]) == 0

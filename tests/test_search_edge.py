"""The capacity search's margin step and its workers: a synthetic family whose
recomputation is a known function of the size (its answer known in closed form,
the probes counted), and real searches with 1 and 2 workers (the same answers)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from snsim.cli import main
from snsim.search import capacity, models
from snsim.search.capacity import recompute_margin, search
from snsim.search.models import Family

CAP = 10**12            # bytes
LB0, LB_STEP = 10**9, 10**7   # lower bound: LB0 + LB_STEP x size; it meets CAP at 99,900


class Synthetic:
    """Sizes whose plan holds its peak at the budget (as dtr's does) and recomputes
    ``(c / slack) ** k`` x the compute, slack the budget less the lower bound;
    the limit is one compute (the default thrash limit, 2): beyond it, no fit."""

    def __init__(self, c: float, k: float, jitter: int = 0):
        self.c, self.k, self.jitter, self.evaluated = c, k, jitter, []

    def lb(self, x: int) -> int:
        return LB0 + LB_STEP * x

    def ratio(self, x: int) -> float:
        slack = CAP - self.lb(x)
        return math.inf if slack <= 0 else (self.c / slack) ** self.k

    def fits(self, x: int) -> bool:
        return self.ratio(x) <= 1.0

    def answer(self) -> int:
        return max(x for x in range(1, 99_901) if self.fits(x))

    def family(self) -> Family:
        dev = SimpleNamespace(memory_bytes=CAP)
        return Family("depth", lambda x: SimpleNamespace(
            size=x, lower_bound_bytes=self.lb(x), trace=SimpleNamespace(device=dev)),
            lambda x: {"synthetic": x})

    def evaluate(self, graph, policy, budget):
        x = graph.size
        self.evaluated.append(x)
        r = self.ratio(x)
        peak = CAP - 1 - self.jitter * (x * 7919 % 13)   # at the budget, give or take
        row = {"policy": policy, "feasible": r <= 1.0, "peak_bytes": peak,
               "lower_bound_bytes": self.lb(x), "capacity_bytes": CAP, "compute_ms": 1000.0,
               "recompute_ms": 1000.0 * r if r <= 1.0 else 0.0,
               "reason": None if r <= 1.0 else "thrashing"}
        return SimpleNamespace(row=lambda: row)


@pytest.fixture
def synthetic(monkeypatch):
    def make(c, k, jitter=0):
        fam = Synthetic(c, k, jitter)
        monkeypatch.setattr(capacity, "evaluate", fam.evaluate)
        return fam
    return make


def test_recompute_margin_reads_the_row():
    assert recompute_margin({"recompute_ms": 250.0, "compute_ms": 1000.0}) == 0.75
    assert recompute_margin({"recompute_ms": 0.0, "compute_ms": 1000.0}) is None
    assert recompute_margin({"feasible": False}) is None


def test_an_exact_margin_lands_on_the_edge(synthetic):
    """Recomputation exactly the inverse of the slack: the margin predicts the last
    fit, and the bracket closes in a few probes where bisection of 1..99,900
    needs about 17 after the doubling (this search took 32 before the margin)."""
    fam = synthetic(3e11, 1.0, jitter=1000)
    res = search("dtr", fam.family(), CAP)
    assert res.best == fam.answer() == 69_900
    assert res.first_failing == res.best + 1 and res.first_failing_reason == "thrashing"
    assert len(res.probes) <= 10, [p.size for p in res.probes]


def test_a_flat_peak_line_stops_predicting(synthetic):
    """A peak held exactly at the budget draws a flat line: no prediction, and no
    doubling either once a size has failed (before, the search stepped down one
    size at a time from the bound: 218 probes here)."""
    fam = synthetic(2e9, 1.0)
    res = search("dtr", fam.family(), CAP)
    assert res.best == fam.answer() and len(res.probes) <= 2 * 17


@pytest.mark.parametrize("c,k", [(3e11, 1.0), (1.2e11, 2.0), (5e11, 0.5), (9.7e11, 1.0),
                                 (3e10, 3.0), (2e9, 1.0)])
def test_the_answer_is_exact_whatever_the_margin_predicts(synthetic, c, k):
    """Margins that grow faster or slower than the inverse of the slack (wrong
    predictions) still end on adjacent fit and failure, in logarithmically many
    probes."""
    fam = synthetic(c, k)
    res = search("dtr", fam.family(), CAP)
    assert res.best == fam.answer() and res.first_failing == res.best + 1
    assert len(res.probes) <= 2 * 17 + capacity.MARGIN_STEPS, [p.size for p in res.probes]
    assert len(set(fam.evaluated)) == len(fam.evaluated)   # no size planned twice


def test_an_undershooting_margin_probes_past_its_edge(synthetic):
    """Recomputation that grows slower than the inverse of the slack: every margin
    prediction falls short of the answer.  Once a pair's edge has fitted, the
    next pair starts at the new edge (and goes an eighth past it) instead of an
    eighth short of it: 17 probes here, 19 with short steps only (dtr at batch
    16 in 12 GB: 13 probes, 17 before)."""
    fam = synthetic(3e11, 0.8)
    res = search("dtr", fam.family(), CAP)
    assert res.best == fam.answer() and res.first_failing == res.best + 1
    assert len(res.probes) <= 17, [p.size for p in res.probes]


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_find_the_same_answer(synthetic, workers):
    fam = synthetic(1.2e11, 2.0)
    serial = search("dtr", fam.family(), CAP)
    par = search("dtr", fam.family(), CAP, workers=workers)
    assert (par.best, par.first_failing, par.first_failing_reason, par.best_probe.row) == \
        (serial.best, serial.first_failing, serial.first_failing_reason, serial.best_probe.row)
    sizes = [p.size for p in par.probes]
    assert len(set(sizes)) == len(sizes) and sizes == [p.size for p in serial.probes]


@pytest.mark.parametrize("policy,budget", [("dtr", 2**30), ("sqrt-n", 2 * 2**30),
                                           ("liveness", 3 * 2**30)])
def test_real_searches_with_two_workers_equal_one(policy, budget):
    fam = models.depth_family(4, "k40c")
    one = search(policy, fam, budget).to_dict()
    two = search(policy, fam, budget, workers=2).to_dict()
    for d in (one, two):
        d.pop("probes"), d.pop("planned")
    assert two == one


def test_workers_share_the_cache(tmp_path):
    from snsim.search.cache import ProbeCache

    fam = models.depth_family(4, "k40c")
    first = search("dtr", fam, 2**30, cache=ProbeCache(tmp_path), workers=2)
    assert first.planned == len(first.probes) > 0
    again = search("dtr", fam, 2**30, cache=ProbeCache(tmp_path), workers=2)
    assert again.planned == 0 and again.best == first.best
    assert [p.size for p in again.probes] == [p.size for p in first.probes]


def test_search_cli_workers(capsys):
    argv = ["search", "max-depth", "--policy", "dtr", "--batch", "4", "--budget", "1GiB",
            "--json", "--no-cache"]
    assert main(argv + ["--workers", "1"]) == 0
    one = json.loads(capsys.readouterr()[0])
    assert main(argv + ["--workers", "2"]) == 0
    two = json.loads(capsys.readouterr()[0])
    assert two["depth"] == one["depth"] and two["first_failing"] == one["first_failing"]
    assert main(argv + ["--workers", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--workers" in err

"""Capacity searches: torch-free probe traces equal to profiled ones, searches that
find the true largest size (checked against every size), the `snsim search` command."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from snsim.cli import main
from snsim.graph import Graph
from snsim.search import models
from snsim.search.batch import at_batch
from snsim.search.capacity import probe, search
from snsim.search.resnet import depth_of, resnet_doc, stage_config
from snsim.trace.io import from_dict

ROOT = pathlib.Path(__file__).parent.parent
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _shipped(name):
    return json.loads((ROOT / "traces" / name).read_text())


@pytest.mark.parametrize("name,stages", [
    ("k40c_resnet50_b16.json", (3, 4, 6, 3)), ("k40c_resnet101_b32.json", (3, 4, 23, 3)),
    ("k40c_resnet152_b16.json", (3, 8, 36, 3)), ("k40c_resnet2500_b16.json", (6, 32, 788, 6))])
def test_resnet_doc_equals_the_profiled_modeled_trace(name, stages):
    ref = _shipped(name)
    doc = resnet_doc(stages, ref["batch"], "k40c", model=ref["model"])
    assert len(doc["layers"]) == len(ref["layers"])
    for mine, theirs in zip(doc["layers"], ref["layers"]):
        if theirs["op"] in ("MaxPool2d", "cross_entropy"):  # recorded before capture read
            mine = {**mine, "bwd_reads": theirs["bwd_reads"]}  # autograd's saved tensors
        # the shipped traces predate capture's reading of shared gradient storage
        # (note [10]) and of in-place storage (note [2]); the fresh profile below
        # checks grad_shares and inplace_alias too
        mine = {k: v for k, v in mine.items() if k not in ("grad_shares", "inplace_alias")}
        assert mine == theirs  # every field: names, bytes, kernels, times
    for key in ("model", "batch", "dtype", "input_shape", "device"):
        assert doc[key] == ref[key]
    from_dict(doc, "probe")  # and it is a valid trace


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the profiler)")
def test_resnet_doc_equals_a_fresh_profile_on_another_preset():
    from snsim.profile import profiler

    ref = profiler.profile("resnet50", 3, device_model="v100")
    mine = resnet_doc((3, 4, 6, 3), 3, "v100", model="resnet50")
    # released_after (capture note [14]) records the zoo code's Python variables,
    # which only validate's plain-PyTorch comparison reads: not generated here
    assert any("released_after" in la for la in ref["layers"])
    assert mine["layers"] == [{k: v for k, v in la.items() if k != "released_after"}
                              for la in ref["layers"]]
    assert mine["constant_bytes"] == ref["constant_bytes"]   # batch norm's buffers


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the profiler)")
def test_batch_extrapolation_equals_a_profile_of_a_non_resnet():
    from snsim.profile import profiler

    a, b = (profiler.profile("alexnet", n, device_model="k40c") for n in (1, 2))
    assert at_batch(a, b, 5)["layers"] == profiler.profile("alexnet", 5,
                                                           device_model="k40c")["layers"]


def test_batch_extrapolation_of_resnet_docs_is_exact():
    a, b = resnet_doc((3, 4, 6, 3), 1), resnet_doc((3, 4, 6, 3), 2)
    for n in (3, 17):
        assert at_batch(a, b, n)["layers"] == resnet_doc((3, 4, 6, 3), n)["layers"]


def test_stage_config_family():
    assert stage_config(506) == (6, 32, 124, 6) and stage_config(2498) == (6, 32, 788, 6)
    assert depth_of(788) == 2498
    with pytest.raises(ValueError):
        stage_config(501)


def test_max_depth_is_the_true_largest():
    budget = 3 * 2**30  # small enough that every size up to the answer is cheap
    fam = models.depth_family(4, "k40c")
    graph_of = fam.graph
    res = search("liveness", fam, budget)
    n = (res.best - 134) // 3
    assert res.first_failing == depth_of(n + 1)
    fits = [probe(graph_of(k), "liveness", budget, k).feasible for k in range(1, n + 2)]
    assert all(fits[:-1]) and not fits[-1]
    assert res.to_dict()["peak_bytes"] <= budget


def test_max_depth_at_the_lower_bound():
    """superneurons reaches the lower bound: after the doubling, one planned probe."""
    budget = 2**30
    fam = models.depth_family(4, "k40c")
    graph_of = fam.graph
    res = search("superneurons", fam, budget)
    n = (res.best - 134) // 3
    assert probe(graph_of(n), "superneurons", budget, n).feasible
    nxt = probe(graph_of(n + 1), "superneurons", budget, n + 1)
    assert not nxt.feasible and res.first_failing_reason == nxt.reason
    assert len(res.probes) <= n.bit_length() + 2


def test_max_batch_is_the_true_largest():
    budget = 2 * 2**30
    fam = models.batch_family("resnet50", "k40c")
    graph_of = fam.graph
    res = search("liveness", fam, budget)
    assert probe(graph_of(res.best), "liveness", budget, res.best).feasible
    assert not probe(graph_of(res.best + 1), "liveness", budget, res.best + 1).feasible
    assert res.first_failing == res.best + 1 and res.first_failing_reason


def test_search_json(capsys):
    code = main(["search", "max-depth", "--policy", "liveness", "--batch", "4",
                 "--budget", "2GiB", "--json", "--no-cache"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 0
    for key in ("policy", "depth", "peak_bytes", "iteration_ms", "first_failing"):
        assert key in d
    assert d["first_failing"]["depth"] > d["depth"] and d["first_failing"]["reason"]
    code = main(["search", "max-batch", "--model", "resnet50", "--policy", "liveness",
                 "--budget", "2GiB", "--json", "--no-cache"])
    d = json.loads(capsys.readouterr()[0])
    assert code == 0 and d["batch"] >= 1 and d["first_failing"]["batch"] == d["batch"] + 1


@pytest.mark.parametrize("argv,words", [
    (["max-depth", "--policy", "nope"], "unknown policy"),
    (["max-depth", "--batch", "0"], "--batch"),
    (["max-depth", "--budget", "1.5xlb"], "a size"),
    (["max-depth", "--device-model", "tpu9"], "tpu9"),
    (["max-batch"], "--model"),
    (["max-batch", "--model", "nonesuch"], "unknown model"),
])
def test_search_bad_input_is_one_line(capsys, argv, words):
    assert main(["search", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err


def test_probe_graph_is_a_graph():
    g = models.depth_graph(2, "k40c")(1)
    # data + stem (conv, bn, relu, pool) + 45 blocks of 10 layers + 4 downsample pairs
    # + pool, fc, loss
    assert isinstance(g, Graph) and g.n == 5 + 45 * 10 + 4 * 2 + 3


def _counting_planner(monkeypatch):
    from snsim import policies

    calls = []
    real = policies.plan

    def plan(name, ctx):
        calls.append(name)
        return real(name, ctx)
    monkeypatch.setattr(policies, "plan", plan)
    return calls


@pytest.mark.parametrize("policy,budget", [("liveness", 3 * 2**30), ("utp", 2**30),
                                           ("vdnn-conv", 2 * 2**30)])
def test_cached_search_equals_uncached_and_plans_nothing(tmp_path, monkeypatch, policy,
                                                         budget):
    from snsim.search.cache import ProbeCache

    calls = _counting_planner(monkeypatch)
    fam = models.depth_family(4, "k40c")
    plain = search(policy, fam, budget)
    planned = len(calls)
    assert planned == plain.planned == len(plain.probes) > 0
    cache = ProbeCache(tmp_path)
    first = search(policy, fam, budget, cache=cache)
    assert len(calls) == 2 * planned and cache.writes > 0
    calls.clear()
    again = search(policy, fam, budget, cache=ProbeCache(tmp_path))
    assert calls == [] and again.planned == 0 and all(p.cached for p in again.probes)
    for res in (first, again):
        d, ref = res.to_dict(), plain.to_dict()
        assert {k: v for k, v in d.items() if k != "planned"} == \
            {k: v for k, v in ref.items() if k != "planned"}
    assert again.probes == tuple(p.__class__(p.size, p.feasible, p.reason, p.row, True)
                                 for p in first.probes)


def test_a_changed_budget_or_policy_is_a_new_probe(tmp_path, monkeypatch):
    from snsim.search.cache import ProbeCache

    fam = models.depth_family(4, "k40c")
    search("liveness", fam, 3 * 2**30, cache=ProbeCache(tmp_path))
    calls = _counting_planner(monkeypatch)
    search("liveness", fam, 3 * 2**30 + 2**20, cache=ProbeCache(tmp_path))
    assert calls and set(calls) == {"liveness"}
    calls.clear()
    search("vdnn-conv", fam, 3 * 2**30, cache=ProbeCache(tmp_path))
    assert calls and set(calls) == {"vdnn-conv"}


def test_a_partial_cache_file_is_a_miss(tmp_path):
    from snsim.search.cache import ProbeCache

    fam = models.depth_family(4, "k40c")
    cache = ProbeCache(tmp_path)
    ref = search("liveness", fam, 3 * 2**30, cache=cache)
    for path in (tmp_path / "probes").glob("*.json"):
        path.write_text(path.read_text()[:40])  # as if cut off (never by snsim itself)
    again = search("liveness", fam, 3 * 2**30, cache=ProbeCache(tmp_path))
    assert again.best == ref.best and again.planned == len(again.probes)


def test_search_cli_uses_the_cache(tmp_path, capsys):
    argv = ["search", "max-depth", "--policy", "liveness", "--batch", "4", "--budget", "2GiB",
            "--json", "--cache", str(tmp_path)]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr()[0])
    assert main(argv) == 0
    again = json.loads(capsys.readouterr()[0])
    assert first["planned"] == first["probes"] > 0 and again["planned"] == 0
    assert again["depth"] == first["depth"] and again["peak_bytes"] == first["peak_bytes"]
    (tmp_path / "afile").write_text("x")
    assert main(argv[:-1] + [str(tmp_path / "afile")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "is a file" in err

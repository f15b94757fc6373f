"""``snsim import dtr-log``: a hand-written op log, its trace, and hand-computed peaks.

The log (sizes in bytes, times in ns)::

    CONSTANT w (100)
    a = f(w)            40 B, 1 ms       layer 1; copied to a2
    (b, m) = bn(a)      40 + 8 B, 2 ms   layer 2: two results
    RELEASE a           a2 still holds a's storage
    v = view(b)         0 B (ALIAS 0)    layer 3: shares b's storage
    RELEASE b           v still holds it
    c = g(v, m)         40 B, 3 ms       layer 4 reads the view and result 1 of layer 2
    RELEASE v, m, a2    b's storage, m and a freed
    add_(c, w)          MUTATE: a new 40 B c, the old one released (layer 5)

simrd's unlimited run: 100 (w), 140, 188, 188, then c makes 228 (w + a + b + m + c),
the peak; the trace's last layer (6) reads what is held at the end (c).
"""

from __future__ import annotations

import json

import pytest

from snsim.cli import main
from snsim.errors import SnsimError
from snsim.graph import Graph
from snsim.importers import dtr_log
from snsim.policies.base import PlanContext
from snsim.policies.liveness import liveness_ops
from snsim.schedule import ledger
from snsim.schedule.ops import Schedule
from snsim.trace.io import from_dict


def rec(**kw) -> str:
    return json.dumps(kw)


def call(name, args, results, time, sizes, alias=None):
    out = [rec(INSTRUCTION="CALL", NAME=name, ARGS=args, RESULT=results, TIME=str(time))]
    for k, r in enumerate(results):
        out.append(rec(INSTRUCTION="MEMORY", NAME=r, MEMORY=str(sizes[k])))
        out.append(rec(INSTRUCTION="ALIAS", NAME=r, ALIAS=str((alias or [-1] * 9)[k])))
    return out


LOG = [
    rec(INSTRUCTION="CONSTANT", NAME="junk"),   # before START: skipped, as simrd does
    rec(INSTRUCTION="MEMORY", NAME="junk", MEMORY="7"),
    rec(INSTRUCTION="ANNOTATE", ANNOTATION="START"),
    rec(INSTRUCTION="CONSTANT", NAME="w"), rec(INSTRUCTION="MEMORY", NAME="w", MEMORY="100"),
    *call("f", ["w"], ["a"], 1_000_000, [40]),
    rec(INSTRUCTION="COPY", DST="a2", SRC="a"),
    *call("cudnn_batch_norm", ["a"], ["b", "m"], 2_000_000, [40, 8]),
    rec(INSTRUCTION="RELEASE", NAME="a"),
    *call("view", ["b"], ["v"], 100, [40], alias=[0]),
    rec(INSTRUCTION="RELEASE", NAME="b"),
    *call("g", ["v", "m"], ["c"], 3_000_000, [40]),
    rec(INSTRUCTION="RELEASE", NAME="v"),
    rec(INSTRUCTION="RELEASE", NAME="m"),
    rec(INSTRUCTION="RELEASE", NAME="a2"),
    rec(INSTRUCTION="MUTATE", NAME="add_", ARGS=["c", "w"], MUTATE=[0], TIME="500000"),
]


def doc(free_at="release"):
    return dtr_log.to_document(dtr_log.parse(LOG, "toy.log"), "toy.log", free_at)


def peak(d) -> int:
    g = Graph(from_dict(d))
    return ledger.planned_peak(g, liveness_ops(g))[0]


def test_layers_results_views_and_releases():
    d = doc()
    layers = d["layers"]
    assert [lay["name"] for lay in layers] == ["data", "f/1", "cudnn_batch_norm/2", "view/3",
                                               "g/4", "add_/5", "end"]
    assert d["constant_bytes"] == 100
    assert layers[1]["inputs"] == [0] and layers[1]["released_after"] == 4   # a2's release
    assert layers[2]["output_sizes"] == [40, 8] and layers[2]["kind"] == "bn"
    assert layers[2]["output_released_after"] == [3, 4]
    assert layers[3]["output_bytes"] == 0 and layers[3]["alias_of"] == [[2, 0]]
    assert layers[4]["input_results"] == [[3, 0], [2, 1]]
    assert layers[5]["inputs"] == [4] and layers[5]["output_bytes"] == 40   # MUTATE: new c
    assert layers[6]["inputs"] == [5] and layers[6]["kind"] == "loss"
    src = d["source"]
    assert src["forward_only"] is True and src["op_log"]["format"] == "dtr-log"
    assert src["baseline_peak_bytes"] == 228
    assert src["op_log"]["compute_ns"] == 6_500_100
    assert layers[4]["fwd_ms"] == 3.0


def test_release_semantics_match_simrds_unlimited_run():
    # static 100; F4 holds a (a2), b's storage (the view), m, and makes c: 228
    assert peak(doc("release")) == 228
    g = Graph(from_dict(doc()))
    assert g.holds[("X", 2)] == 4            # b lives while its view v does
    assert g.holds[("X", 1)] == 4            # a lives until a2 is released
    assert g.size(("X1", 2)) == 8 and g.size(("X", 2)) == 40
    assert g.needs(("F", 4)) == (("X", 3), ("X1", 2))


def test_free_at_last_use():
    # a freed after its last use (F2): F4 is 100 + b 40 + m 8 + c 40 = 188
    assert peak(doc("last_use")) == 188


def test_recompute_of_a_multi_result_layer_remakes_resident_results_in_place():
    from snsim.schedule.ops import Compute, Free

    g = Graph(from_dict(doc()))
    ops = [Compute("F", i) for i in range(3)] + [Free(("X", 2)),
                                                 Compute("R", 2)]
    eff = ledger.walk(g, ops, route=False)
    assert eff[-1][0] == 40   # only b is allocated again; the resident m is re-made in place


def test_forward_only_trace_refuses_backward_policies():
    from snsim import policies
    from snsim.errors import PolicyError

    g = Graph(from_dict(doc()))
    with pytest.raises(PolicyError, match="forward-only"):
        policies.plan("vdnn-all", PlanContext(g, None))
    sched = policies.plan("liveness", PlanContext(g, None))
    assert isinstance(sched, Schedule)


@pytest.mark.parametrize("lines, msg", [
    ([rec(INSTRUCTION="FOO")], "line 1: unknown INSTRUCTION 'FOO'"),
    (call("f", ["nope"], ["a"], 1, [4]), "tensor 'nope' is used before it is defined"),
    ([rec(INSTRUCTION="CALL", NAME="f", ARGS=[], RESULT=["a"], TIME="1")],
     "expected the MEMORY record of 'a'"),
    (["{not json"], "invalid JSON"),
    ([rec(INSTRUCTION="ANNOTATE", ANNOTATION="START")], "no CALL or MUTATE records"),
])
def test_bad_logs_are_one_line_errors(lines, msg):
    with pytest.raises(SnsimError, match=msg.replace("(", r"\(")):
        dtr_log.parse(lines, "bad.log")


def test_cli_import_and_simulate(tmp_path, capsys):
    log = tmp_path / "toy-1-2.log"
    log.write_text("\n".join(LOG) + "\n")
    out = tmp_path / "toy.json"
    assert main(["import", "dtr-log", str(log), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["model"] == "toy-1" and d["source"]["import"]["config"]["free_at"] == "release"
    capsys.readouterr()
    assert main(["simulate", str(out), "--policy", "liveness", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == 228
    assert main(["simulate", str(out), "--policy", "vdnn-all"]) == 2
    assert "forward-only" in capsys.readouterr().err


def test_budget_as_a_multiple_of_the_logs_baseline(tmp_path, capsys):
    # 'RxBASELINE': the DTR authors' budget ratios, of the log's unlimited peak
    log = tmp_path / "toy-1-2.log"
    log.write_text("\n".join(LOG) + "\n")
    out = tmp_path / "toy.json"
    assert main(["import", "dtr-log", str(log), "--out", str(out)]) == 0
    base = json.loads(out.read_text())["source"]["baseline_peak_bytes"]
    capsys.readouterr()
    assert main(["simulate", str(out), "--policy", "dtr", "--budget", "1.5xbaseline",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_bytes"] == int(1.5 * base)
    assert main(["simulate", str(out), "--policy", "dtr", "--budget", "0.001xbaseline"]) == 2
    assert "impossible budget" in capsys.readouterr().err   # under the lower bound
    assert main(["simulate", str(out), "--budget", "tenxbaseline"]) == 2
    assert "cannot read budget 'tenxbaseline'" in capsys.readouterr().err
    # a trace that is not an op log has no baseline
    from pathlib import Path
    trace = Path(__file__).resolve().parent.parent / "traces" / "k40c_vgg16_b32.json"
    assert main(["simulate", str(trace), "--budget", "0.5xbaseline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records no baseline peak" in err


def test_cli_bad_log_writes_nothing(tmp_path, capsys):
    log = tmp_path / "bad.log"
    log.write_text(rec(INSTRUCTION="ANNOTATE", ANNOTATION="START") + "\n\n"
                   + rec(INSTRUCTION="FOO") + "\n")
    out = tmp_path / "t.json"
    assert main(["import", "dtr-log", str(log), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.log: line 3: unknown" in err and not out.exists()


def _corpus(tmp_path, expected_rows):
    import zipfile

    root = tmp_path / "corpus"
    root.mkdir()
    with zipfile.ZipFile(root / "logs.zip", "w") as zf:
        zf.writestr("logs/toy-1-2.log", "\n".join(LOG) + "\n")
    (root / "simrd_expected.csv").write_text(
        "model,log,ratio,simrd_overhead\n" + "".join(f"toy,toy-1,{r},{o}\n"
                                                    for r, o in expected_rows))
    suite = tmp_path / "s.toml"
    suite.write_text('corpus = "x"\npolicy = "dtr"\ncell_max = 0.05\nmedian_max = 0.01\n')
    return root, suite


def test_simrd_comparison_passes_and_fails(tmp_path, capsys):
    from snsim.validation import simrd

    # unlimited (ratio 1.0) dtr recomputes nothing: overhead 1.000; at 0.5 x 228 B
    # not even the constants (100 B) and the largest step fit: infeasible
    root, suite = _corpus(tmp_path, [(1.0, "1.000"), (0.5, "oom")])
    out = tmp_path / "report"
    assert simrd.main([str(suite), "--corpus", str(root), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| toy | 1.0 | 1.000 | 1.000 | +0.000 |" in text and "PASS" in text
    report = json.loads((out / "report.json").read_text())
    assert report["pass"] and report["summary"]["feasibility_mismatches"] == 0
    assert "provenance" in report and (out / "report.md").exists()
    (tmp_path / "b").mkdir()
    root, suite = _corpus(tmp_path / "b", [(1.0, "1.100")])
    assert simrd.main([str(suite), "--corpus", str(root)]) == 1   # off by 0.1 > 0.05
    assert "FAIL" in capsys.readouterr().out
    (tmp_path / "c").mkdir()
    root, suite = _corpus(tmp_path / "c", [(0.5, "1.2")])
    assert simrd.main([str(suite), "--corpus", str(root)]) == 1   # feasibility differs
    assert "feasibility differs" in capsys.readouterr().out
    assert simrd.main([str(suite), "--corpus", str(tmp_path / "nope")]) == 2


def test_simrd_suite_finds_the_shared_corpus_from_a_worktree(tmp_path, monkeypatch):
    # /work/main/validate/s.toml and /work/wt-x/validate/s.toml both name
    # "../shared/corpus/dtr-simrd" (relative to the repository) and must find
    # /work/shared/corpus/dtr-simrd; a checkout deeper down walks up to it
    from snsim.validation import simrd

    corpus = tmp_path / "work" / "shared" / "corpus" / "dtr-simrd"
    corpus.mkdir(parents=True)
    (corpus / "logs.zip").write_bytes(b"")
    (corpus / "simrd_expected.csv").write_text("model,log,ratio,simrd_overhead\n")
    text = 'corpus = "../shared/corpus/dtr-simrd"\npolicy = "dtr"\ncell_max = 0.05\nmedian_max = 0.01\n'
    for repo in (tmp_path / "work" / "wt-x", tmp_path / "work" / "deep" / "down" / "repo"):
        (repo / "validate").mkdir(parents=True)
        (repo / "validate" / "s.toml").write_text(text)
        monkeypatch.chdir(tmp_path)
        suite = simrd.load_suite(repo / "validate" / "s.toml", None)
        assert suite["corpus_dir"] == corpus.resolve()
    lone = tmp_path / "elsewhere" / "repo"
    (lone / "validate").mkdir(parents=True)
    (lone / "validate" / "s.toml").write_text(text)
    with pytest.raises(SnsimError, match="pass --corpus DIR"):
        simrd.load_suite(lone / "validate" / "s.toml", None)


def test_a_view_of_a_constant_stays_with_it():
    # simrd's alias of a constant shares the pinned constant's storage and stays
    # defined; here it is a view of the data placeholder, so dtr keeps it after
    # its release instead of recomputing it when a chain reads it (U-Net's
    # `view` of its weights: overhead 3e-5 above simrd's at 0.5 before)
    lines = [rec(INSTRUCTION="CONSTANT", NAME="w"),
             rec(INSTRUCTION="MEMORY", NAME="w", MEMORY="100"),
             *call("view", ["w"], ["v"], 100, [100], alias=[0]),
             *call("f", ["v"], ["a"], 1000, [40]),
             rec(INSTRUCTION="RELEASE", NAME="v")]
    d = dtr_log.to_document(dtr_log.parse(lines, "c.log"), "c.log")
    view = d["layers"][1]
    assert view["inputs"] == [0] and view["alias_of"] == [[0, 0]]
    assert view["output_bytes"] == 0
    g = Graph(from_dict(d))
    from snsim.policies.dtr import Planner, HEURISTICS
    p = Planner(g, 10**9, HEURISTICS["dtr"])
    assert p.node_of[("X", 1)] == 0 and 1 in p.views_of

"""Smoke runs of every CLI command and flag, and its error handling."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from snsim.cli import main

ROOT = pathlib.Path(__file__).parent.parent
TRACE = str(ROOT / "traces" / "k40c_resnet50_b32.json")
SMALL = str(ROOT / "traces" / "cpu_resnet18_b8_64.json")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_table(capsys):
    code, out, err = run_cli(capsys, "simulate", SMALL, "--policy", "liveness")
    assert code == 0 and err == ""
    assert "peak memory" in out and "lower bound" in out


def test_simulate_table_of_an_infeasible_run_reads_no_peak(capsys):
    # a run that stopped part-way has no peak (the JSON's peak_bytes is null): the
    # table says what it reached, not a fraction of the lower bound
    code, out, _ = run_cli(capsys, "simulate", TRACE, "--policy", "liveness",
                           "--budget", "1.05xlb")
    assert code == 0
    assert "NO: " in next(line for line in out.splitlines() if line.startswith("feasible"))
    peak = next(line for line in out.splitlines() if line.startswith("peak memory"))
    assert "before it stopped" in peak and "lower bound" not in peak
    assert next(line for line in out.splitlines()
                if line.startswith("iteration")).split(None, 1)[1].startswith("- (stopped at")


def test_simulate_all_table_shows_no_peak_for_an_infeasible_run(capsys):
    # the comparison table's twin of the test above: an infeasible row has no peak
    # and no peak over the lower bound, a feasible one has both
    code, out, _ = run_cli(capsys, "simulate", TRACE, "--policy", "all", "--budget", "1.5GiB")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[1:2] in (["yes"], ["NO"])}
    assert rows["liveness"][1:4] == ["NO", "-", "-"]
    assert rows["superneurons"][1] == "yes" and rows["superneurons"][2] != "-"
    assert float(rows["superneurons"][4]) >= 1.0   # peak/LB, after "1.50 GiB"


def test_simulate_json_is_exact_json(capsys):
    code, out, _ = run_cli(capsys, "simulate", TRACE, "--policy", "liveness", "--json")
    assert code == 0
    d = json.loads(out)
    for key in ("policy", "trace", "budget_bytes", "feasible", "peak_bytes", "static_bytes",
                "lower_bound_bytes", "iteration_ms", "compute_ms", "recompute_ms",
                "stall_ms", "h2d_bytes", "d2h_bytes", "samples_per_s"):
        assert key in d
    assert d["policy"] == "liveness" and d["budget_bytes"] is None and d["feasible"] is True
    assert isinstance(d["peak_bytes"], int) and isinstance(d["iteration_ms"], float)
    assert d["samples_per_s"] == pytest.approx(32 / (d["iteration_ms"] / 1000))


def test_simulate_all_json_is_ranked_list(capsys):
    code, out, _ = run_cli(capsys, "simulate", SMALL, "--policy", "all", "--json",
                           "--budget", "1.2xlb")
    rows = json.loads(out)
    from snsim import policies

    assert isinstance(rows, list)
    assert sorted(r["policy"] for r in rows) == sorted(policies.names())  # each exactly once
    feas = [r["feasible"] for r in rows]
    assert feas == sorted(feas, reverse=True)           # feasible first
    ok = [r["samples_per_s"] for r in rows if r["feasible"]]
    assert ok == sorted(ok, reverse=True)
    for r in rows:
        if not r["feasible"]:
            assert r["reason"]


def test_simulate_all_table(capsys):
    code, out, _ = run_cli(capsys, "simulate", SMALL, "--policy", "all")
    assert code == 0 and "peak/LB" in out and "time/compute" in out


@pytest.mark.parametrize("budget, expect", [
    ("12GiB", 12 * 2**30), ("12GB", 12 * 10**9), ("512MiB", 512 * 2**20),
    ("900000000", 900_000_000), ("1.5xlb", None)])
def test_budget_forms(capsys, budget, expect):
    code, out, _ = run_cli(capsys, "simulate", TRACE, "--policy", "none", "--json",
                           "--budget", budget)
    assert code == 0
    d = json.loads(out)
    if expect is None:  # 1.5 times the lower bound, which the same output reports
        expect = int(1.5 * d["lower_bound_bytes"])
    assert d["budget_bytes"] == expect


def test_infeasible_is_an_outcome(capsys):
    code, out, _ = run_cli(capsys, "simulate", TRACE, "--policy", "none", "--json",
                           "--budget", "2GiB")
    d = json.loads(out)
    assert code == 0 and d["feasible"] is False and "bytes short" in d["reason"]


def test_timeline_and_chrome_trace(capsys, tmp_path):
    png, chrome = tmp_path / "m.png", tmp_path / "c.json"
    code, _, _ = run_cli(capsys, "simulate", SMALL, "--policy", "liveness",
                         "--timeline", str(png), "--chrome-trace", str(chrome))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(chrome.read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    layer1 = json.loads(pathlib.Path(SMALL).read_text())["layers"][1]["name"]
    assert f"F1 {layer1}" in names and f"B1 {layer1}" in names and "memory" in names
    assert doc["otherData"]["snsim"]["config"]["policy"] == "liveness"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "m.png"]


def test_timeline_all_policies(capsys, tmp_path):
    png = tmp_path / "all.png"
    assert run_cli(capsys, "simulate", SMALL, "--policy", "all", "--timeline", str(png))[0] == 0
    assert png.stat().st_size > 1000


def test_info_schedule_policies(capsys):
    code, out, _ = run_cli(capsys, "info", TRACE)
    assert code == 0 and "lower bound" in out and "conv" in out
    code, out, _ = run_cli(capsys, "schedule", SMALL, "--policy", "liveness")
    assert code == 0 and "compute F0" in out and "free X0" in out
    code, out, _ = run_cli(capsys, "policies")
    assert code == 0 and "liveness" in out and "none" in out


@pytest.mark.parametrize("argv, message", [
    (["simulate", TRACE, "--policy", "bogus"], "unknown policy 'bogus'"),
    (["simulate", "/nonexistent/t.json"], "no such file"),
    (["simulate", TRACE, "--budget", "lots"], "cannot read size 'lots'"),
    (["simulate", TRACE, "--budget", "1MiB"], "impossible budget '1MiB'"),
    (["simulate", TRACE, "--budget", "nanxlb"], "positive finite multiple"),
    (["simulate", TRACE, "--budget", "infxlb"], "positive finite multiple"),
    (["simulate", TRACE, "--policy", "liveness", "--chrome-trace", "."], "it is a folder"),
    (["simulate", TRACE, "--policy", "all", "--chrome-trace", "x.json"], "needs one policy"),
    (["info", str(ROOT / "pyproject.toml")], "invalid JSON"),
])
def test_errors_are_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("snsim: error: ") and message in err and err.count("\n") == 1


def test_error_leaves_no_output_file(capsys, tmp_path):
    png = tmp_path / "m.png"
    code, _, _ = run_cli(capsys, "simulate", TRACE, "--policy", "bogus", "--timeline", str(png))
    assert code == 2 and not png.exists()
    code, _, err = run_cli(capsys, "simulate", SMALL, "--timeline",
                           str(tmp_path / "nodir" / "m.png"), "--policy", "liveness")
    assert code == 2 and "does not exist" in err and list(tmp_path.iterdir()) == []


def test_console_script_without_torch():
    """The installed command runs, prints exact JSON, and never imports torch."""
    code = ("import sys, runpy; sys.argv=['snsim','simulate',%r,'--policy','liveness','--json'];"
            "from snsim.cli import main; rc=main(); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)") % SMALL
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["feasible"] is True


def test_usage_error_one_line():
    p = subprocess.run([sys.executable, "-m", "snsim.cli", "simulate"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


@pytest.mark.parametrize("ext, magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF"),
                                        ("SVG", b"<?xml")])
def test_timeline_format_follows_extension(capsys, tmp_path, ext, magic):
    out = tmp_path / f"m.{ext}"
    code = run_cli(capsys, "simulate", SMALL, "--policy", "liveness", "--timeline", str(out))[0]
    assert code == 0
    assert out.read_bytes()[:len(magic)] == magic


def test_timeline_shades_from_a_feasible_policy_and_draws_device_memory(capsys, tmp_path):
    """With no budget the device's memory is the line; an infeasible first policy
    does not set the forward/backward shading (the first feasible one does)."""
    import dataclasses

    from snsim.plots.timeline import plot_timeline

    svg = tmp_path / "m.svg"
    code = run_cli(capsys, "simulate", SMALL, "--policy", "liveness", "--timeline", str(svg))[0]
    assert code == 0
    assert "budget (device memory)" in svg.read_text()
    from snsim.cli import _load, _run_policies  # noqa: PLC2701 (test of the CLI's own helpers)

    g = _load(SMALL)
    ok = _run_policies(g, "liveness", None, True)[0]
    bad = dataclasses.replace(ok, policy="none", feasible=False, forward_end_ms=1.0,
                              iteration_ms=2.0, reason="x")
    drawn = {}
    import matplotlib.axes

    orig = matplotlib.axes.Axes.axvspan

    def spy(self, x0, x1, **kw):
        drawn[kw.get("label")] = (x0, x1)
        return orig(self, x0, x1, **kw)

    matplotlib.axes.Axes.axvspan = spy
    try:
        plot_timeline([bad, ok], tmp_path / "b.png")
    finally:
        matplotlib.axes.Axes.axvspan = orig
    assert drawn == {"forward": (0, ok.forward_end_ms),
                     "backward": (ok.forward_end_ms, ok.iteration_ms)}


def test_schedule_prints_its_key(capsys):
    code, out, _ = run_cli(capsys, "schedule", SMALL, "--policy", "liveness")
    assert code == 0 and out.splitlines()[0].startswith("# key: compute Fi / Bi / Ri")
    for word in ("Xi", "Gi", "Si", "offload", "prefetch", "wait", "algo=k"):
        assert word in out.splitlines()[0]


@pytest.mark.parametrize("flag, shown", [([], True), (["--no-progress"], False)])
def test_policy_all_progress_on_a_terminal(capsys, monkeypatch, flag, shown):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run_cli(capsys, "simulate", SMALL, "--policy", "all", "--json", *flag)
    assert code == 0 and isinstance(json.loads(out), list)   # stdout stays exact JSON
    assert ("policies:" in err) == shown, err


def test_no_progress_when_not_a_terminal(capsys):
    code, _, err = run_cli(capsys, "simulate", SMALL, "--policy", "all")
    assert code == 0 and err == ""


def test_every_option_has_help():
    import argparse

    from snsim.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}"
               for name, p in sub.choices.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not a.help and a.dest != "rest"]
    assert missing == []


@pytest.mark.parametrize("flag, shown", [([], True), (["--no-progress"], False)])
def test_reading_a_large_trace_shows_progress(capsys, monkeypatch, flag, shown):
    big = str(ROOT / "traces" / "k40c_resnet2500_b16.json")   # 2.9 MB, ~2 s to check
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    import snsim.cli as cli

    def stop(*_a, **_k):   # stop after the read: the read is what is tested
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_policies", stop)
    code, _, err = run_cli(capsys, "simulate", big, "--policy", "liveness", *flag)
    assert code == 130 and ("read and check" in err) == shown, err

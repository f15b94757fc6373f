"""``snsim simulate --json`` imports only what it uses.

Each case runs the command in a fresh interpreter and lists the heavy
packages left in ``sys.modules``: pandas (tables for people), matplotlib
(plots), torch (profile/validate) and jsonschema (only for a trace that
fails the fast schema check) must not be among them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "matplotlib", "torch", "jsonschema")

PROBE = """
import contextlib, io, json, sys
from snsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
json.loads(out.getvalue())   # the command really printed its JSON
print(json.dumps({"rc": rc, "modules": sorted({m.split('.')[0] for m in sys.modules})}))
"""


def _modules_after(*argv: str) -> tuple[int, set[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    return last["rc"], set(last["modules"])


@pytest.mark.parametrize("argv", [
    ("simulate", "traces/k40c_resnet50_b32.json", "--policy", "liveness", "--json"),
    ("simulate", "traces/k40c_resnet50_b32.json", "--policy", "superneurons", "--json"),
    ("simulate", "traces/k40c_vgg16_b32.json", "--policy", "all", "--budget", "1.5xlb",
     "--json"),
], ids=["liveness", "superneurons", "all"])
def test_simulate_json_imports_no_heavy_package(argv):
    rc, modules = _modules_after(*argv)
    assert rc == 0
    assert "snsim" in modules   # the probe saw the real run (and its JSON)
    assert sorted(m for m in HEAVY if m in modules) == []
    if argv[3] == "liveness":
        # simpy (~25 ms to import) only for a plan with copies: liveness has none
        assert "simpy" not in modules


def test_the_table_still_uses_pandas():
    # the readable table is where pandas belongs: the lazy import still runs
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys; from snsim.cli import main; main(sys.argv[1:]); "
            "print('pandas' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, "simulate", "traces/k40c_vgg16_b32.json",
                           "--policy", "all"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "policy" in proc.stdout and proc.stderr.strip().endswith("True")


def test_one_policy_imports_only_its_planner():
    """``--policy P`` imports the module that registers P (and its helpers), not the
    other planners: ``liveness`` neither ``dtr`` nor numpy, which only ``dtr`` needs;
    the registry still lists every policy once asked for all of them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys; from snsim import policies; info = policies.get(sys.argv[1]); "
            "mods = sorted(m for m in sys.modules if m.startswith('snsim.policies.')); "
            "print(info.name, 'numpy' in sys.modules, *mods); "
            "print(*policies.names())")
    proc = subprocess.run([sys.executable, "-c", code, "liveness"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, names = proc.stdout.strip().splitlines()[-2:]
    name, numpy, *mods = first.split()
    assert name == "liveness" and numpy == "False"
    assert "snsim.policies.liveness" in mods and "snsim.policies.dtr" not in mods
    assert not any(m.startswith("snsim.policies.optimal") for m in mods)
    assert {"liveness", "dtr", "superneurons", "vdnn-all", "sqrt-n"} <= set(names.split())
    # a name no module registers is still refused with the full list
    proc = subprocess.run([sys.executable, "-c", "from snsim import policies; "
                           "policies.get('nope')"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown policy 'nope'" in proc.stderr
    assert "superneurons" in proc.stderr.splitlines()[-1]

"""Every shipped trace under every policy gives the recorded ``--json`` numbers.

``tests/golden/simulate.json`` was written by ``scripts/golden.py`` before the
redesign (commit 2acf9a2) and guards refactors: a change that moves any
number here must be a deliberate change of a policy, made together with a new
recording (``python scripts/golden.py``) and said in its commit.  dtr on the
ResNet-2500 traces is left out (tens of seconds of planning).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests" / "golden" / "simulate.json").read_text())

import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from golden import record  # noqa: E402


def _flat(d: dict) -> dict:
    """Planner statistics beside the other keys (the layout before they were nested)."""
    d = dict(d)
    d.update(d.pop("policy_stats", {}) or {})
    return d


@pytest.mark.parametrize("trace", sorted({k.split("|")[0] for k in GOLDEN}))
def test_shipped_trace_numbers_unchanged(trace):
    want = {k: v for k, v in GOLDEN.items() if k.startswith(trace + "|")}
    got = record(ROOT / "traces" / trace, keys=set(want))
    assert set(got) == set(want)
    for key in sorted(want):
        flat, recorded = _flat(got[key]), _flat(want[key])
        # keys added after the recording (the training state's) are checked for the
        # meaning a trace without a training record has: no state, no step
        assert (flat.pop("optimizer_state_bytes"), flat.pop("optimizer_ms")) == (0, 0.0), key
        # an infeasible run's ``replayed`` (added later): a plan its planner gave up
        # on was recorded with placeholder partial figures (0 ms, the static bytes),
        # now null; a run that stopped in the replay keeps its recorded ones
        replayed = flat.pop("replayed", None)
        assert (replayed is None) == flat["feasible"], key
        if replayed is False:
            assert flat["partial_iteration_ms"] is None and flat["partial_peak_bytes"] is None
            assert recorded["partial_iteration_ms"] == 0.0, key
            assert recorded["partial_peak_bytes"] == recorded["static_bytes"], key
            recorded = {**recorded, "partial_iteration_ms": None, "partial_peak_bytes": None}
        assert flat == recorded, key


def test_planner_statistics_are_nested():
    """A planner statistic never sits beside, or overwrites, a contract key."""
    key = "k40c_resnet50_b32.json|1.5xlb|superneurons"
    got = record(ROOT / "traces" / "k40c_resnet50_b32.json", keys={key})[key]
    assert got["policy_stats"]["plan"] in ("cache-only", "cost-aware")
    stats = set(got["policy_stats"])
    assert stats and not stats & (set(got) - {"policy_stats"})

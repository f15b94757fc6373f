"""Every shipped trace under every policy gives the recorded ``--json`` numbers.

``tests/golden/simulate.json`` was written by ``scripts/golden.py`` before the
redesign (commit 2acf9a2) and guards refactors: a change that moves any
number here must be a deliberate change of a policy, made together with a new
recording (``python scripts/golden.py``, or of the entries it moved) and said
in its commit.  Its entries are in two layouts, the old one and what the
script writes today (with the training state's keys and ``replayed``): the
check reads each by its own (:func:`check_same`).  dtr on the ResNet-2500
traces is left out (tens of seconds of planning).
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


def check_same(key: str, got: dict, recorded: dict) -> None:
    """``got`` (a fresh ``--json`` object) equals ``recorded``, whichever layout
    recorded it: keys added after a recording are checked for the meaning they
    have there; a recording by today's ``scripts/golden.py`` has them all."""
    flat, recorded = _flat(got), _flat(recorded)
    if "optimizer_ms" not in recorded:
        # recorded before the training state's keys: checked for the meaning a
        # trace without a training record has: no state, no step
        assert (flat.pop("optimizer_state_bytes"), flat.pop("optimizer_ms")) == (0, 0.0), key
    if "replayed" not in recorded:
        # an infeasible run's ``replayed`` (added later, or a feasible run: none): a
        # plan its planner gave up on was recorded with placeholder partial figures
        # (0 ms, the static bytes), now null; a run that stopped in the replay keeps
        # its recorded ones
        replayed = flat.pop("replayed", None)
        assert (replayed is None) == flat["feasible"], key
        if replayed is False:
            assert flat["partial_iteration_ms"] is None and flat["partial_peak_bytes"] is None
            assert recorded["partial_iteration_ms"] == 0.0, key
            assert recorded["partial_peak_bytes"] == recorded["static_bytes"], key
            recorded = {**recorded, "partial_iteration_ms": None, "partial_peak_bytes": None}
    assert flat == recorded, key


@pytest.mark.parametrize("trace", sorted({k.split("|")[0] for k in GOLDEN}))
def test_shipped_trace_numbers_unchanged(trace):
    want = {k: v for k, v in GOLDEN.items() if k.startswith(trace + "|")}
    got = record(ROOT / "traces" / trace, keys=set(want))
    assert set(got) == set(want)
    for key in sorted(want):
        check_same(key, got[key], want[key])


def test_a_new_recording_is_accepted():
    """What ``scripts/golden.py`` writes today passes the check above (a
    recording made to re-pin a deliberate change must not fail the test)."""
    trace = "cpu_gpt_small_b4.json"
    fresh = json.loads(json.dumps(record(ROOT / "traces" / trace)))   # as written
    assert any(not v["feasible"] for v in fresh.values())   # an infeasible run among them
    for key, value in fresh.items():
        check_same(key, value, value)


def test_planner_statistics_are_nested():
    """A planner statistic never sits beside, or overwrites, a contract key."""
    key = "k40c_resnet50_b32.json|1.5xlb|superneurons"
    got = record(ROOT / "traces" / "k40c_resnet50_b32.json", keys={key})[key]
    assert got["policy_stats"]["plan"] in ("cache-only", "cost-aware")
    stats = set(got["policy_stats"])
    assert stats and not stats & (set(got) - {"policy_stats"})

"""Invariants of the core on random DAGs (Hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from snsim import synth
from snsim.graph import Graph
from snsim.policies import plan
from snsim.policies.base import PlanContext
from snsim.schedule import verify
from snsim.sim import simulate
from snsim.trace import from_dict, to_dict


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 30))
def test_none_and_liveness_invariants(seed, n):
    t = synth.random_dag(seed, n)
    g = Graph(t)
    res = {}
    for p in ("none", "liveness"):
        s = plan(p, PlanContext(g))
        verify(g, s)
        res[p] = simulate(g, s)
        assert res[p].feasible
        assert res[p].peak_bytes >= g.lower_bound_bytes
        assert res[p].iteration_ms >= res[p].compute_ms - 1e-9
    assert res["liveness"].peak_bytes <= res["none"].peak_bytes
    # liveness ends with only the statics resident
    assert res["liveness"].timeline[-1].level_bytes == t.static_bytes


@settings(max_examples=50, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 30))
def test_trace_round_trip(seed, n):
    t = synth.random_dag(seed, n)
    assert to_dict(from_dict(to_dict(t))) == to_dict(t)


@settings(derandomize=True)
@given(st.integers(0, 2**50), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
def test_parse_size(n, unit):
    from snsim.units import parse_size
    factor = {"": 1, "B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "KB": 1000,
              "MB": 10**6, "GB": 10**9}[unit]
    assert parse_size(f"{n}{unit}") == n * factor

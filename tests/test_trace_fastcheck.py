"""The fast schema check agrees with jsonschema (the published contract).

:mod:`snsim.trace.fastcheck` answers valid / not valid from the compiled
schema; the loader asks jsonschema only when the answer is "not valid".  So
the answers must agree: valid for one exactly when valid for the other, on
every bad-trace case of ``test_trace.py``, the shipped traces, hand-picked
corners of JSON Schema's number rules, and random valid and mutated
documents.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snsim import synth
from snsim.errors import TraceError
from snsim.trace import from_dict, schema, to_dict
from snsim.trace.fastcheck import Unsupported, compile_schema
from test_trace import BAD, _mutate, good_doc

FAST = compile_schema(schema())
FULL = jsonschema.Draft202012Validator(schema())
TRACES = sorted((Path(__file__).parent.parent / "traces").glob("*.json"))


def agree(doc) -> bool:
    fast, full = FAST(doc), FULL.is_valid(doc)
    assert fast == full, f"fast check says {fast}, jsonschema says {full}"
    return fast


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trace_cases_agree(case):
    mutate, _ = BAD[case]
    agree(_mutate(mutate))


def test_bad_schema_violations_are_caught_by_both():
    # the cases that break the schema itself (not only the second pass) are invalid for both
    for case in ("missing field", "mistyped field", "negative size", "unknown kind",
                 "unknown bwd_reads", "empty layers", "missing layers", "negative workspace",
                 "bad device", "batch zero"):
        assert agree(_mutate(BAD[case][0])) is False, case


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_shipped_traces_agree(path):
    assert agree(json.loads(path.read_text())) is True


@pytest.mark.parametrize("value, valid", [
    (3, True), (3.0, True),      # an integral float is an integer for JSON Schema
    (3.5, False), (True, False), (-1, False), (-0.0, True),
    (float("nan"), False),       # a NaN is not integral
    (float("inf"), False), ("3", False), (None, False), ([3], False),
])
def test_integer_corners(value, valid):
    doc = good_doc()
    doc["layers"][1]["output_bytes"] = value
    assert agree(doc) is valid


@pytest.mark.parametrize("value, valid", [
    (0, True), (0.0, True), (2.5, True), (-1e-9, False), (False, False),
    (float("nan"), True),        # NaN is not below the minimum: the second pass refuses it
    (float("inf"), True), (float("-inf"), False), ("1", False),
])
def test_number_corners(value, valid):
    doc = good_doc()
    doc["layers"][2]["fwd_ms"] = value
    assert agree(doc) is valid


def test_nan_does_not_hide_a_negative_value():
    doc = good_doc()
    doc["layers"][0]["fwd_ms"] = float("nan")   # first: min() would stop at it
    doc["layers"][2]["fwd_ms"] = -1.0
    assert agree(doc) is False


@pytest.mark.parametrize("reads, valid", [
    ([], True), (["inputs", "output"], True), (["inputs", "inputs"], False),
    ([["inputs"]], False), ([1], False), ([True], False), ("inputs", False),
])
def test_bwd_reads_corners(reads, valid):
    doc = good_doc()
    doc["layers"][1]["bwd_reads"] = reads
    assert agree(doc) is valid


def test_tuples_are_not_arrays_for_either():
    doc = good_doc()
    doc["layers"][1]["inputs"] = (0,)
    assert agree(doc) is False


def test_loader_keeps_jsonschema_message_for_a_deep_layer():
    doc = to_dict(synth.chain(300))
    doc["layers"][250]["param_bytes"] = -4
    with pytest.raises(TraceError) as info:
        from_dict(doc, "deep.json")
    assert str(info.value) == ("deep.json: layer 250 (" + doc["layers"][250]["name"]
                               + "), field param_bytes: -4 is less than the minimum of 0")


def test_unknown_keyword_is_unsupported_not_ignored():
    with pytest.raises(Unsupported):
        compile_schema({"type": "object", "additionalProperties": False})
    with pytest.raises(Unsupported):
        compile_schema({"type": "array", "items": {"type": "integer", "multipleOf": 2}})


# ------------------------------------------------------------ random documents

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**12)
    | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
        ["", "conv", "inputs", "output", "data", "loss", "snsim.trace/1", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["algo", "bytes", "fwd_ms", "bwd_ms", "id", "name"]), inner, max_size=3),
    max_leaves=6)


def _paths(obj, prefix=()):
    """Every (container, key) pair inside a document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


def _valid_doc(seed: int, n: int, workspaces: bool):
    doc = to_dict(synth.random_dag(seed, n))
    if workspaces:
        for raw in doc["layers"][1::2]:
            raw["workspace"] = [{"algo": "a", "bytes": 0, "fwd_ms": raw["fwd_ms"],
                                 "bwd_ms": raw["bwd_ms"]},
                                {"algo": "b", "bytes": 64, "bwd_bytes": 32, "fwd_ms": 0.0,
                                 "bwd_ms": 0.0}]
    return doc


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 40), ws=st.booleans())
def test_random_valid_documents_agree(seed, n, ws):
    assert agree(_valid_doc(seed, n, ws)) is True


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 12), ws=st.booleans(),
       data=st.data())
def test_random_mutated_documents_agree(seed, n, ws, data):
    doc = _valid_doc(seed, n, ws)
    mutated = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = list(_paths(mutated))
        path = data.draw(st.sampled_from(paths), label="path")
        parent = mutated
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans(), label="delete"):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON_VALUES, label="value")
        if not isinstance(mutated.get("layers"), list) or not mutated["layers"]:
            break
    agree(mutated)


def test_mutations_reach_both_verdicts():
    # the mutated-document test is only worth something if some mutations stay valid
    # and some do not: two fixed ones, one of each
    doc = _valid_doc(1, 6, True)
    ok = copy.deepcopy(doc)
    ok["layers"][3]["name"] = "renamed"
    bad = copy.deepcopy(doc)
    bad["layers"][3]["workspace"][1]["bwd_bytes"] = math.pi
    assert agree(ok) is True and agree(bad) is False

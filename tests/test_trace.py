"""Trace loading: round trip, published schema, and every bad-trace case."""

from __future__ import annotations

import copy
import json

import pytest

from snsim.errors import TraceError
from snsim.trace import from_dict, load, save, schema, to_dict


def good_doc():
    return {
        "schema": "snsim.trace/1", "model": "tiny", "batch": 2, "dtype": "float32",
        "input_shape": [3, 8, 8],
        "source": {"kind": "modeled", "device_model": "hand-written"},
        "device": {"name": "d", "memory_bytes": 1000000, "h2d_bytes_per_s": 1e9,
                   "d2h_bytes_per_s": 1e9},
        "layers": [
            {"id": 0, "name": "data", "kind": "data", "inputs": [], "output_bytes": 1536,
             "param_bytes": 0, "fwd_ms": 0.0, "bwd_ms": 0.0, "bwd_reads": []},
            {"id": 1, "name": "conv1", "kind": "conv", "inputs": [0], "output_bytes": 4096,
             "param_bytes": 1792, "fwd_ms": 0.5, "bwd_ms": 1.0, "bwd_reads": ["inputs"],
             "workspace": [{"algo": "a", "bytes": 0, "fwd_ms": 0.5, "bwd_ms": 1.0},
                           {"algo": "b", "bytes": 64, "fwd_ms": 0.2, "bwd_ms": 0.4}]},
            {"id": 2, "name": "loss", "kind": "loss", "inputs": [1], "output_bytes": 4,
             "param_bytes": 0, "fwd_ms": 0.1, "bwd_ms": 0.1, "bwd_reads": ["inputs"],
             "custom_field": {"kept": True}},
        ],
    }


def test_round_trip(tmp_path):
    t = from_dict(good_doc())
    save(t, tmp_path / "t.json")
    t2 = load(tmp_path / "t.json")
    assert to_dict(t2) == to_dict(t)
    assert t2.layers[2].extra == {"custom_field": {"kept": True}}
    assert t2.layers[1].workspace[1].bytes == 64
    assert t.static_bytes == 2 * 1792


def test_published_schema_is_the_contract():
    """The schema says what DESIGN section 1 (the fixed contract) says, written
    out here by hand, and the loader refuses a layer missing any required field."""
    s = schema()
    assert s["properties"]["schema"]["const"] == "snsim.trace/1"
    assert sorted(s["required"]) == ["batch", "layers", "model", "schema"]
    layer = s["$defs"]["layer"]
    required = ["id", "name", "kind", "inputs", "output_bytes", "param_bytes", "fwd_ms",
                "bwd_ms", "bwd_reads"]
    assert sorted(layer["required"]) == sorted(required)
    assert sorted(layer["properties"]["kind"]["enum"]) == sorted(
        "data conv fc pool act bn lrn dropout add concat loss softmax matmul attention norm "
        "embedding other".split())
    assert sorted(layer["properties"]["bwd_reads"]["items"]["enum"]) == ["inputs", "output"]
    for key in required:
        doc = copy.deepcopy(good_doc())
        del doc["layers"][1][key]
        with pytest.raises(TraceError, match=f"{key}: missing required field"):
            from_dict(doc)


def _mutate(fn):
    doc = copy.deepcopy(good_doc())
    fn(doc)
    return doc


def _set(path, value):
    def fn(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return fn


def _del(path):
    def fn(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return fn


BAD = {
    "missing field": (_del(["layers", 1, "fwd_ms"]), "layer 1 (conv1), field fwd_ms: missing"),
    "mistyped field": (_set(["layers", 1, "output_bytes"], "big"),
                       "layer 1 (conv1), field output_bytes: 'big' is not of type 'integer'"),
    "negative size": (_set(["layers", 1, "param_bytes"], -4),
                      "layer 1 (conv1), field param_bytes: -4 is less than the minimum"),
    "nan time": (_set(["layers", 2, "bwd_ms"], float("nan")), "layer 2 (loss), field bwd_ms"),
    "infinite time": (_set(["layers", 2, "fwd_ms"], float("inf")),
                      "layer 2 (loss), field fwd_ms: time must be finite"),
    "input not smaller": (_set(["layers", 1, "inputs"], [1]),
                          "layer 1 (conv1), field inputs: input 1 is not an earlier layer"),
    "input does not exist": (_set(["layers", 2, "inputs"], [7]),
                             "layer 2 (loss), field inputs: input 7 does not exist"),
    "duplicate ids": (_set(["layers", 2, "id"], 1), "layer 2 (loss), field id: duplicate id 1"),
    "id is not index": (_set(["layers", 2, "id"], 5),
                        "layer 2 (loss), field id: id 5 must equal its index 2"),
    "unknown kind": (_set(["layers", 1, "kind"], "convolution"),
                     "layer 1 (conv1), field kind: 'convolution' is not one of"),
    "unknown bwd_reads": (_set(["layers", 1, "bwd_reads"], ["weights"]),
                          "layer 1 (conv1), field bwd_reads.0: 'weights' is not one of"),
    "schema version": (_set(["schema"], "snsim.trace/2"),
                       "unsupported schema version 'snsim.trace/2'"),
    "no schema": (_del(["schema"]), "unsupported schema version None"),
    "empty layers": (_set(["layers"], []), "field layers: [] should be non-empty"),
    "missing layers": (_del(["layers"]), "field layers: missing required field"),
    "negative workspace": (_set(["layers", 1, "workspace", 1, "bytes"], -1),
                           "layer 1 (conv1), field workspace.1.bytes"),
    "bad device": (_set(["device", "memory_bytes"], 0), "field device.memory_bytes"),
    "batch zero": (_set(["batch"], 0), "field batch: 0 is less than the minimum of 1"),
    "grad_pieces neither form": (_set(["layers", 2, "grad_pieces"], [[1, 64, 0, 1]]),
                                 "layer 2 (loss), field grad_pieces: [1, 64, 0, 1] is neither"),
    "grad_pieces bytes": (_set(["layers", 2, "grad_pieces"], [[1, 64, 0, 1, 32]]),
                          "its pieces' add up to 32"),
    "grad_whole without pieces": (_set(["layers", 2, "grad_whole"], [1]),
                                  "layer 2 (loss), field grad_whole: layer 1 is not an input "
                                  "it lists in grad_pieces"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trace(tmp_path, case):
    mutate, message = BAD[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_mutate(mutate)))
    with pytest.raises(TraceError) as info:
        load(path)
    text = str(info.value)
    assert text.startswith(str(path) + ": ")
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize("content, message", [
    ("{not json", "invalid JSON at line 1 column 2"),
    ("[1, 2]", "top level must be a JSON object"),
    ("", "invalid JSON"),
])
def test_unparsable(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load(path)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load(tmp_path / "nope.json")


def test_save_refuses_invalid_and_leaves_nothing(tmp_path):
    from dataclasses import replace
    t = from_dict(good_doc())
    bad = replace(t, layers=(t.layers[0], replace(t.layers[1], inputs=(1,)), t.layers[2]))
    with pytest.raises(TraceError):
        save(bad, tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


def test_shipped_traces_load():
    import pathlib
    from snsim.graph import Graph
    paths = sorted((pathlib.Path(__file__).parent.parent / "traces").glob("*.json"))
    assert len(paths) >= 3
    for p in paths:
        t = load(p)
        assert t.source.get("kind") in ("measured", "modeled")
        assert Graph(t).lower_bound_bytes > t.static_bytes

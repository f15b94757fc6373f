"""Load and save ``snsim.trace/1`` files.

Loading validates in two passes: the JSON Schema published beside this module
(``trace.schema.json``), then the checks a schema cannot express (ids equal
their index, inputs refer to earlier layers, finite numbers).  Every failure
is a :class:`TraceError` naming the file, the layer and the field.

The schema pass runs the schema compiled into column-wise checks
(:mod:`snsim.trace.fastcheck`, about 100x faster than jsonschema on a deep
trace); only a document it does not pass goes to jsonschema, which finds
and words the error, so the messages are jsonschema's own.
"""

from __future__ import annotations

import gc
import json
import math
from itertools import chain, compress, filterfalse, repeat
from operator import itemgetter, lt, not_
from pathlib import Path
from typing import Any

from snsim.errors import TraceError
from snsim.fileio import write_json
from snsim.trace.fastcheck import Unsupported, compile_schema
from snsim.training import parse as parse_training
from snsim.trace.model import (DEFAULT_DEVICE, SCHEMA, Device, Layer, Trace, Workspace,
                               make_records)

_LAYER_KEYS = frozenset({"id", "name", "kind", "inputs", "output_bytes", "param_bytes", "fwd_ms",
               "bwd_ms", "bwd_reads", "saved_extra_bytes", "workspace", "grad_bytes"})
_TOP_KEYS = {"schema", "model", "batch", "dtype", "input_shape", "source", "device", "layers"}
# the optional layer fields only some checks of _semantic_check and _oplog_check read
_RARE_KEYS = frozenset({"grad_bytes", "grad_shares", "grad_pieces", "grad_whole",
                        "param_shares",
                        "inplace_alias",
                        "output_sizes", "input_results", "alias_of", "output_released_after",
                        "released_after"})
_ID, _INPUTS = itemgetter("id"), itemgetter("inputs")
_FWD_MS, _BWD_MS = itemgetter("fwd_ms"), itemgetter("bwd_ms")
_validator = None
_fast = None


def schema() -> dict[str, Any]:
    """The published JSON Schema of ``snsim.trace/1``."""
    # beside this module (package data); read as a plain file: importlib.resources
    # would import its readers (zipfile among them) on every command's path
    text = Path(__file__).with_name("trace.schema.json").read_text("utf-8")
    return json.loads(text)


def _fast_check(doc: Any) -> bool:
    """True only if ``doc`` is valid under the schema (:mod:`snsim.trace.fastcheck`)."""
    global _fast
    if _fast is None:
        try:
            _fast = compile_schema(schema())
        except Unsupported:   # a keyword the fast path does not know: jsonschema alone
            _fast = lambda doc: False  # noqa: E731
    return _fast(doc)


def _schema_validator():
    global _validator
    if _validator is None:
        import jsonschema

        _validator = jsonschema.Draft202012Validator(schema())
    return _validator


def _where(doc: dict[str, Any], path: list[Any]) -> str:
    """'layer 3 (conv1), field output_bytes' from a JSON path."""
    if len(path) >= 2 and path[0] == "layers" and isinstance(path[1], int):
        idx = path[1]
        name = ""
        layers = doc.get("layers")
        if isinstance(layers, list) and idx < len(layers) and isinstance(layers[idx], dict):
            name = f" ({layers[idx].get('name')})" if "name" in layers[idx] else ""
        rest = ".".join(str(p) for p in path[2:])
        return f"layer {idx}{name}" + (f", field {rest}" if rest else "")
    return "field " + ".".join(str(p) for p in path) if path else "top level"


def _schema_check(doc: Any, label: str) -> None:
    if not isinstance(doc, dict):
        raise TraceError(f"{label}: top level must be a JSON object, got {type(doc).__name__}")
    version = doc.get("schema")
    if version != SCHEMA:
        raise TraceError(f"{label}: unsupported schema version {version!r} "
                         f"(this snsim reads {SCHEMA!r})")
    if _fast_check(doc):
        return
    # Not valid (or not sure): jsonschema finds the error and words it, as it always has.
    import jsonschema

    errors = list(_schema_validator().iter_errors(doc))
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors)
    path = list(err.absolute_path)
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        where = _where(doc, path + [missing])
        raise TraceError(f"{label}: {where}: missing required field")
    raise TraceError(f"{label}: {_where(doc, path)}: {err.message}")


def _semantic_ok(layers: list) -> bool:
    """True only if no layer of a schema-valid ``layers`` breaks a rule of
    :func:`_semantic_check`: its per-layer rules, checked column-wise in C for
    a trace whose layers have none of the rare fields (a false answer only
    sends the document to the loop, which finds and words the first error)."""
    n = len(layers)
    try:
        if not all(map(_RARE_KEYS.isdisjoint, layers)):
            return False
        if list(map(_ID, layers)) != list(range(n)):   # ids unique, equal to their index
            return False
        ins = list(map(_INPUTS, layers))
        owners = chain.from_iterable(map(repeat, range(n), map(len, ins)))
        if not all(map(lt, chain.from_iterable(ins), owners)):   # earlier layers only
            return False
        if not (all(map(math.isfinite, map(_FWD_MS, layers)))
                and all(map(math.isfinite, map(_BWD_MS, layers)))):
            return False
        wss = list(chain.from_iterable(raw.get("workspace", ()) for raw in layers))
        if not (all(map(math.isfinite, map(_FWD_MS, wss)))
                and all(map(math.isfinite, map(_BWD_MS, wss)))):
            return False
        # only data layers have no inputs (the first layer is checked on its own)
        no_inputs = compress(range(1, n), map(not_, ins[1:]))
        return all(layers[i]["kind"] == "data" for i in no_inputs)
    except (TypeError, ValueError, OverflowError):
        return False


def _semantic_check(doc: dict[str, Any], label: str) -> None:
    layers = doc["layers"]
    if not _semantic_ok(layers):
        _semantic_loop(layers, label)
    if layers[0]["inputs"]:
        raise TraceError(f"{label}: layer 0 ({layers[0]['name']}), field inputs: "
                         "the first layer cannot have inputs")
    dev = doc.get("device")
    if dev is not None:
        for key in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
            if not math.isfinite(dev[key]):
                raise TraceError(f"{label}: field device.{key}: bandwidth must be finite")


def _semantic_loop(layers: list, label: str) -> None:
    """The per-layer rules of :func:`_semantic_check`, layer by layer: the first
    layer that breaks one raises, in words."""
    seen: set[int] = set()
    for idx, raw in enumerate(layers):
        lid = raw["id"]
        where = f"{label}: layer {idx} ({raw['name']})"
        if lid in seen:
            raise TraceError(f"{where}, field id: duplicate id {lid}")
        seen.add(lid)
        if lid != idx:
            raise TraceError(f"{where}, field id: id {lid} must equal its index {idx}")
        for j in raw["inputs"]:
            if j >= len(layers):
                raise TraceError(f"{where}, field inputs: input {j} does not exist "
                                 f"(the trace has {len(layers)} layers)")
            if j >= idx:
                raise TraceError(f"{where}, field inputs: input {j} is not an earlier layer "
                                 f"(inputs must be smaller than the layer id)")
        for key in ("fwd_ms", "bwd_ms"):
            if not math.isfinite(raw[key]):
                raise TraceError(f"{where}, field {key}: time must be finite, got {raw[key]}")
        for k, ws in enumerate(raw.get("workspace", [])):
            for key in ("fwd_ms", "bwd_ms"):
                if not math.isfinite(ws[key]):
                    raise TraceError(f"{where}, field workspace.{k}.{key}: time must be finite")
        if raw.keys().isdisjoint(_RARE_KEYS):
            # none of the fields the checks below read (most layers of most traces)
            if idx > 0 and raw["kind"] != "data" and not raw["inputs"]:
                raise TraceError(f"{where}, field inputs: only data layers may have no "
                                 "inputs")
            continue
        if raw.get("grad_bytes", 0) > raw["output_bytes"]:
            raise TraceError(f"{where}, field grad_bytes: {raw['grad_bytes']} is more than "
                             f"output_bytes {raw['output_bytes']} (a gradient is at most the "
                             "output's size)")
        for j in raw.get("grad_shares", ()):
            if j not in raw["inputs"]:
                raise TraceError(f"{where}, field grad_shares: layer {j} is not one of its "
                                 "inputs")
        for pair in raw.get("grad_pieces", ()):
            if (len(pair) != 2 and (len(pair) < 5 or len(pair) % 2 == 0)) \
                    or pair[0] not in raw["inputs"]:
                raise TraceError(f"{where}, field grad_pieces: {pair} is neither "
                                 "[input layer, bytes] nor [input layer, bytes, view, "
                                 "piece, bytes, ...] naming one of its inputs")
            if len(pair) > 2 and sum(pair[4::2]) != pair[1]:
                raise TraceError(f"{where}, field grad_pieces: {pair} says {pair[1]} "
                                 f"bytes, its pieces' add up to {sum(pair[4::2])}")
            if pair[1] > layers[pair[0]]["output_bytes"]:
                raise TraceError(f"{where}, field grad_pieces: {pair[1]} bytes of pieces "
                                 f"of layer {pair[0]}, whose output has "
                                 f"{layers[pair[0]]['output_bytes']}")
        for j in raw.get("grad_whole", ()):
            if all(pair[0] != j for pair in raw.get("grad_pieces", ())):
                raise TraceError(f"{where}, field grad_whole: layer {j} is not an input it "
                                 "lists in grad_pieces")
        for pair in raw.get("param_shares", ()):
            if len(pair) != 2:
                raise TraceError(f"{where}, field param_shares: {pair} is not a pair "
                                 "[owner layer, bytes]")
            owner, nb = pair
            if owner >= idx:
                raise TraceError(f"{where}, field param_shares: layer {owner} is not an "
                                 "earlier layer (the parameters' owner comes first)")
            if nb > layers[owner]["param_bytes"]:
                raise TraceError(f"{where}, field param_shares: {nb} bytes of layer {owner}'s "
                                 f"parameters, which has {layers[owner]['param_bytes']}")
        if raw.get("inplace_alias") and raw.get("inplace_of") not in raw["inputs"]:
            raise TraceError(f"{where}, field inplace_alias: needs inplace_of, one of its "
                             "inputs (the layer whose storage it writes into)")
        _oplog_check(raw, idx, layers, where)
        if idx > 0 and raw["kind"] != "data" and not raw["inputs"]:
            raise TraceError(f"{where}, field inputs: only data layers may have no inputs")


def _oplog_check(raw: dict[str, Any], idx: int, layers: list, where: str) -> None:
    """The op-log fields (docs/DESIGN.md, "Op-log traces") where a layer has them."""
    sizes = raw.get("output_sizes")
    if sizes is not None and sum(sizes) != raw["output_bytes"]:
        raise TraceError(f"{where}, field output_sizes: they sum to {sum(sizes)}, "
                         f"not output_bytes {raw['output_bytes']}")
    for key in ("input_results", "alias_of"):
        for pair in raw.get(key, ()):
            if len(pair) != 2:
                raise TraceError(f"{where}, field {key}: {pair} is not a [layer, result] pair")
            j, k = pair
            if j not in raw["inputs"]:
                raise TraceError(f"{where}, field {key}: layer {j} is not one of its inputs")
            if k and k >= len(layers[j].get("output_sizes", ())):
                raise TraceError(f"{where}, field {key}: layer {j} has no result {k}")
    rels = raw.get("output_released_after")
    if rels is not None and len(rels) != len(sizes or ()):
        raise TraceError(f"{where}, field output_released_after: one per output_sizes entry")
    for rel in ([raw["released_after"]] if "released_after" in raw else []) + (rels or []):
        if not idx <= rel < len(layers):
            raise TraceError(f"{where}, field released_after: {rel} must be a layer id "
                             f"from {idx} to {len(layers) - 1}")


_READS: dict[tuple, frozenset[str]] = {}   # bwd_reads lists -> one shared frozenset each


def _layer_fields(raw: dict[str, Any]) -> tuple:
    """The fields of the layer ``raw`` describes, in :class:`Layer`'s order."""
    # the fields by position, in Layer's and Workspace's order (~10^4 layers on a
    # deep trace: keyword calls cost a tenth of the load)
    wss = raw.get("workspace")
    ws = tuple(Workspace(w["algo"], int(w["bytes"]), float(w["fwd_ms"]), float(w["bwd_ms"]),
                         int(w["bwd_bytes"]) if "bwd_bytes" in w else None,
                         int(w["bwd_released"]) if "bwd_released" in w else None)
               for w in wss) if wss is not None else ()
    reads = tuple(raw["bwd_reads"])
    fs = _READS.get(reads)
    if fs is None:
        fs = _READS[reads] = frozenset(reads)
    # the keys Layer does not name, in the document's order, picked in C
    more = list(filterfalse(_LAYER_KEYS.__contains__, raw))
    extra = dict(zip(more, map(raw.__getitem__, more))) if more else {}
    grad = raw.get("grad_bytes")
    return (raw["id"], raw["name"], raw["kind"], tuple(raw["inputs"]),
            int(raw["output_bytes"]), int(raw["param_bytes"]), float(raw["fwd_ms"]),
            float(raw["bwd_ms"]), fs, int(raw.get("saved_extra_bytes", 0)), ws,
            None if grad is None else int(grad), extra)


def _layers(raws: list) -> tuple[Layer, ...]:
    """The layers of a checked document, made in C from their fields' columns
    (:func:`~snsim.trace.model.make_records`)."""
    if not raws:
        return ()
    return tuple(make_records(Layer, *zip(*map(_layer_fields, raws))))


def from_dict(doc: Any, label: str = "<trace>") -> Trace:
    """Validate a parsed trace document and build a :class:`Trace`."""
    # ~10^5 small objects and no reference cycles: the cyclic collector's passes
    # while they are made (two full ones on ResNet-2500) cost a third of the load
    was = gc.isenabled()
    gc.disable()
    try:
        return _from_dict(doc, label)
    finally:
        if was:
            gc.enable()


def _from_dict(doc: Any, label: str) -> Trace:
    _schema_check(doc, label)
    _semantic_check(doc, label)
    parse_training(doc.get("training"), label)   # refused at load, in one line
    dev = doc.get("device")
    device = DEFAULT_DEVICE if dev is None else Device(
        name=str(dev.get("name", "unnamed")), memory_bytes=int(dev["memory_bytes"]),
        h2d_Bps=float(dev["h2d_bytes_per_s"]), d2h_Bps=float(dev["d2h_bytes_per_s"]))
    return Trace(model=doc["model"], batch=int(doc["batch"]),
                 layers=_layers(doc["layers"]), device=device,
                 dtype=doc.get("dtype", "float32"),
                 input_shape=tuple(doc.get("input_shape", ())),
                 source=dict(doc.get("source", {})),
                 extra={k: v for k, v in doc.items() if k not in _TOP_KEYS},
                 path=None if label == "<trace>" else label)


def _reject_constant(token: str) -> float:
    raise ValueError(f"non-finite number {token}")


def load(path: str | Path) -> Trace:
    """Read and validate a trace file; raise :class:`TraceError` on any problem."""
    label = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{label}: cannot read: {exc}") from None
    was = gc.isenabled()
    gc.disable()   # as in from_dict: the parsed document is ~10^5 objects, no cycles
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}") from None
    finally:
        if was:
            gc.enable()
    return from_dict(doc, label)


def to_dict(trace: Trace) -> dict[str, Any]:
    """The ``snsim.trace/1`` document of a trace (inverse of :func:`from_dict`)."""
    layers = []
    for layer in trace.layers:
        raw: dict[str, Any] = {
            "id": layer.id, "name": layer.name, "kind": layer.kind,
            "inputs": list(layer.inputs), "output_bytes": layer.output_bytes,
            "param_bytes": layer.param_bytes, "fwd_ms": layer.fwd_ms,
            "bwd_ms": layer.bwd_ms,
            "bwd_reads": [r for r in ("inputs", "output") if r in layer.bwd_reads],
        }
        if layer.saved_extra_bytes:
            raw["saved_extra_bytes"] = layer.saved_extra_bytes
        if layer.grad_bytes is not None:
            raw["grad_bytes"] = layer.grad_bytes
        if layer.workspace:
            raw["workspace"] = []
            for w in layer.workspace:
                entry = {"algo": w.algo, "bytes": w.bytes, "fwd_ms": w.fwd_ms,
                         "bwd_ms": w.bwd_ms}
                if w.bwd_bytes is not None:
                    entry["bwd_bytes"] = w.bwd_bytes
                if w.bwd_released is not None:
                    entry["bwd_released"] = w.bwd_released
                raw["workspace"].append(entry)
        raw.update(layer.extra)
        layers.append(raw)
    doc: dict[str, Any] = {
        "schema": SCHEMA, "model": trace.model, "batch": trace.batch, "dtype": trace.dtype,
        "input_shape": list(trace.input_shape), "source": dict(trace.source),
        "device": {"name": trace.device.name, "memory_bytes": trace.device.memory_bytes,
                   "h2d_bytes_per_s": trace.device.h2d_Bps,
                   "d2h_bytes_per_s": trace.device.d2h_Bps},
    }
    doc.update(trace.extra)
    doc["layers"] = layers
    return doc


def save(trace: Trace, path: str | Path) -> None:
    """Validate and write a trace whole (temp file + rename)."""
    doc = to_dict(trace)
    from_dict(doc, str(path))  # never write a file snsim itself would refuse
    write_json(path, doc)

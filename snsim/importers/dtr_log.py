"""DTR op logs (uwsampl/dtr-prototype, simrd's input) as snsim traces.

A log is one JSON object per line, one per PyTorch operation of a whole
training step (autograd's backward kernels are ordinary ops):

- ``CONSTANT`` + ``MEMORY``: a tensor resident all run (weights, the batch);
- ``CALL``: an op, ``RESULT`` names, ``TIME`` in ns, then per result a
  ``MEMORY`` (bytes) and an ``ALIAS`` (index of the argument it is a view of,
  or -1; a view allocates nothing and shares that argument's storage);
- ``MUTATE``: an in-place op; as simrd does, each mutated argument becomes
  a new tensor of its storage's size and the old one is released;
- ``COPY`` (a new reference), ``COPY_FROM`` (``DST`` now names ``SRC``'s
  tensor), ``RELEASE`` (a reference dropped), ``ANNOTATE`` (START, BACKWARD).

The trace (docs/DESIGN.md, "Op-log traces"): layer 0 is a 0-byte ``data``
placeholder (the input of ops that read only constants), then one layer per
op in log order, all of its results in that layer (``output_sizes``), then a
0-byte ``loss`` layer reading what the program still holds at the end (the
step's outputs, which simrd pins there).  Constants are ``constant_bytes``,
static memory.  ``alias_of`` names the layers whose storage a view shares
(a view of a constant, made from constants only: ``[0, 0]``, the data
placeholder, so it stays as simrd's alias of a pinned constant does),
``released_after`` the layer after which the program held no reference to
the layer's results.  No layer has parameters, so the route is the ops in
order and nothing more: the trace says ``forward_only``.

:func:`baseline_peak` replays the log itself as simrd's unlimited run does
(each storage freed when its last reference is released, constants counted
when they appear): the peak the DTR paper's budget ratios multiply.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from snsim.errors import SnsimError

FORMAT = "dtr-log"

# op-name fragment -> layer kind (first match wins); the rest are "other"
_KINDS = (("backward", "other"), ("conv", "conv"), ("batch_norm", "bn"),
          ("layer_norm", "norm"), ("native_norm", "norm"), ("pool", "pool"),
          ("dropout", "dropout"), ("softmax", "softmax"), ("nll_loss", "loss"),
          ("cross_entropy", "loss"), ("embedding", "embedding"), ("addmm", "fc"),
          ("linear", "fc"), ("matmul", "matmul"), ("bmm", "matmul"), ("mm", "matmul"),
          ("relu", "act"), ("sigmoid", "act"), ("tanh", "act"), ("threshold", "act"),
          ("gelu", "act"), ("cat", "concat"), ("add", "add"))


def kind_of(op: str) -> str:
    for frag, kind in _KINDS:
        if frag in op:
            return kind
    return "other"


@dataclass
class Op:
    """One op of the log: a layer of the trace."""

    name: str
    time_ns: int
    inputs: list[int]                 # layers (0 = only constants)
    sizes: list[int]                  # per result, bytes (a view's is 0)
    reads: list[tuple[int, int]] = field(default_factory=list)     # (layer, result) read
    alias_of: list[tuple[int, int]] = field(default_factory=list)  # storage it shares
    released: list[int | None] = field(default_factory=list)  # per result: last release
    backward: bool = False


@dataclass
class Log:
    """A parsed log: its ops, constants, and its own unlimited-run peak."""

    ops: list[Op]
    constant_bytes: int
    held: list[tuple[int, int]]  # (layer, result) the program still references at the end
    baseline_peak_bytes: int
    backward_from: int | None  # first layer after the BACKWARD annotation
    lines: int


class _Parser:
    """Walks the records; tensors are keys ``(layer, result)`` or ``("c", name)``."""

    def __init__(self, label: str):
        self.label = label
        self.ops: list[Op] = [Op("data", 0, [], [0])]
        self.names: dict[str, tuple] = {}          # log name -> tensor key
        self.refs: dict[tuple, int] = {}           # tensor key -> references
        self.storage: dict[tuple, tuple] = {}      # tensor key -> storage root key
        self.sbytes: dict[tuple, int] = {}         # storage root -> bytes
        self.srefs: dict[tuple, int] = {}          # storage root -> references
        self.constant_bytes = 0
        self.level = self.peak = 0
        self.backward = False
        self.backward_from: int | None = None
        self.lineno = 0

    def fail(self, msg: str) -> SnsimError:
        return SnsimError(f"{self.label}: line {self.lineno}: {msg}")

    def key(self, name: str) -> tuple:
        try:
            return self.names[name]
        except KeyError:
            raise self.fail(f"tensor {name!r} is used before it is defined") from None

    # --------------------------------------------------------- references
    def ref(self, key: tuple) -> None:
        self.refs[key] += 1
        self.srefs[self.storage[key]] += 1

    def release(self, key: tuple) -> None:
        self.refs[key] -= 1
        if key[0] != "c" and self.refs[key] == 0:
            self.ops[key[0]].released[key[1]] = len(self.ops) - 1
        root = self.storage[key]
        self.srefs[root] -= 1
        if self.srefs[root] == 0 and root[0] != "c":
            self.level -= self.sbytes[root]

    def new_tensor(self, key: tuple, root: tuple, size: int) -> None:
        self.refs[key] = 1
        self.storage[key] = root
        if root == key:
            self.sbytes[key] = size
            self.srefs[key] = 1
        else:
            self.srefs[root] += 1

    # ---------------------------------------------------------------- ops
    def add_op(self, name: str, time: int, args: list[tuple], sizes: list[int],
               alias: list[int], results: list[str]) -> None:
        lid = len(self.ops)
        reads = list(dict.fromkeys(a for a in args if a[0] != "c"))
        ins = list(dict.fromkeys(a[0] for a in reads)) or [0]
        views = []
        for k, a in enumerate(alias):
            key = (lid, k)
            if a == -1:
                self.new_tensor(key, key, sizes[k])
            else:
                if not 0 <= a < len(args):
                    raise self.fail(f"ALIAS {a} of {results[k]!r} is not an argument index")
                sizes[k] = 0
                self.new_tensor(key, self.storage[args[a]], 0)
                if args[a][0] != "c":
                    views.append(args[a])
                elif ins == [0]:   # a view of a constant: of the data placeholder,
                    views.append((0, 0))   # so it stays while the constant does
        self.ops.append(Op(name, time, ins, sizes, reads, list(dict.fromkeys(views)),
                           [None] * len(sizes), backward=self.backward))
        self.level += sum(sizes)
        self.peak = max(self.peak, self.level)
        for k, r in enumerate(results):
            self.names[r] = (lid, k)

    def call(self, rec: dict, it) -> None:
        results = list(rec["RESULT"])
        sizes, alias = [], []
        for r in results:
            mem = self.next_record(it, "MEMORY", r)
            al = self.next_record(it, "ALIAS", r)
            sizes.append(int(mem["MEMORY"]))
            alias.append(int(al["ALIAS"]))
        self.backward |= "backward" in rec["NAME"]
        args = [self.key(a) for a in rec["ARGS"]]
        self.add_op(rec["NAME"], int(rec["TIME"]), args, sizes, alias, results)

    def mutate(self, rec: dict) -> None:
        self.backward |= "backward" in rec["NAME"]
        names = list(rec["ARGS"])
        args = [self.key(a) for a in names]
        idx = [int(m) for m in rec["MUTATE"]]
        for m in idx:
            if not 0 <= m < len(args):
                raise self.fail(f"MUTATE index {m} is not an argument index")
        sizes = [self.sbytes[self.storage[args[m]]] if self.storage[args[m]][0] != "c"
                 else self.constant_size(args[m]) for m in idx]
        lid = len(self.ops)
        self.add_op(rec["NAME"], int(rec["TIME"]), args, sizes, [-1] * len(idx),
                    [f"{names[m]}$mut{lid}" for m in idx])
        for k, m in enumerate(idx):
            self.names[names[m]] = (lid, k)
            self.release(args[m])

    def constant_size(self, key: tuple) -> int:
        return self.sbytes[self.storage[key]]

    def next_record(self, it, kind: str, name: str) -> dict:
        line, rec = next(it, (self.lineno, None))
        self.lineno = line
        if rec is None or rec.get("INSTRUCTION") != kind or rec.get("NAME") != name:
            raise self.fail(f"expected the {kind} record of {name!r}")
        return rec

    def record(self, rec: dict, it) -> None:
        ins = rec.get("INSTRUCTION")
        if ins == "CALL":
            self.call(rec, it)
        elif ins == "CONSTANT":
            name = rec["NAME"]
            mem = int(self.next_record(it, "MEMORY", name)["MEMORY"])
            key = ("c", name)
            self.names[name] = key
            self.refs[key] = 1
            self.storage[key] = key
            self.sbytes[key] = mem
            self.srefs[key] = 1
            self.constant_bytes += mem
            self.level += mem
            self.peak = max(self.peak, self.level)
        elif ins == "COPY":
            key = self.key(rec["SRC"])
            self.names[rec["DST"]] = key
            self.ref(key)
        elif ins == "COPY_FROM":
            old, key = self.key(rec["DST"]), self.key(rec["SRC"])
            self.names[rec["DST"]] = key
            self.release(old)
            self.ref(key)
        elif ins == "RELEASE":
            key = self.names.get(rec["NAME"])
            if key is not None:   # simrd ignores releases of undefined names too
                if self.refs[key] <= 0:
                    raise self.fail(f"RELEASE of {rec['NAME']!r}, which has no reference")
                self.release(key)
        elif ins == "MUTATE":
            self.mutate(rec)
        elif ins == "ANNOTATE":
            if rec.get("ANNOTATION") == "BACKWARD" and self.backward_from is None:
                self.backward = True
                self.backward_from = len(self.ops)
        else:
            raise self.fail(f"unknown INSTRUCTION {ins!r}")


def _records(lines: Iterable[str], parser: _Parser):
    """``(line number, record)`` of every non-empty line."""
    for text in lines:
        parser.lineno += 1
        text = text.strip()
        if not text:
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise parser.fail(f"invalid JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise parser.fail("a record must be a JSON object")
        yield parser.lineno, rec


def parse(lines: Iterable[str], label: str = "<log>") -> Log:
    """Parse a log's lines (from its START annotation when it has one)."""
    p = _Parser(label)
    recs = list(_records(lines, p))
    start = next((k for k, (_, r) in enumerate(recs) if r.get("INSTRUCTION") == "ANNOTATE"
                  and r.get("ANNOTATION") == "START"), None)
    it = iter(recs[start + 1:] if start is not None else recs)
    try:
        for line, rec in it:
            p.lineno = line
            p.record(rec, it)
    except KeyError as exc:
        raise p.fail(f"record is missing field {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise p.fail(f"bad value: {exc}") from None
    if len(p.ops) == 1:
        raise SnsimError(f"{label}: the log has no CALL or MUTATE records")
    held = sorted(key for key, n in p.refs.items() if n > 0 and key[0] != "c")
    return Log(p.ops, p.constant_bytes, held, p.peak, p.backward_from, p.lineno)


def read_text(path: str | Path) -> list[tuple[str, list[str]]]:
    """``(label, lines)`` of every log in ``path``: a ``.log`` file, a folder of
    them, or a zip holding them."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.log"))
        if not files:
            raise SnsimError(f"{path}: folder holds no .log files")
        return [(str(f), f.read_text(encoding="utf-8").splitlines()) for f in files]
    if not path.exists():
        raise SnsimError(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        out = []
        with zipfile.ZipFile(path) as zf:
            for name in sorted(zf.namelist()):
                if name.endswith(".log"):
                    with zf.open(name) as f:
                        text = io.TextIOWrapper(f, encoding="utf-8").read()
                    out.append((f"{path}:{name}", text.splitlines()))
        if not out:
            raise SnsimError(f"{path}: zip holds no .log files")
        return out
    try:
        return [(str(path), path.read_text(encoding="utf-8").splitlines())]
    except (OSError, UnicodeDecodeError) as exc:
        raise SnsimError(f"{path}: cannot read: {exc}") from None


def model_name(label: str) -> str:
    """'resnet32-56' from '.../resnet32-56-9000000000.0-2020-...-default.log'."""
    stem = Path(label.split(":")[-1]).name
    parts = stem.split("-")
    return "-".join(parts[:2]) if len(parts) >= 2 else stem


def to_document(log: Log, label: str, free_at: str = "release") -> dict:
    """The ``snsim.trace/1`` document of a parsed log (module docstring)."""
    if free_at not in ("release", "last_use"):
        raise SnsimError(f"--free-at must be 'release' or 'last_use', not {free_at!r}")
    end = len(log.ops)
    held = set(log.held)
    layers = []
    for lid, op in enumerate(log.ops):
        raw = {"id": lid, "name": op.name if lid == 0 else f"{op.name}/{lid}",
               "kind": "data" if lid == 0 else kind_of(op.name),
               "inputs": op.inputs, "output_bytes": sum(op.sizes), "param_bytes": 0,
               "fwd_ms": op.time_ns / 1e6, "bwd_ms": 0.0, "bwd_reads": []}
        if len(op.sizes) > 1:
            raw["output_sizes"] = op.sizes
        if any(k for _, k in op.reads):
            raw["input_results"] = [list(r) for r in op.reads]
        if op.alias_of:
            raw["alias_of"] = [list(r) for r in op.alias_of]
        rel = [end if (lid, k) in held or r is None else r for k, r in enumerate(op.released)]
        if len(rel) > 1:
            raw["output_released_after"] = rel
        elif rel and rel[0] != end:
            raw["released_after"] = rel[0]
        layers.append(raw)
    last = {"id": end, "name": "end", "kind": "loss", "inputs": [0], "output_bytes": 0,
            "param_bytes": 0, "fwd_ms": 0.0, "bwd_ms": 0.0, "bwd_reads": []}
    if log.held:   # what the program holds at the end must be there at the end
        last["inputs"] = list(dict.fromkeys(j for j, _ in log.held))
        if any(k for _, k in log.held):
            last["input_results"] = [list(r) for r in log.held]
    layers.append(last)
    model = model_name(label)
    compute_ns = sum(op.time_ns for op in log.ops)
    return {
        "schema": "snsim.trace/1", "model": model, "batch": 1, "dtype": "unknown",
        "source": {"kind": "measured", "device": "cuda",
                   "op_log": {"format": FORMAT, "file": label, "records": log.lines,
                              "ops": len(log.ops) - 1, "compute_ns": compute_ns,
                              "backward_from_layer": log.backward_from},
                   "forward_only": True,
                   "baseline_peak_bytes": log.baseline_peak_bytes},
        "constant_bytes": log.constant_bytes,
        "free_at": free_at,
        "layers": layers,
    }

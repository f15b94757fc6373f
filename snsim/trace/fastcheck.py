"""A fast yes/no check of a document against the published JSON Schema.

The schema (``trace.schema.json``) stays the contract: this module reads it
and compiles it into column-wise checks, one per schema node.  A node is
checked once for *all* the values it applies to (the ``fwd_ms`` of every
layer in one pass, ``type(v)`` collected into a set, bounds with one
generator), instead of once per value as a general validator walks the
document.  On ResNet-2500 (8,336 layers) this takes about 15 ms against
jsonschema's 1.3-1.7 s.

The answer is only valid / not valid.  The loader calls jsonschema itself
when the answer is "not valid", so every error message is jsonschema's own,
unchanged.  The one property that matters is therefore: *valid here implies
valid for jsonschema* (a false "not valid" only costs time).  The check is
conservative where it must guess: an unhashable enum candidate, a number
type other than ``int``/``float``, or a schema keyword it does not know
(:class:`Unsupported`, raised when compiling) all mean "ask jsonschema".
``tests/test_trace_fastcheck.py`` checks that both agree on every bad-trace
case and on random valid and mutated documents.
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import ge, itemgetter
from typing import Any, Callable

# Keywords that never constrain a value.
_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$defs", "$comment",
                          "default", "examples"})

Check = Callable[[list], bool]   # all values satisfy the node


class Unsupported(Exception):
    """The schema uses a keyword this checker does not compile."""


def _is_number_type(tp: type) -> bool:
    return tp is int or tp is float


def _type_check(name: str) -> Check:
    if name == "object":
        return lambda vals: all(issubclass(tp, dict) for tp in set(map(type, vals)))
    if name == "array":
        return lambda vals: all(issubclass(tp, list) for tp in set(map(type, vals)))
    if name == "string":
        return lambda vals: all(issubclass(tp, str) for tp in set(map(type, vals)))
    if name == "number":
        return lambda vals: all(_is_number_type(tp) for tp in set(map(type, vals)))
    if name == "integer":
        def integer(vals: list) -> bool:
            types = set(map(type, vals))
            if not all(_is_number_type(tp) for tp in types):
                return False
            # jsonschema counts a float with an integral value (1.0) as an integer
            return float not in types or all(v.is_integer() for v in vals if type(v) is float)
        return integer
    if name == "boolean":
        return lambda vals: all(tp is bool for tp in set(map(type, vals)))
    if name == "null":
        return lambda vals: all(v is None for v in vals)
    raise Unsupported(f"type {name!r}")


def _numbers(vals: list) -> list:
    return [v for v in vals if type(v) is int or type(v) is float]


class _Compiler:
    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.refs: dict[str, Check] = {}

    def resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise Unsupported(f"$ref {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def compile(self, node: dict[str, Any]) -> Check:
        if not isinstance(node, dict):
            raise Unsupported("boolean schema")
        checks: list[Check] = []
        typed = node.get("type")
        if isinstance(typed, list):
            raise Unsupported("a list of types")
        # ``required`` before ``properties``, which relies on it
        for key, arg in sorted(node.items(), key=lambda kv: kv[0] != "required"):
            if key in _ANNOTATIONS or key == "type":
                continue
            checks.append(self.keyword(key, arg, node, typed))
        if typed is not None:
            # the type first: the keyword checks below rely on it
            checks.insert(0, _type_check(typed))

        def check(vals: list) -> bool:
            if not vals:
                return True
            for c in checks:
                if not c(vals):
                    return False
            return True
        return check

    def keyword(self, key: str, arg: Any, node: dict, typed: str | None) -> Check:
        numeric = typed in ("number", "integer")
        if key == "$ref":
            target = self.resolve(arg)
            if arg not in self.refs:
                self.refs[arg] = lambda vals: False   # placeholder for recursive refs
                self.refs[arg] = self.compile(target)
            return lambda vals: self.refs[arg](vals)
        if key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if not _is_number_type(type(arg)):
                raise Unsupported(f"{key} {arg!r}")
            pick = (lambda vals: vals) if numeric else _numbers
            low = key in ("minimum", "exclusiveMinimum")
            strict = key.startswith("exclusive")

            def bound(vals: list) -> bool:
                nums = pick(vals)
                if not nums:
                    return True
                m = min(nums) if low else max(nums)
                if m != m:   # a NaN can hide the extreme; compare each (NaN passes, as in jsonschema)
                    bad = [v for v in nums if (v < arg if low else v > arg)
                           or (strict and v == arg)]
                    return not bad
                if low:
                    return m > arg if strict else m >= arg
                return m < arg if strict else m <= arg
            return bound
        if key in ("enum", "const"):
            allowed = arg if key == "enum" else [arg]
            if not all(type(a) is str for a in allowed):
                raise Unsupported(f"{key} with a value that is not a string")
            options = frozenset(allowed)

            def member(vals: list) -> bool:
                try:
                    return set(vals) <= options
                except TypeError:   # an unhashable value is no string
                    return False
            return member
        if key == "minLength":
            if typed != "string":
                raise Unsupported("minLength without type string")
            return lambda vals: min(map(len, vals)) >= arg
        if key in ("items", "minItems", "uniqueItems"):
            if typed != "array":
                raise Unsupported(f"{key} without type array")
            if key == "minItems":
                return lambda vals: min(map(len, vals)) >= arg
            if key == "uniqueItems":
                if not arg:
                    return lambda vals: True

                def unique(vals: list) -> bool:
                    try:
                        return list(map(len, map(set, vals))) == list(map(len, vals))
                    except TypeError:
                        return False   # unhashable items: let jsonschema compare them
                return unique
            if not isinstance(arg, dict):
                raise Unsupported("items as a list")
            inner = self.compile(arg)
            return lambda vals: inner(list(chain.from_iterable(vals)))
        if key in ("required", "properties"):
            if typed != "object":
                raise Unsupported(f"{key} without type object")
            if key == "required":
                need = frozenset(arg)
                # each value's keys >= need, compared in C
                return lambda vals: all(map(ge, map(dict.keys, vals), repeat(need)))
            # a required property is present in every value (``required`` runs first);
            # their columns are taken in one pass over the values (a deep trace's
            # layers are ~10^4 dicts: one pass per property costs more than the
            # checks), an optional property's only where some value has it
            known = frozenset(node.get("required", ()))
            props = [(name, name in known, self.compile(sub)) for name, sub in arg.items()]
            required = [name for name, always, _ in props if always]
            optional = [name for name, always, _ in props if not always]
            rows = itemgetter(*required) if len(required) > 1 else None

            def properties(vals: list) -> bool:
                cols: dict[str, Any] = {}
                if rows is not None:
                    cols = dict(zip(required, zip(*map(rows, vals))))
                if optional:
                    have = set().union(*vals)
                    for name in optional:
                        cols[name] = [v[name] for v in vals if name in v] \
                            if name in have else []
                for name, always, sub in props:
                    col = cols[name] if name in cols else [v[name] for v in vals]
                    if not sub(col):
                        return False
                return True
            return properties
        raise Unsupported(f"keyword {key!r}")


def compile_schema(schema: dict[str, Any]) -> Callable[[Any], bool]:
    """A function ``doc -> bool``: True only if ``doc`` is valid under ``schema``.

    Raises :class:`Unsupported` when the schema uses a keyword outside the
    compiled subset (the caller then validates with jsonschema alone).
    """
    check = _Compiler(schema).compile(schema)
    return lambda doc: check([doc])

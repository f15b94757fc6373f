"""Modeled traces at any batch from two profiled ones, without torch per probe.

In a modeled trace every byte count and FLOP count (of the layers and of each
kernel) is an affine function of the batch: activations grow with it, weights,
per-channel statistics and the loss's scalars do not.  So two modeled profiles
(at batches ``a`` and ``b``) give every other batch exactly: each integer field
is extrapolated along the line through its two values (it must land on an
integer, else the field is not affine and the trace is refused), strings and
structure must agree, and times are re-priced from the extrapolated kernels by
:func:`snsim.devices.step_ms`, as the profiler prices them.
``tests/test_search.py`` checks the result against direct profiles.

ResNets of the zoo need no profile at all (:mod:`snsim.search.resnet`).
"""

from __future__ import annotations

from typing import Any

from snsim import devices
from snsim.errors import SnsimError

_TIME_KEYS = ("fwd_ms", "bwd_ms")


def _line(va: int, vb: int, a: int, b: int, batch: int, where: str) -> int:
    num = va * (b - batch) + vb * (batch - a)
    q, r = divmod(num, b - a)
    if r:
        raise SnsimError(f"{where} is not affine in the batch ({va} at {a}, {vb} at {b})")
    return q


def _extrapolate(x: Any, y: Any, a: int, b: int, batch: int, where: str) -> Any:
    if isinstance(x, bool) or isinstance(x, str) or x is None:
        if x != y:
            raise SnsimError(f"{where} differs between batch {a} and {b}: {x!r}, {y!r}")
        return x
    if isinstance(x, int) and isinstance(y, int):
        return _line(x, y, a, b, batch, where)
    if isinstance(x, float):
        return x  # a time: re-priced from the kernels below
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [_extrapolate(u, v, a, b, batch, f"{where}[{i}]")
                for i, (u, v) in enumerate(zip(x, y))]
    if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
        return {k: _extrapolate(x[k], y[k], a, b, batch, f"{where}.{k}") for k in x}
    raise SnsimError(f"{where} differs in structure between batch {a} and {b}")


def at_batch(doc_a: dict[str, Any], doc_b: dict[str, Any], batch: int) -> dict[str, Any]:
    """The modeled trace document of ``doc_a``'s model at ``batch``."""
    a, b = doc_a["batch"], doc_b["batch"]
    if a == b:
        raise SnsimError("two profiles at different batches are needed")
    key = doc_a.get("source", {}).get("device_model")
    if doc_a.get("source", {}).get("kind") != "modeled" or key is None:
        raise SnsimError(f"{doc_a.get('model')}: only modeled traces extrapolate in the batch")
    preset = devices.get(key)
    layers = []
    for la, lb in zip(doc_a["layers"], doc_b["layers"], strict=True):
        d = _extrapolate(la, lb, a, b, batch, f"layer {la['id']}")
        if "fwd_kernels" in d:
            fwd = round(devices.step_ms(d["fwd_kernels"], preset), 6)
            bwd = round(devices.step_ms(d["bwd_kernels"], preset), 6)
            d["fwd_ms"], d["bwd_ms"] = fwd, bwd
            for w in d.get("workspace", ()):
                if w["algo"] != "modeled-default":
                    raise SnsimError(f"layer {la['id']}: workspace {w['algo']!r} has its own "
                                     "times; only modeled-default entries extrapolate")
                w["fwd_ms"], w["bwd_ms"] = fwd, bwd
        layers.append(d)
    out = {k: v for k, v in doc_a.items() if k != "layers"}
    out["batch"] = batch
    out["source"] = {**doc_a["source"], "extrapolated_from_batches": [a, b]}
    out["layers"] = layers
    return out

"""Sizes and durations: parse once at the edge, keep ``_bytes``/``_ms`` inside."""

from __future__ import annotations

import argparse
import math
import re
from decimal import ROUND_HALF_EVEN, Decimal

from snsim.errors import SnsimError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# The largest budget accepted: 2^62 bytes (4 EiB), far above any device,
# small enough for every float and int64 it meets.
MAX_BUDGET_BYTES = 2**62
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse ``12GiB``, ``12GB``, ``512MiB``, ``1.5G`` or plain bytes into bytes.

    Binary suffixes (KiB, MiB, GiB, and the bare K/M/G) are powers of 1024;
    decimal ones (KB, MB, GB) powers of 1000.  Raises :class:`SnsimError`
    with the offending text on anything else.
    """
    if isinstance(text, int):
        if text < 0:
            raise SnsimError(f"size must not be negative, got {text}")
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise SnsimError(
            f"cannot read size {text!r}: use plain bytes or a number with "
            "B, KB, MB, GB, KiB, MiB, GiB (e.g. 12GiB, 512MiB)")
    # Decimal keeps large sizes exact (a float would round 4611686019GB)
    value = Decimal(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def fmt_bytes(n: float | None) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.3f} s"
    return f"{ms:.3f} ms"


def parse_budget(text: str | None, lower_bound_bytes: int,
                 baseline_bytes: int | None = None) -> int | None:
    """A memory budget: a size (see :func:`parse_size`), ``1.05xlb``, a multiple
    of the trace's lower bound, or ``0.5xbaseline``, a multiple of the peak of
    the program run without a budget that an imported op log records
    (``source.baseline_peak_bytes``, ``baseline_bytes`` here; the DTR authors'
    budget ratios).  ``None`` stays ``None`` (the device's memory).

    A budget under the lower bound is refused: no policy can go below it.
    """
    if text is None:
        return None
    t = str(text).strip().lower()
    bases = {"xbaseline": baseline_bytes, "xlb": lower_bound_bytes}
    suffix = next((x for x in bases if t.endswith(x)), None)
    if suffix is not None:
        base = bases[suffix]
        try:
            factor = float(t[:-len(suffix)])
        except ValueError:
            raise SnsimError(f"cannot read budget {text!r}: use e.g. 1.05{suffix}") from None
        if not math.isfinite(factor) or factor <= 0:
            raise SnsimError(f"budget {text!r} must be a positive finite multiple")
        if base is None:
            raise SnsimError(f"budget {text!r}: this trace records no baseline peak "
                             "(source.baseline_peak_bytes, written by 'snsim import "
                             "dtr-log'); use a size or a multiple of the lower bound (xlb)")
        scaled = factor * base
        value = int(scaled) if math.isfinite(scaled) else MAX_BUDGET_BYTES + 1
    else:
        value = parse_size(text)
    if value > MAX_BUDGET_BYTES:  # 1e400 would overflow float arithmetic after the run
        raise SnsimError(f"budget {text!r} is larger than any memory "
                         "(at most 2^62 bytes, 4 EiB)")
    if value < lower_bound_bytes:
        raise SnsimError(
            f"impossible budget {text!r} ({value} bytes): below this trace's lower bound of "
            f"{lower_bound_bytes} bytes ({fmt_bytes(lower_bound_bytes)}), "
            "which no policy can go under")
    return value


def positive_seconds(text: str) -> float:
    """An option's duration in seconds (argparse ``type``): a positive finite number."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {text!r}")
    return value

"""Checks of a command's input made before any work starts.

Each raises :class:`~snsim.errors.SnsimError` with one line naming what is
wrong and where: output paths that would overwrite an input or each other,
plot formats, and traces that load but break the contract (the last layer is
the loss) or would crash the reader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from snsim.errors import SnsimError, TraceError

PLOT_FORMATS = ("png", "svg", "pdf")


def _same(a: str, b: str) -> bool:
    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists():
        try:
            return os.path.samefile(pa, pb)
        except OSError:
            pass
    return os.path.realpath(pa) == os.path.realpath(pb)


def check_outputs(inputs: Iterable[tuple[str, str | None]],
                  outputs: Iterable[tuple[str, str | None]]) -> None:
    """Refuse an output path that is one of the inputs or another output.

    ``inputs`` and ``outputs`` are ``(option, path)`` pairs; None paths are
    skipped.  Compared by real path (and by inode when both exist), so
    ``./t.json`` and a symlink to ``t.json`` are the same file.
    """
    ins = [(k, p) for k, p in inputs if p]
    outs = [(k, p) for k, p in outputs if p]
    for n, (key, path) in enumerate(outs):
        for ikey, ipath in ins:
            if _same(path, ipath):
                raise SnsimError(f"{key} {path} is the input {ikey}: writing it would destroy "
                                 "the input; choose another file")
        for okey, opath in outs[:n]:
            if _same(path, opath):
                raise SnsimError(f"{key} and {okey} are the same file {path}: one would "
                                 "overwrite the other")


def plot_format(path: str, option: str = "--timeline") -> str:
    """The format a plot is written in, from ``path``'s extension (png, svg, pdf)."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        raise SnsimError(f"{option} {path}: cannot tell the format from "
                         f"{'no extension' if not ext else repr('.' + ext)}; "
                         f"use .{', .'.join(PLOT_FORMATS)}")
    return ext


def load_trace(path: str):
    """:func:`snsim.trace.load` that also refuses a document nested too deeply
    for the JSON reader and a trace whose last layer is not the loss
    (unless its source says it is forward-only)."""
    from snsim.trace import load

    try:
        trace = load(path)
    except RecursionError:
        raise TraceError(f"{path}: invalid JSON: nested too deeply to be a trace") from None
    check_ends_in_loss(trace)
    return trace


def check_ends_in_loss(trace) -> None:
    """The last layer is the loss (DESIGN section 1), except in forward-only traces."""
    last = trace.layers[-1]
    if last.kind != "loss" and not trace.source.get("forward_only"):
        raise TraceError(f"{trace.label}: layer {last.id} ({last.name}), field kind: the last "
                         f"layer must be the loss, got {last.kind!r}")

"""Real peak memory and step time of a callable.

CPU: the torch profiler's allocation events (``profile_memory=True``) carry a
running total.  That total is not reset between windows (it keeps what
earlier windows left allocated) and misses frees of blocks allocated before
any window, so each window opens with a marker allocation whose event gives
the total at that moment; the peak is the largest total after it, minus
that baseline, plus the memory that existed when the window opened (passed
in, since the CPU allocator keeps no global count).  CUDA: ``max_memory_allocated`` after
``reset_peak_memory_stats``, less what was allocated when the window opened,
plus the memory the caller says existed then (as on the CPU: another case's
leftovers are not counted); ``max_memory_reserved`` (absolute) beside it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class PeakMemory:
    peak_bytes: int          # allocated: what the simulator predicts
    reserved_bytes: int | None = None   # CUDA caching allocator's reserve
    window_bytes: int = 0    # growth seen inside the window


def _descendants(roots):
    stack = list(roots)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.children)


def _alloc_events(roots) -> list[tuple[int, int, int]]:
    """(time, running total, size) of every allocation event under ``roots``, in order."""
    return sorted((e.start_time_ns, e.extra_fields.total_allocated, e.extra_fields.alloc_size)
                  for e in _descendants(roots) if hasattr(e.extra_fields, "alloc_size"))


def _tree(prof):
    return prof.profiler.kineto_results.experimental_event_tree()


def measure_peak(fn: Callable[[], None], device: torch.device, existing_bytes: int,
                 release: Callable[[], None] | None = None) -> PeakMemory:
    """Run ``fn`` once and return its peak memory (see module docstring).

    ``release`` runs inside the window before the marker: whatever it frees
    (last step's gradient buffers, say) is gone before the baseline, so ``fn``
    may allocate it afresh and have it counted.
    """
    if device.type == "cuda":
        # as on the CPU: the growth over what was allocated when the window opened,
        # plus what the caller says existed then (an earlier case's leftovers, the
        # profiler's or a reference model's tensors, are not this step's)
        gc.collect()
        if release is not None:
            release()
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        grown = max(torch.cuda.max_memory_allocated(device) - base, 0)
        return PeakMemory(existing_bytes + grown, torch.cuda.max_memory_reserved(device),
                          grown)
    from torch.profiler import ProfilerActivity, profile

    # Garbage from earlier work (a previous case's executor, its tensors in
    # reference cycles) is collected now, not by a GC pass inside the window:
    # such a free lowers the running total below the window's baseline, and
    # the peak read low (a suite's resnet18 under superneurons: -4.7% after
    # the case before it, +0.017% alone).
    gc.collect()
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                 profile_memory=True) as prof:
        if release is not None:
            release()
        mark_window()
        fn()
    base = baseline(prof)
    grown = max(max((total for _, total, _ in _alloc_events(_tree(prof))), default=base)
                - base, 0)
    return PeakMemory(existing_bytes + grown, None, grown)


_MARK = "snsim#base"


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 around a profiler window.

    The CPU profiler's C++ side prints start/stop lines and a warning per
    free of memory allocated before the window; they are not for users.
    Python exceptions still propagate (and are reported after this exits).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def mark_window() -> None:
    """Allocate and free a marker inside a profiler window (see :func:`baseline`)."""
    with torch.profiler.record_function(_MARK):
        marker = torch.empty(64, dtype=torch.uint8)
        del marker


def baseline(prof) -> int:
    """The profiler's running total when :func:`mark_window` ran."""
    for ev in _descendants(_tree(prof)):
        if ev.name == _MARK:
            _, total, size = _alloc_events([ev])[0]
            return total - size
    raise RuntimeError("profiler window has no snsim marker")


def time_ms(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int
            ) -> tuple[float, list[float]]:
    """Median wall time of ``fn`` in ms (CUDA events on a GPU), and all samples."""
    from snsim.torchgraph.clock import Clock

    samples = Clock(device).time_ms(fn, warmup, repeats)
    return statistics.median(samples), samples


def step_levels(ex, batch, **step) -> dict[int, tuple[int, int]]:
    """(peak, end) of each op of one fresh step of executor ``ex`` on CPU,
    relative to the memory before its state was made (op -1: making it), from
    the profiler's allocation events (:func:`per_op_levels`); ``step``: more
    arguments of ``ex.step``.  ``ex`` has run a step before (its buffers exist)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                 profile_memory=True) as prof:
        ex.release()
        mark_window()
        with torch.profiler.record_function("snsim#-1"):   # the level ops start from
            ex.prepare(fresh=True)
        ex.step(batch, annotate=True, **step)
    return per_op_levels(prof)


def per_op_levels(prof) -> dict[int, tuple[int, int]]:
    """(peak, end) inside each ``snsim#k`` range of an annotated run, relative
    to the window's baseline (:func:`mark_window` must have run in it)."""
    base = baseline(prof)
    levels: dict[int, tuple[int, int]] = {}
    stack = list(_tree(prof))
    while stack:
        ev = stack.pop()
        if ev.name.startswith("snsim#") and ev.name != _MARK:
            allocs = _alloc_events([ev])
            if allocs:
                levels[int(ev.name[6:])] = (max(t for _, t, _ in allocs) - base,
                                            allocs[-1][1] - base)
            continue
        stack.extend(ev.children)
    return levels

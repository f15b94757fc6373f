"""Timing on the device the work runs on, and the spread of a sample.

CPU: ``time.perf_counter_ns`` around each call (the caller sets the thread
count); CUDA: a pair of CUDA events around each call, synchronized before
reading.  Shared by the profiler (layer and step times) and the executor's
measurements.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of a sample (all equal for one value)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return statistics.median(xs), q[0], q[-1]


class Clock:
    """Times a callable in milliseconds on the device the work runs on."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def once(self, fn: Callable[..., Any], *args, **kwargs) -> tuple[float, Any]:
        """(milliseconds, result) of one call; CUDA: events, synchronized."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn(*args, **kwargs)
            end.record()
            end.synchronize()
            return start.elapsed_time(end), result
        t0 = time.perf_counter_ns()
        result = fn(*args, **kwargs)
        return (time.perf_counter_ns() - t0) / 1e6, result

    def time_ms(self, fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        if self.cuda:
            torch.cuda.synchronize()
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end))
        else:
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                fn()
                out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

"""Capacity searches: the deepest ResNet, the largest batch, that a policy fits.

A search probes an integer size ``x`` (the ResNet family's third-stage blocks,
or the batch) by doubling from 1 until the policy fails, then bisects between
the last success and the first failure, so the answer is the largest size that
fits (the policy is assumed monotone in the size: a larger network never fits
where a smaller one does not).  A probe whose lower bound exceeds the budget
fails without planning (no schedule can fit it).  Every probe is one
:func:`snsim.evaluate.evaluate` point; the result carries the last feasible
evaluation and the first failing size with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from snsim.evaluate import Evaluation, evaluate
from snsim.graph import Graph

# No search goes past this size (2^20 blocks or samples): far beyond 12 GB.
MAX_SIZE = 1 << 20


@dataclass(frozen=True)
class Probe:
    size: int
    feasible: bool
    reason: str | None
    evaluation: Evaluation | None  # None when the lower bound alone decided


@dataclass(frozen=True)
class SearchResult:
    policy: str
    what: str                     # "depth" or "batch"
    best: int | None              # the largest size that fits (None: not even the first)
    best_probe: Probe | None
    first_failing: int | None
    first_failing_reason: str | None
    probes: tuple[Probe, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object of ``snsim search`` (contract section 5)."""
        r = self.best_probe.evaluation.result if self.best_probe and \
            self.best_probe.evaluation else None
        return {"policy": self.policy, self.what: self.best,
                "peak_bytes": r.peak_bytes if r else None,
                "iteration_ms": r.iteration_ms if r else None,
                "samples_per_s": r.samples_per_s if r else None,
                "lower_bound_bytes": r.lower_bound_bytes if r else None,
                "capacity_bytes": r.capacity_bytes if r else None,
                "first_failing": {self.what: self.first_failing,
                                  "reason": self.first_failing_reason},
                "probes": len(self.probes)}


def probe(graph: Graph, policy: str, budget_bytes: int | None, size: int) -> Probe:
    """Evaluate one size; decided by the lower bound alone when that exceeds the budget."""
    reason = _over_bound(graph, budget_bytes)
    if reason is not None:
        return Probe(size, False, reason, None)
    e = evaluate(graph, policy, budget_bytes)
    return Probe(size, e.feasible, e.result.reason, e)


def search(policy: str, what: str, graph_of: Callable[[int], Graph],
           budget_bytes: int | None, label: Callable[[int], int] = int,
           on_probe: Callable[[Probe], None] | None = None, start: int = 1) -> SearchResult:
    """Largest ``x >= start`` whose ``graph_of(x)`` the policy fits; ``label`` maps a
    size to what is reported (third-stage blocks to depth)."""
    probes: list[Probe] = []

    def run(x: int) -> Probe:
        p = probe(graph_of(x), policy, budget_bytes, x)
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p

    good: Probe | None = None
    bad = run(start)
    if bad.feasible:
        # No schedule goes below the lower bound: bracket by it first (a graph per
        # probe, no planning), then try the policy at the largest size it allows;
        # the policies that reach the bound finish there.
        good = bad
        top = _largest_within_bound(graph_of, budget_bytes, start)
        if top >= MAX_SIZE:
            raise ValueError(f"{policy} fits {what} {label(top)}: the search stops at "
                             f"{MAX_SIZE} (is the budget meant to be this large?)")
        at_top = run(top) if top > start else None
        if at_top is None or at_top.feasible:
            good = at_top or good
            bad = Probe(top + 1, False, _over_bound(graph_of(top + 1), budget_bytes), None)
            probes.append(bad)
        else:
            bad, x = at_top, start
            while 2 * x < top:  # doubling below the bound's bracket
                p = run(2 * x)
                if not p.feasible:
                    bad = p
                    break
                good, x = p, 2 * x
    while good is not None and bad.size - good.size > 1:
        mid = run((good.size + bad.size) // 2)
        if mid.feasible:
            good = mid
        else:
            bad = mid
    return SearchResult(policy, what, label(good.size) if good else None, good,
                        label(bad.size), bad.reason, tuple(probes))


def _cap(graph: Graph, budget_bytes: int | None) -> int:
    return budget_bytes if budget_bytes is not None else graph.trace.device.memory_bytes


def _over_bound(graph: Graph, budget_bytes: int | None) -> str | None:
    cap = _cap(graph, budget_bytes)
    if graph.lower_bound_bytes > cap:
        return (f"lower bound {graph.lower_bound_bytes} bytes exceeds the budget {cap} "
                "bytes")
    return None


def _largest_within_bound(graph_of, budget_bytes, start: int) -> int:
    """Largest size >= ``start`` whose lower bound fits the budget.

    The lower bound of these families is close to affine in the size (static
    memory grows with it, the largest step is fixed), so the probes are placed
    by linear interpolation on the bound, every other step a bisection (which
    keeps the worst case logarithmic)."""
    def lb(x: int) -> int:
        return graph_of(x).lower_bound_bytes

    g = graph_of(start)
    cap = _cap(g, budget_bytes)
    lo, lb_lo = start, g.lower_bound_bytes
    x = 2 * start
    while True:  # extrapolate upwards until the bound is exceeded
        lb_x = lb(x)
        if lb_x > cap:
            hi, lb_hi = x, lb_x
            break
        slope = (lb_x - lb_lo) / (x - lo)
        guess = x + int((cap - lb_x) / slope) + 1 if slope > 0 else 2 * x
        lo, lb_lo, x = x, lb_x, min(max(guess, x + 1), MAX_SIZE)
        if lo >= MAX_SIZE:
            return MAX_SIZE
    step = 0
    while hi - lo > 1:
        if step % 2 == 0 and lb_hi > lb_lo:
            mid = lo + int((cap - lb_lo) * (hi - lo) / (lb_hi - lb_lo))
            mid = min(max(mid, lo + 1), hi - 1)
        else:
            mid = (lo + hi) // 2
        lb_mid = lb(mid)
        if lb_mid <= cap:
            lo, lb_lo = mid, lb_mid
        else:
            hi, lb_hi = mid, lb_mid
        step += 1
    return lo

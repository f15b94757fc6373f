"""Capacity searches: the deepest ResNet, the largest batch, that a policy fits.

A search probes an integer size ``x`` (the ResNet family's third-stage blocks,
or the batch) by doubling from 1 until the policy fails, then bisects between
the last success and the first failure, so the answer is the largest size that
fits (the policy is assumed monotone in the size: a larger network never fits
where a smaller one does not).  A probe whose lower bound exceeds the budget
fails without planning (no schedule can fit it); when the doubling ends so,
the size where the bound crosses the budget is found from graphs alone and
the policy tried there first, so a policy that reaches the bound needs no
bisection.  Every probe is one
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
    x = start
    while bad.feasible:  # doubling: small sizes first, each cheap
        good = bad
        if x >= MAX_SIZE:
            raise ValueError(f"{policy} fits {what} {label(x)}: the search stops at "
                             f"{MAX_SIZE} (is the budget meant to be this large?)")
        x = min(2 * x, MAX_SIZE)
        bad = run(x)
    if good is not None and bad.evaluation is None:
        # It failed on the lower bound alone, which no schedule goes below: find where
        # the bound crosses the budget (graphs only, no planning) and try the policy
        # there; the policies that reach the bound stop at once.
        top = _largest_within_bound(graph_of, budget_bytes, good.size, bad.size)
        if top > good.size:
            at_top = run(top)
            if at_top.feasible:
                good = at_top
                bad = Probe(top + 1, False, _over_bound(graph_of(top + 1), budget_bytes),
                            None)
            else:
                bad = at_top
        else:
            bad = Probe(top + 1, False, _over_bound(graph_of(top + 1), budget_bytes), None)
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


def _largest_within_bound(graph_of, budget_bytes, lo: int, hi: int) -> int:
    """Largest size in [lo, hi) whose lower bound fits (``lo`` fits, ``hi`` does not).

    The lower bound of these families is close to affine in the size (static
    memory grows with it, the largest step is fixed), so the probes are placed
    by linear interpolation on the bound, every other step a bisection (which
    keeps the worst case logarithmic)."""
    g = graph_of(lo)
    cap = _cap(g, budget_bytes)
    lb_lo, lb_hi = g.lower_bound_bytes, graph_of(hi).lower_bound_bytes
    step = 0
    while hi - lo > 1:
        if step % 2 == 0 and lb_hi > lb_lo:
            mid = lo + int((cap - lb_lo) * (hi - lo) / (lb_hi - lb_lo))
            mid = min(max(mid, lo + 1), hi - 1)
        else:
            mid = (lo + hi) // 2
        lb_mid = graph_of(mid).lower_bound_bytes
        if lb_mid <= cap:
            lo, lb_lo = mid, lb_mid
        else:
            hi, lb_hi = mid, lb_mid
        step += 1
    return lo

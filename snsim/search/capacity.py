"""Capacity searches: the deepest ResNet, the largest batch, that a policy fits.

A search finds the largest integer size ``x`` (the ResNet family's third-stage
blocks, or the batch) whose probe trace the policy fits in the budget, assuming
the policy is monotone in the size (a larger network never fits where a
smaller one does not).  It keeps a bracket: the largest size known to fit and
the smallest known to fail, and ends when they are adjacent, so the answer is
the true largest size, not the largest tried.  What it probes:

1. **The bound.** No schedule goes below the lower bound, so first the size
   ``top`` where the lower bound crosses the budget is found from graphs alone
   (no planning): the bound of these families is affine in the size (static
   memory grows by a fixed amount per block or sample, the largest step is
   fixed), so ``top`` is extrapolated from two small sizes and then checked at
   ``top`` and ``top + 1``; when the check fails, doubling and interpolation on
   the bound find it.  ``top + 1`` is the first failing size unless the policy
   fails earlier.
2. **The policy's peak.** The first probes double from ``start``; from then on
   the next size is where the line through the two largest fitting probes'
   peaks meets the budget (liveness-like policies' peaks are affine in the
   size, so this lands on the answer and its successor), clipped into the
   bracket.  A prediction that proves wrong twice (policies that adapt their
   peak to the budget: their peak sits at the budget whatever the size) turns
   the prediction off; then ``top`` is tried once (policies that reach the bound
   stop there) and the rest is bisection, so the worst case stays logarithmic.

Each probe is one :func:`snsim.evaluate.evaluate` point.  With a
:class:`~snsim.search.cache.ProbeCache`, probes and bounds already on disk are
read, not planned, and new ones are written as they finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from snsim.errors import SnsimError
from snsim.evaluate import evaluate
from snsim.graph import Graph
from snsim.search.cache import ProbeCache
from snsim.search.models import Family

# No search goes past this size (2^20 blocks or samples): far beyond 12 GB.
MAX_SIZE = 1 << 20
MISSES = 2  # wrong predictions before the search stops predicting


@dataclass(frozen=True)
class Probe:
    size: int
    feasible: bool
    reason: str | None
    row: dict[str, Any] | None  # Evaluation.row(); None when the lower bound decided
    cached: bool = False        # read from the probe cache, not planned

    @property
    def peak_bytes(self) -> int | None:
        return self.row["peak_bytes"] if self.row else None


@dataclass(frozen=True)
class SearchResult:
    policy: str
    what: str                     # "depth" or "batch"
    best: int | None              # the largest size that fits (None: not even the first)
    best_probe: Probe | None
    first_failing: int | None
    first_failing_reason: str | None
    probes: tuple[Probe, ...]     # the policy's probes in order (planned or cached)

    @property
    def planned(self) -> int:
        return sum(1 for p in self.probes if not p.cached)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object of ``snsim search`` (contract section 5)."""
        r = self.best_probe.row if self.best_probe else None
        get = (lambda k: r.get(k)) if r else (lambda k: None)
        return {"policy": self.policy, self.what: self.best,
                "peak_bytes": get("peak_bytes"), "iteration_ms": get("iteration_ms"),
                "samples_per_s": get("samples_per_s"),
                "lower_bound_bytes": get("lower_bound_bytes"),
                "capacity_bytes": get("capacity_bytes"),
                "first_failing": {self.what: self.first_failing,
                                  "reason": self.first_failing_reason},
                "probes": len(self.probes), "planned": self.planned}


def _over(lb: int, cap: int) -> str | None:
    if lb > cap:
        return f"lower bound {lb} bytes exceeds the budget {cap} bytes"
    return None


def probe(graph: Graph, policy: str, budget_bytes: int | None, size: int) -> Probe:
    """Evaluate one size; decided by the lower bound alone when that exceeds the budget."""
    cap = budget_bytes if budget_bytes is not None else graph.trace.device.memory_bytes
    reason = _over(graph.lower_bound_bytes, cap)
    if reason is not None:
        return Probe(size, False, reason, None)
    return _evaluated(graph, policy, budget_bytes, size)


def _evaluated(graph: Graph, policy: str, budget_bytes: int | None, size: int) -> Probe:
    try:
        row = evaluate(graph, policy, budget_bytes).row()
    except SnsimError as exc:  # the policy refuses this trace: it does not fit
        row = {"policy": policy, "feasible": False, "reason": str(exc),
               "lower_bound_bytes": graph.lower_bound_bytes}
    return Probe(size, bool(row["feasible"]), row.get("reason"), row)


class _Searcher:
    def __init__(self, policy: str, family: Family, budget_bytes: int | None,
                 cache: ProbeCache | None, on_probe):
        self.policy, self.family, self.budget = policy, family, budget_bytes
        self.cache, self.on_probe = cache, on_probe
        self.bounds: dict[int, tuple[int, int]] = {}  # size -> (lower bound, device memory)
        self.probes: list[Probe] = []

    # ------------------------------------------------------------- bounds
    def bound(self, x: int) -> tuple[int, int]:
        if x not in self.bounds:
            fields = {"trace": self.family.identity(x)}
            rec = self.cache.get("bound", fields) if self.cache else None
            if rec is None:
                g = self.family.graph(x)
                rec = {"lower_bound_bytes": g.lower_bound_bytes,
                       "memory_bytes": g.trace.device.memory_bytes}
                if self.cache:
                    self.cache.put("bound", fields, rec)
            self.bounds[x] = (int(rec["lower_bound_bytes"]), int(rec["memory_bytes"]))
        return self.bounds[x]

    def cap(self, x: int) -> int:
        return self.budget if self.budget is not None else self.bound(x)[1]

    def over(self, x: int) -> str | None:
        return _over(self.bound(x)[0], self.cap(x))

    def estimate_top(self, start: int) -> int:
        """The size where the lower bound's line through two small sizes meets the
        budget (unchecked; :meth:`top` checks); MAX_SIZE when it never does."""
        a, b = start + 1, start + 2
        lb_a, lb_b = self.bound(a)[0], self.bound(b)[0]
        if lb_b <= lb_a:
            return MAX_SIZE
        return max(start, min(MAX_SIZE, b + (self.cap(b) - lb_b) // (lb_b - lb_a)))

    def top(self, start: int) -> int | None:
        """Largest size >= start whose lower bound fits (None: not even start's);
        MAX_SIZE when the bound would fit past it."""
        if self.over(start):
            return None
        a, b = start + 1, start + 2
        lb_a, lb_b = self.bound(a)[0], self.bound(b)[0]
        slope = lb_b - lb_a
        if slope > 0:
            t = b + (self.cap(b) - lb_b) // slope
            if t >= MAX_SIZE:
                return MAX_SIZE
            if t >= start and not self.over(t) and self.over(t + 1):
                return t  # the affine extrapolation, checked on both sides
        # not affine here: double on the bound, then interpolate
        lo, hi = start, None
        for x in sorted(self.bounds):
            if x >= start and self.over(x):
                hi = x if hi is None else min(hi, x)
        for x in sorted(self.bounds):
            if start <= x < (hi or MAX_SIZE + 1) and not self.over(x):
                lo = max(lo, x)
        while hi is None:
            if lo >= MAX_SIZE:
                return MAX_SIZE
            nxt = min(2 * lo, MAX_SIZE)
            if self.over(nxt):
                hi = nxt
            else:
                lo = nxt
        step = 0
        while hi - lo > 1:
            lb_lo, lb_hi, cap = self.bound(lo)[0], self.bound(hi)[0], self.cap(lo)
            if step % 2 == 0 and lb_hi > lb_lo:
                mid = lo + int((cap - lb_lo) * (hi - lo) / (lb_hi - lb_lo))
                mid = min(max(mid, lo + 1), hi - 1)
            else:
                mid = (lo + hi) // 2
            if self.over(mid):
                hi = mid
            else:
                lo = mid
            step += 1
        return lo

    # ------------------------------------------------------------- probes
    def run(self, x: int) -> Probe:
        reason = self.over(x)
        if reason is not None:
            p = Probe(x, False, reason, None)
        else:
            fields = {"trace": self.family.identity(x), "policy": self.policy,
                      "budget_bytes": self.cap(x)}
            rec = self.cache.get("probe", fields) if self.cache else None
            if rec is not None:
                p = Probe(x, bool(rec["feasible"]), rec.get("reason"), rec, cached=True)
            else:
                p = _evaluated(self.family.graph(x), self.policy, self.budget, x)
                if self.cache:
                    self.cache.put("probe", fields, p.row)
        self.probes.append(p)
        if self.on_probe is not None:
            self.on_probe(p)
        return p

    def predict(self) -> int | None:
        """Largest size the line through the two largest fitting probes' peaks keeps
        within the budget (None: fewer than two, or a flat line)."""
        fits = sorted({p.size: p for p in self.probes if p.feasible and p.row}.values(),
                      key=lambda p: p.size)
        if len(fits) < 2:
            return None
        # the line's other point: the largest fitting size a few blocks below (peaks
        # step by a block's bytes; a pair of neighbours says little about the slope)
        p2 = fits[-1]
        far = [p for p in fits[:-1] if p2.size - p.size >= max(8, p2.size // 16)]
        p1 = far[-1] if far else fits[-2]
        slope = (p2.peak_bytes - p1.peak_bytes) / (p2.size - p1.size)
        if slope <= 0:
            return None
        return p2.size + int((self.cap(p2.size) - p2.peak_bytes) // slope)


def search(policy: str, family: Family, budget_bytes: int | None,
           on_probe: Callable[[Probe], None] | None = None, start: int = 1,
           cache: ProbeCache | None = None) -> SearchResult:
    """Largest ``x >= start`` whose ``family.graph(x)`` the policy fits."""
    s = _Searcher(policy, family, budget_bytes, cache, on_probe)
    label = family.label
    if s.over(start):
        s.run(start)  # decided by the bound: reported as the one probe
        return SearchResult(policy, family.what, None, None, label(start), s.over(start),
                            tuple(s.probes))
    top, checked = s.estimate_top(start), False
    bad = _beyond(top)
    good: Probe | None = None
    x, predicted = start, None   # predicted: the size the last prediction said fits last
    trust, misses, tried_top = True, 0, False
    while True:
        if x is not None:
            p = s.run(x)
            tried_top = tried_top or x == top
            if predicted is not None and p.feasible != (x <= predicted):
                misses += 1
                trust = misses < MISSES
            if p.feasible:
                good = p
            else:
                bad = p
        if good is None:
            break
        if bad.size - good.size <= 1:
            if bad.reason is not None or checked:
                break
            # the bracket ends at the estimated bound: check it (graphs only, once)
            top, checked = s.top(start), True
            bad = _beyond(top) if top >= bad.size else Probe(top + 1, False, s.over(top + 1),
                                                              None)
            if top >= MAX_SIZE or bad.size - good.size <= 1:
                if bad.reason is None:
                    bad = Probe(bad.size, False, s.over(bad.size), None)
                break
            x = None
            continue
        lo, hi = good.size, bad.size
        predicted = s.predict() if trust else None
        if trust and predicted is None:
            x = min(2 * lo, hi - 1)            # doubling until two fitting peaks
        elif trust:
            x = min(max(predicted, lo + 1), hi - 1)
            if x > predicted:
                predicted = x - 1              # says lo is the answer: x should fail
        elif not tried_top and hi == top + 1:
            x = top                            # policies that reach the bound stop here
        else:
            x = (lo + hi) // 2
    if good is not None and good.size >= MAX_SIZE:
        raise ValueError(f"{policy} fits {family.what} {label(good.size)}: the search stops "
                         f"at {MAX_SIZE} (is the budget meant to be this large?)")
    return SearchResult(policy, family.what, label(good.size) if good else None, good,
                        label(bad.size), bad.reason, tuple(s.probes))


def _beyond(top: int) -> Probe:
    """The (not yet checked) first size past the bound: a failure with no reason yet."""
    if top >= MAX_SIZE:
        return Probe(MAX_SIZE + 1, False, f"past the search's limit {MAX_SIZE}", None)
    return Probe(top + 1, False, None, None)

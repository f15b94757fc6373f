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
3. **The recomputation's margin.** A policy that holds its peak at the budget
   and recomputes instead (``dtr``) fails where its recomputation reaches the
   context's limit, ``(thrash_limit - 1) x`` the compute.  Its fitting probes
   say how much of that allowance is left (the margin ``m``); taking the
   recomputation to grow as the inverse of the slack (budget less lower bound),
   the margin lasts ``m x slack`` of further bound, which gives a predicted
   last fit ``e``.  The next probe stays an eighth of the way from ``lo`` to
   ``e`` short of it (the prediction's error grows with the distance it
   extrapolates); once a pair's ``e`` has fitted (the margin undershoots, as
   ``dtr``'s does: it shrinks faster than the slack near the edge), the next
   pair is ``e`` and an eighth past it instead, until a margin probe fails.
   A prediction that the bracket's failure contradicts
   (``e >= hi - 1``) is not used, nor one into a bracket of at most
   :data:`SMALL_BRACKET` sizes (near the edge ``dtr``'s recomputation jumps by
   a few sizes' worth, more than an even cut loses), nor a share of the
   compute that is not at least twice the smallest fitting probe's (``sqrt-n``
   recomputes a fixed share and fails by memory).  Two probes that fail where
   the margin said fit, or :data:`MARGIN_STEPS` predictions, end this step;
   then bisection.

The margin step is a pair: the short size, then (if it fits) the edge itself
(after an undershoot: the edge, then past it), so what comes after the first
size does not wait for its row.  A peak line that
is flat (the peak exactly at the budget) predicts nothing: the prediction is
turned off at once, not doubled into the bound one size at a time.

**Workers.** With ``workers > 1`` the sizes the search may ask for next (if this
one fits, if it fails, and so on, where that needs no row not yet there) are
probed at the same time in forked processes; a result is used only when the
search asks for its size, so the probes, and the answer, are the same with any
number of workers, even for a policy that is not monotone.  Only the wall time
differs: each guess that comes true saves a probe's time.

Each probe is one :func:`snsim.evaluate.evaluate` point.  With a
:class:`~snsim.search.cache.ProbeCache`, probes and bounds already on disk are
read, not planned, and new ones are written as they finish (by the workers too:
each file is written whole, temp + rename).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

from snsim.errors import SnsimError
from snsim.evaluate import evaluate
from snsim.graph import Graph
from snsim.policies.base import PlanContext
from snsim.search.cache import ProbeCache
from snsim.search.models import Family
from snsim.search.workers import Pool

# No search goes past this size (2^20 blocks or samples): far beyond 12 GB.
MAX_SIZE = 1 << 20
MISSES = 2  # wrong predictions before the search stops predicting
MARGIN_STEPS = 8  # margin predictions per search at most (then bisection)
SMALL_BRACKET = 16  # brackets this narrow are cut evenly, never predicted into


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
    def measure(self, x: int) -> Probe:
        """One size's probe (the cache's, else planned and cached), not recorded."""
        reason = self.over(x)
        if reason is not None:
            return Probe(x, False, reason, None)
        fields = {"trace": self.family.identity(x), "policy": self.policy,
                  "budget_bytes": self.cap(x)}
        rec = self.cache.get("probe", fields) if self.cache else None
        if rec is not None:
            return Probe(x, bool(rec["feasible"]), rec.get("reason"), rec, cached=True)
        p = _evaluated(self.family.graph(x), self.policy, self.budget, x)
        if self.cache:
            self.cache.put("probe", fields, p.row)
        return p

    def record(self, p: Probe) -> Probe:
        self.probes.append(p)
        if self.on_probe is not None:
            self.on_probe(p)
        return p

    def run(self, x: int) -> Probe:
        return self.record(self.measure(x))

    def edge(self, good: Probe) -> int | None:
        """The last fit the recomputation's margin predicts from ``good`` (the largest
        fitting probe): its margin ``m`` lasts ``m x slack`` of further lower bound
        when the recomputation grows as the inverse of the slack (budget less lower
        bound).  None without a margin (a row that recomputes nothing, or a share of
        the compute not even twice the smallest fitting probe's) or a slope."""
        m = recompute_margin(good.row)
        first = min((p for p in self.probes if p.feasible and p.row), key=lambda p: p.size)
        if m is None or recompute_share(good.row) < 2 * recompute_share(first.row):
            return None   # a share that does not grow (sqrt-n's) is no margin
        lo = good.size
        a = min(self.bounds)
        if a == lo or lo not in self.bounds:
            return None
        slope = (self.bound(lo)[0] - self.bound(a)[0]) / (lo - a)
        slack = self.cap(lo) - self.bound(lo)[0]
        if slope <= 0 or slack <= 0:
            return None
        return lo + int(max(m, 0.0) * slack // slope)

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
           cache: ProbeCache | None = None, workers: int = 1) -> SearchResult:
    """Largest ``x >= start`` whose ``family.graph(x)`` the policy fits; ``workers``
    sizes probed at once (forked processes) where a step has that many."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    s = _Searcher(policy, family, budget_bytes, cache, on_probe)
    with Pool(workers) as pool:
        return _search(s, start, pool)


def _search(s: "_Searcher", start: int, pool: Pool) -> SearchResult:
    policy, family, label = s.policy, s.family, s.family.label
    if s.over(start):
        s.run(start)  # decided by the bound: reported as the one probe
        return SearchResult(policy, family.what, None, None, label(start), s.over(start),
                            tuple(s.probes))
    st = _State(s, start)
    ahead: dict[int, tuple[tuple[int, int], Probe]] = {}  # sizes probed ahead of asking
    x: int | None = start
    while x is not None:
        if x in ahead:
            bound, p = ahead.pop(x)
            s.bounds[x] = bound
            s.record(p)
        else:
            guesses = [g for g in st.guesses(x, pool.workers - 1)
                       if g not in ahead and not (g in s.bounds and s.over(g))]
            if not guesses or (x in s.bounds and s.over(x)):
                p = s.run(x)
            else:
                done = dict(pool.map(s, [x] + guesses))
                bound, p = done.pop(x)
                s.bounds[x] = bound
                s.record(p)
                ahead.update(done)
        st.update(p)
        x = st.next()
    good, bad = st.good, st.bad
    if good is not None and good.size >= MAX_SIZE:
        raise ValueError(f"{policy} fits {family.what} {label(good.size)}: the search stops "
                         f"at {MAX_SIZE} (is the budget meant to be this large?)")
    return SearchResult(policy, family.what, label(good.size) if good else None, good,
                        label(bad.size), bad.reason, tuple(s.probes))


class _State:
    """The bracket and the predictions: :meth:`next` is the size to probe next given
    every probe so far (:meth:`update`).  A copy told a made-up outcome says what
    would come next (:meth:`guesses`): workers probe those ahead, and a guess is
    used only if the search asks for it, so the probes are the same with any
    number of workers."""

    def __init__(self, s: "_Searcher", start: int):
        self.s, self.start = s, start
        self.top, self.checked = s.estimate_top(start), False
        self.bad: Probe = _beyond(self.top)
        self.good: Probe | None = None
        self.predicted: int | None = None  # the size the peak line said fits last
        self.trust, self.misses, self.tried_top = True, 0, False
        self.edge: int | None = None       # the last fit the margin predicts
        self.margin_misses = self.margin_steps = 0
        self.then: int | None = None       # the margin pair's second size, probed
        #                                    next if its first fits
        self.undershot = False             # the last margin pair's edge fit
        self.blind = False                 # a guess needed a made-up probe's row

    def update(self, p: Probe) -> None:
        self.tried_top = self.tried_top or p.size == self.top
        if self.predicted is not None and p.feasible != (p.size <= self.predicted):
            self.misses += 1
            self.trust = self.misses < MISSES
        if self.edge is not None and not p.feasible and p.size <= self.edge:
            self.margin_misses += 1
            self.undershot = False
        elif self.edge is not None and p.feasible and p.size >= self.edge:
            self.undershot = True
        if p.feasible:
            self.good = p
        else:
            self.bad, self.then = p, None

    def next(self) -> int | None:
        """The next size, None when the search is over."""
        s, good = self.s, self.good
        if good is None:
            return None
        if self.bad.size - good.size <= 1:
            if self.bad.reason is not None or self.checked:
                return None
            # the bracket ends at the estimated bound: check it (graphs only, once)
            top, self.checked = s.top(self.start), True
            self.top = top
            self.bad = bad = _beyond(top) if top >= self.bad.size else \
                Probe(top + 1, False, s.over(top + 1), None)
            if top >= MAX_SIZE or bad.size - good.size <= 1:
                if bad.reason is None:
                    self.bad = Probe(bad.size, False, s.over(bad.size), None)
                return None
            return self.next()
        lo, hi = good.size, self.bad.size
        if self.then is not None:
            x, self.then = self.then, None
            if lo < x < hi:
                return x
        self.predicted = None
        if self.trust:
            if good.row is None:
                self.blind = True
                return None
            predicted = s.predict()
            if predicted is not None:
                x = min(max(predicted, lo + 1), hi - 1)
                self.predicted = x - 1 if x > predicted else predicted  # x > predicted:
                return x                         # says lo is the answer, x should fail
            if sum(1 for p in s.probes if p.feasible and p.row) < 2:
                return min(2 * lo, hi - 1)       # doubling until two fitting peaks
            self.trust = False                   # a flat line: the peak sits at the budget
        self.edge = None
        if self.margin_misses < MISSES and self.margin_steps < MARGIN_STEPS \
                and hi - lo > SMALL_BRACKET:
            if good.row is None:
                self.blind = True
                return None
            edge = s.edge(good)
            # not when the margin does not explain hi's failure
            self.edge = edge if edge is not None and edge < hi - 1 else None
        if not self.tried_top and hi == self.top + 1:
            return self.top                      # policies that reach the bound stop here
        if self.edge is None:
            return (lo + hi) // 2
        self.margin_steps += 1
        edge = max(self.edge, lo)
        gap = (edge - lo) // 8   # the error grows with the distance predicted
        if self.undershot:
            # the last pair's edge fit (a margin that shrinks near the edge, as
            # dtr's does): the edge, then an eighth of the way past it
            x = max(edge, lo + 1)
            self.then = x + max(gap, 1) if x + max(gap, 1) < hi else None
            return x
        # an eighth of the way to the edge short of it, then the edge if that fits
        x = max(edge - gap, lo + 1)
        self.then = edge if edge > x else None
        return x

    def guesses(self, x: int, k: int) -> list[int]:
        """Up to ``k`` sizes the search may ask for after ``x``: what comes next if x
        fits, if it fails, and so on (breadth first), where that does not depend on a
        probe's row that is not there yet."""
        out: list[int] = []
        frontier = [(self, x)]
        while frontier and len(out) < k:
            st, y = frontier.pop(0)
            for fits in (True, False):
                h = copy.copy(st)
                h.blind = False
                h.update(Probe(y, fits, None, None))
                if h.good is None or h.bad.size - h.good.size <= 1:
                    continue    # ends, or checks the bound: nothing to guess
                z = h.next()
                if z is None or h.blind or z in out or z == x:
                    continue
                out.append(z)
                frontier.append((h, z))
                if len(out) == k:
                    break
        return out


def recompute_share(row: dict[str, Any]) -> float:
    """Recomputation over compute (0 when the row has neither)."""
    rec, comp = row.get("recompute_ms") or 0.0, row.get("compute_ms") or 0.0
    return rec / comp if rec > 0 and comp > 0 else 0.0


def recompute_margin(row: dict[str, Any] | None) -> float | None:
    """The unused fraction of the recomputation a plan may add, ``1 - recompute /
    ((thrash_limit - 1) x compute)`` at the context's default limit (the one a
    search's evaluation runs under); None when the row recomputes nothing."""
    share = recompute_share(row) if row else 0.0
    if share <= 0:
        return None
    return 1.0 - share / (PlanContext.thrash_limit - 1.0)


def _beyond(top: int) -> Probe:
    """The (not yet checked) first size past the bound: a failure with no reason yet."""
    if top >= MAX_SIZE:
        return Probe(MAX_SIZE + 1, False, f"past the search's limit {MAX_SIZE}", None)
    return Probe(top + 1, False, None, None)

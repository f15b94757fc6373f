"""``dtr``'s victim choice: the evictable tensor with the smallest score.

A mixin of :class:`snsim.policies.dtr.Planner` (it reads the planner's pool,
pins, clock, score and classes).  Every choice is a scan's (the smallest
score; of equal ones the latest evictable, or the last drawn of a sample),
found by branch and bound: every candidate's score is bounded below in one
numpy pass (:meth:`snsim.policies.dtr_pool.Pool.bounds`, from a cached cost),
and only candidates whose bound does not exceed the best exact score so far
are scored exactly.
"""

from __future__ import annotations

import math

import numpy as np

from snsim.graph import Tensor



class Chooser:
    """``exact``, ``best``, ``best_of`` and ``victim`` for the planner."""

    def exact(self, t: Tensor, below: float = math.inf) -> float:
        """The score of resident tensor ``t`` (``inf`` for a staleness of zero); its
        cost is kept as the pool's lower bound.  With ``below`` (a score) the
        search for its cost may stop once the score is certain to exceed it:
        the score returned is then a lower bound above ``below``."""
        inf = math.inf
        stale = self.clock - self.resident[t]
        size = self.nbytes[t]
        limit = inf
        if below < inf and stale > 0:
            cost_at = self.cost_at
            if cost_at is not None:
                limit = cost_at(below, size, stale) * (1.0 + 1e-9)
        cost = self.cost(self.cand_node[t], t[0] != "S", limit)
        if cost == inf:
            return inf
        pool = self.pool
        i = pool.slot.get(t)
        if i is not None:
            pool.K[i] = cost   # the pool's cached cost
        return self.score(cost, size, stale) if stale > 0 else inf

    def first(self, lb: np.ndarray, slots) -> tuple[float, int, float | None] | None:
        """The smallest exact score among ``slots`` (pool slots, ``lb`` their lower
        bounds, raised here where a search stopped, set to the score where
        scored), its index in ``slots``, and the smallest of the other bounds
        when known (None: not known), best first: the candidate with the
        smallest bound is scored with its search cut at the next smallest bound
        (or at twice its own, so that a candidate searched again searches at
        least twice as far), its bound raised if cut, until the smallest bound
        is an exact score.  None if no score is finite.  One ``argmin`` per
        candidate scored: the smallest bound after one is rescored is it or the
        next smallest found before (of equal ones the first, as ``argmin``)."""
        pool, inf = self.pool, math.inf
        done: set[int] = set()
        q = int(lb.argmin())
        low = float(lb[q])
        second = None   # the smallest other bound, once known
        while True:
            if low == inf:
                return None
            if q in done:
                return low, q, second
            lb[q] = inf
            q2 = int(lb.argmin())
            nxt = float(lb[q2])
            cut = max(nxt, 2.0 * low) if nxt < inf else inf
            h = self.exact(pool.t[slots[q]], cut)
            if h <= cut or h == inf:
                done.add(q)
            else:
                h = max(low, h)
            lb[q] = h
            if h < nxt or (h == nxt and q < q2):
                low, second = h, nxt
            else:
                q, low, second = q2, nxt, None

    def best(self, candidates) -> Tensor | None:
        """The unpinned tensor of ``candidates`` (pool slots) with the smallest
        score, scored one by one (``inf`` only if nothing scores less)."""
        pool, pins = self.pool, self.pins
        best, best_h = None, math.inf
        for k in candidates:
            t = pool.t[k]
            if pins.get(t):
                continue
            h = self.exact(t)
            if h <= best_h:
                best, best_h = t, h
        return best

    def best_of(self, picks: list[int]) -> Tensor | None:
        """:meth:`best` over pool slots ``picks`` (the sample, in draw order), by
        branch and bound: the same choice (the smallest score; of equal ones the
        last drawn; ``inf`` only if nothing scores less), but exact scores only
        for the picks whose lower bound does not exceed the best found so far."""
        pool, pins = self.pool, self.pins
        at = np.asarray(picks)
        lb = pool.bounds(self.score, self.clock, at)
        picks = at.tolist()
        best_q, best_h = -1, math.inf
        found = self.first(lb, picks)
        seen: dict[int, float] = {}   # slot -> its exact score
        if found is not None:
            h0 = found[0]
            seen[picks[found[1]]] = h0
            # only picks whose bound does not exceed the smallest exact score can win:
            # sorting those (a prefix of the sorted order) is the whole sort's loop
            near = np.flatnonzero(lb <= h0 * (1.0 + 1e-9))
            order = near[np.argsort(lb[near], kind="stable")].tolist()
        else:
            order = []
        for q in order:
            low = lb[q]
            if low == math.inf or low > best_h * (1.0 + 1e-9):
                break   # sorted: no later pick can score as little
            k = picks[q]
            t = pool.t[k]
            if pins.get(t):
                continue
            h = seen[k] if k in seen else seen.setdefault(k, self.exact(t, best_h))
            if h < best_h or (h == best_h and q > best_q):
                best_q, best_h = q, h
        if best_h == math.inf:   # every unpinned pick scores inf: the last one, as best()
            for q in range(len(picks) - 1, -1, -1):
                if not pins.get(pool.t[picks[q]]):
                    return pool.t[picks[q]]
            return None
        return pool.t[picks[best_q]]

    def victim(self) -> Tensor | None:
        """The evictable tensor with the smallest score: every candidate's lower
        bound in one vectorized pass, the smallest exact score found best first
        (:meth:`first`), then exact scores only for those whose bound does not
        exceed it, each search cut once it would exceed the best (branch and
        bound: the full scan's choice).  With ``sample`` and more than
        ``full_scan`` candidates: the best of ``sample`` drawn uniformly
        (seeded)."""
        self.settle()
        pool = self.pool
        n = len(pool)
        if not n:
            return None
        if self.sample is not None and n > max(self.sample, self.full_scan):
            # uniform draws, with replacement (a repeat is harmless)
            picked = self.best_of(self.rng.integers(0, n, self.sample))
            if picked is not None:
                return picked
        lb = pool.lb
        if lb is None or len(lb) != n:
            lb = pool.bounds(self.score, self.clock)
            if self.keep_bounds:
                pool.lb = lb   # raised below, where scored: still lower bounds
        E = pool.E
        found = self.first(lb, range(n))
        if found is None:   # all pinned or scoring inf: the latest evictable, as a scan
            free = np.flatnonzero(pool.P[:n] == 0.0)
            return pool.t[int(free[E[free].argmax()])] if len(free) else None
        h, i, second = found
        # every slot whose bound does not exceed the best exact score found: the
        # smallest score, of equal ones the latest evictable (simrd's scan, so it
        # never depends on which costs happen to be cached)
        tie = h * (1.0 + 1e-9)
        if second is None:   # ``first`` leaves ``h`` the smallest bound: is another as small?
            lb[i] = math.inf
            second = lb[lb.argmin()]
            lb[i] = h
        alone = second > tie
        below = () if alone else np.flatnonzero(lb <= tie)
        if len(below) > 1:
            self.rescored += 1
            if self.rescore is not None and len(below) > self.rescore:
                below = below[np.argpartition(lb[below], self.rescore)[:self.rescore]]
            for k in below[np.argsort(-E[below])].tolist():   # latest first: ties keep them
                if k != i and lb[k] <= h * (1.0 + 1e-9):
                    hk = self.exact(pool.t[k], h)
                    lb[k] = max(lb[k], hk)
                    if hk < h or (hk == h and E[k] > E[i]):
                        i, h = k, hk
        return pool.t[i]

"""Polish a plan by undoing its recomputations, or swapping instead, where
that is faster, and by retiming, keeping or recomputing its swaps
(:mod:`snsim.policies.retime`) (a primal heuristic of ``optimal``, and
``superneurons``' refinement; it improves a plan, it proves nothing).  A
helper of the policies, not a policy (the registry skips it).

A recomputation ``Compute R j`` remakes what an earlier free released.
Undoing it keeps those tensors instead: the last ``Free`` of each tensor the
recomputation makes before it, and the recomputation itself, are removed;
the tensors then live from their previous existence to the frees the plan
already has after the recomputation.  Or they are swapped instead: offloaded
after the compute that made them, freed where the plan freed them,
prefetched a few computes ahead of the recomputation and waited for where
it was.  Or, when nothing reads what it remakes any more, it is dropped;
or trimmed: what a compute reads before its next free is kept, the rest
dropped (a batch norm remade only for its saved statistics).  Each change is kept only if the plan
still passes the ledger's rules, fits the capacity (every free counted as
immediate, :func:`replay.planned_peak`) and is faster by the simulator's
rules (:func:`replay.estimate_ms`), so the polished plan is never slower and
is a plan like any other (the verifier and the simulator see it).

Why it pays: ``superneurons`` recomputes segments by a rule (cost-aware
recomputation over the first quarter or half of the layers), also where the
budget would hold what it recomputes (ResNet-50 b32 at 3x the lower bound:
10.6 ms of recomputation, no stall), and the MILP does not solve its LP
there within the time limit.  ``optimal`` polishes the plans it returns
(:func:`polish`, within a time); ``superneurons`` refines its own
(:func:`refine`, within a count of plans estimated, so the same everywhere).

A change is estimated first and checked against the ledger's rules and the
capacity only if faster (most are slower): the same choice as checking
first, in half the time (ResNet-152 b32 at 1.5x, superneurons' plan: 15.9
-> 7.4 s, the same plan).
"""

from __future__ import annotations

import math
import time

from snsim.errors import ScheduleError
from snsim.graph import Graph
from snsim.policies import replay, retime
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait


_UNSET = object()   # last_frees not worked out yet


def undo(g: Graph, ops: list[Op], r: int, frees=_UNSET) -> list[Op] | None:
    """``ops`` with the recomputation at index ``r`` undone, or None when some
    tensor it makes was not freed before it, or something other than a free
    touched it in between (a swap: not undone here).  ``frees``: its
    :func:`last_frees` where known."""
    if frees is _UNSET:
        frees = last_frees(g, ops, r)
    if frees is None:
        return None
    drop = {r, *frees.values()}
    return [o for i, o in enumerate(ops) if i not in drop]


def last_frees(g: Graph, ops: list[Op], r: int) -> dict | None:
    """Per tensor the recomputation at index ``r`` makes, the index of its last
    ``Free`` before ``r``; None when one was never freed before it, or
    something other than a free touched it in between.  One walk back for
    all of them: the first op met that touches one must be its free."""
    made = g.allocs_map[ops[r].step]
    left = set(made)
    found = {}
    k = r - 1
    while left:
        if k < 0:
            return None
        op = ops[k]
        t = getattr(op, "tensor", None)
        if t in left:
            if type(op) is not Free:
                return None
            found[t] = k
            left.discard(t)
        k -= 1
    return {t: found[t] for t in made}


def swap(g: Graph, ops: list[Op], r: int, back: int, frees=_UNSET) -> list[Op] | None:
    """``ops`` with the recomputation at index ``r`` replaced by a swap: each
    tensor it makes is offloaded right after the compute that made it before,
    freed where the plan freed it, prefetched before the compute ``back``
    computes ahead of ``r`` and waited for where the recomputation was; None
    where :func:`undo` finds it cannot be undone or the prefetch would come
    before the free.  ``frees``: its :func:`last_frees` where known."""
    made = g.allocs_map[ops[r].step]
    if frees is _UNSET:
        frees = last_frees(g, ops, r)
    if frees is None:
        return None
    p, seen = r, 0
    while seen < back:
        p -= 1
        if p < 0:
            return None
        seen += type(ops[p]) is Compute
    if p <= max(frees.values()):
        return None
    after: dict = {}   # index of the compute that made t -> the offloads after it
    for t, k in frees.items():
        m = k - 1
        while m >= 0 and not (type(ops[m]) is Compute and t in g.allocs_map[ops[m].step]):
            m -= 1
        if m < 0:
            return None
        after.setdefault(m, []).append(Offload(t))
    out: list[Op] = []
    for i, op in enumerate(ops):
        if i == p:
            out.extend(Prefetch(t) for t in made)
        if i == r:
            out.extend(Wait(t) for t in made)
            continue
        out.append(op)
        out.extend(after.get(i, ()))
    return out


def drop(g: Graph, ops: list[Op], r: int) -> list[Op] | None:
    """``ops`` without the recomputation at index ``r`` and the next free of each
    tensor it makes (right for one whose output nobody reads any more, once
    another change took its reader away: the ledger's walk refuses the rest);
    None when some tensor it makes is never freed after it."""
    drop = {r}
    for t in g.allocs_map[ops[r].step]:
        k = next((k for k in range(r + 1, len(ops))
                  if type(ops[k]) is Free and ops[k].tensor == t), None)
        if k is None:
            return None
        drop.add(k)
    return [o for i, o in enumerate(ops) if i not in drop]


def trim(g: Graph, ops: list[Op], r: int, frees=_UNSET) -> list[Op] | None:
    """``ops`` without the recomputation at index ``r``: of the tensors it makes,
    those a compute reads before their next free are kept instead (their
    last free before ``r`` removed, as :func:`undo`), the others were made
    for nothing (their next free removed, as :func:`drop`).  A batch norm
    recomputed only for its saved statistics (kilobytes) remakes its whole
    output (ResNet-50 b32: 106 MB, 0.93 ms) that nothing reads before it is
    freed again; undoing would keep both.  None when the plan does not have
    that shape (the ledger's walk refuses the rest).  ``frees``: its
    :func:`last_frees` where known."""
    out = {r}
    for t in g.allocs_map[ops[r].step]:
        nxt = None
        read = False
        for k in range(r + 1, len(ops)):
            o = ops[k]
            if type(o) is Free and o.tensor == t:
                nxt = k
                break
            if type(o) is Compute and t in g.needs_map.get(o.step, ()):
                read = True
                break
            if getattr(o, "tensor", None) == t:
                break
        if read:
            if frees is _UNSET:
                frees = last_frees(g, ops, r)
            if frees is None:
                return None
            out.add(frees[t])
        elif nxt is not None:
            out.add(nxt)
        else:
            return None
    return [o for i, o in enumerate(ops) if i not in out]


BACKS = (1, 2, 4, 8, 16, 32)   # prefetch distances of a swap, in computes
# superneurons' one pass (:func:`refine`): two distances, half the time per
# recomputation, and on the shipped traces as good a plan (superneurons' note 9)
REFINE_BACKS = (4, 16)


def variants(g: Graph, ops: list[Op], r: int, backs: tuple[int, ...] = BACKS,
             dropped: bool = True):
    """The plans :func:`polish` tries for the recomputation at ``r``: dropped
    (if ``dropped``), undone, trimmed (the part read kept, the rest dropped),
    then swapped with the prefetch ``backs`` computes ahead."""
    if dropped:
        yield drop(g, ops, r)
    frees = last_frees(g, ops, r)   # the same for all that follow
    yield undo(g, ops, r, frees)
    yield trim(g, ops, r, frees)
    for back in backs:
        yield swap(g, ops, r, back, frees)


def polish(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float
           ) -> tuple[float, list[Op], int]:
    """(ms, ops, changed): ``ops`` with every recomputation dropped, undone or
    swapped instead, then every swap retimed, kept or recomputed instead
    (:mod:`.retime`), that makes the plan faster and still fitting ``cap``,
    one at a time, within about ``seconds``.  Each kind of move is the better
    of two greedy orders, latest first (a recomputation that only fed a later
    one, once that one is undone, can go) and costliest first; the
    recomputations get the first half of the time, the swaps what is left
    (``RECOMPUTE_SHARE``); a swap's change frees memory or a copy engine's
    time, so the recomputations are tried once more after them."""
    t0 = time.perf_counter()
    ends = t0 + seconds
    ms, ops, changed = both_orders(g, cap, ops, ms, RECOMPUTE_SHARE * seconds, False)
    ms, ops, moved = both_orders(g, cap, ops, ms, ends - time.perf_counter(), True)
    if moved:
        ms, ops, more = greedy(g, cap, ops, ms, ends - time.perf_counter(),
                               costliest_first(g))
        moved += more
    return ms, ops, changed + moved


# the share of polish's time the recomputations' moves get first (the swaps' the rest)
RECOMPUTE_SHARE = 0.5


def both_orders(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float,
                swaps: bool) -> tuple[float, list[Op], int]:
    """The better of :func:`greedy` latest first (half of ``seconds``) and
    costliest first (the rest), on the recomputations or (``swaps``) the
    prefetches."""
    t0 = time.perf_counter()
    latest = greedy(g, cap, ops, ms, seconds / 2, lambda o, i: -i, swaps=swaps)
    left = max(0.0, seconds - (time.perf_counter() - t0))
    costliest = greedy(g, cap, ops, ms, left, costliest_first(g), swaps=swaps)
    return min(latest, costliest, key=lambda x: x[0])


class Work:
    """How many more plans :func:`greedy` may estimate (shared by several calls)."""

    def __init__(self, left: float = math.inf) -> None:
        self.left = left


def refine(g: Graph, cap: int, ops: list[Op], ms: float, work: Work
           ) -> tuple[float, list[Op], int]:
    """:func:`polish` bounded by work, not time (the same plan on every
    machine; ``superneurons``' note 9): one pass, costliest recomputation
    first, swaps :data:`REFINE_BACKS` computes ahead, no drops, at most
    ``work.left`` plans estimated (taken from it).  A recomputation can save
    at most its own time, so the costliest go first; a second pass found
    nothing more on the K40c ResNet-50 traces.  A drop is a trim where
    nothing reads what the recomputation makes, and fails the ledger's rules
    where something does (89 of 137 walks on ResNet-152 b32 at 1.5x)."""
    return greedy(g, cap, ops, ms, math.inf, costliest_first(g), passes=1,
                  backs=REFINE_BACKS, work=work, dropped=False)


def refine_swaps(g: Graph, cap: int, ops: list[Op], ms: float, work: Work
                 ) -> tuple[float, list[Op], int]:
    """:func:`polish`'s moves on swaps (:mod:`.retime`) bounded by work, not
    time (``superneurons``' note 10): largest prefetch first, in passes until
    one changes nothing or ``work.left`` plans are estimated."""
    return greedy(g, cap, ops, ms, math.inf, costliest_first(g), work=work, swaps=True)


def costliest_first(g: Graph):
    """A :func:`greedy` order: the recomputation, or the prefetch's copy, that
    takes longest first."""
    h2d_ms = 1e3 / g.trace.device.h2d_Bps
    return lambda o, i: (-g.step_ms(o.step, o.algo) if type(o) is Compute
                         else -g.sizes[o.tensor] * h2d_ms)


def greedy(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float, key,
           passes: int | None = None, backs: tuple[int, ...] = BACKS,
           work: Work | None = None, dropped: bool = True, swaps: bool = False
           ) -> tuple[float, list[Op], int]:
    """:func:`polish` in one order (``key(op, index)``, least first), in passes:
    each recomputation not yet tried in this pass (one is known by its op
    and the route step it precedes, which changes elsewhere do not move) is
    tried once, and takes its best change when that makes the plan faster;
    a pass that changed something is followed by another over all of them
    (a change frees memory or the copy engines for others).  Restarting the
    search after every change instead tries the early candidates again and
    again: on ResNet-50 b32 at 2x it ran out of its 5 s before converging.
    At most ``passes`` passes (None: until one changes nothing); swaps
    ``backs`` computes ahead; at most ``work.left`` plans estimated; drops
    tried if ``dropped``.  With ``swaps`` the sites are the prefetches
    instead, each with :func:`retime.variants` (one is known by its tensor
    and the route step its wait precedes, which moving it does not change)."""
    t0 = time.perf_counter()
    left = math.inf if passes is None else passes
    work = Work() if work is None else work
    ops = list(ops)
    changed = 0
    tried: set = set()
    moved = False
    base = replay.Resumable(g, ops, cap)   # each try changes it in one place (replay's note 4)
    while time.perf_counter() - t0 < seconds:
        at = stages(ops)
        if swaps:
            site = {i: (ops[i], at[w]) for i, w in retime.waits(ops).items()}
        else:
            site = {i: (o, at[i]) for i, o in enumerate(ops)
                    if type(o) is Compute and o.phase == "R"}
        cands = sorted((i for i, s in site.items() if s not in tried),
                       key=lambda i: (key(ops[i], i), i))
        if not cands:
            left -= 1
            if not moved or left <= 0:
                break
            tried, moved = set(), False   # another pass over all of them
            continue
        i = cands[0]
        tried.add(site[i])
        better = None
        tries = (retime.variants(g, ops, i, retime.BACKS) if swaps
                 else variants(g, ops, i, backs, dropped))
        for new in tries:
            if new is None:
                continue
            if work.left <= 0:
                break   # the work is spent: what this one has found so far is kept
            work.left -= 1
            # exact up to the time to beat; a slower plan's estimate stops early.
            # The ledger's rules and the capacity are checked for a faster one
            # only (most are slower): the same choice in about half the time
            t = base.estimate(new, ms if better is None else better[0])
            if not (t < ms - 1e-9 and (better is None or t < better[0])):
                continue
            try:
                ledger.walk(g, replay.with_optimizer_step(g, new))
            except ScheduleError:
                continue
            if replay.planned_peak(g, new, cap)[1] is None:
                better = (t, new)
        if better is not None:
            ms, ops = better
            base = replay.Resumable(g, ops, cap)
            changed += 1
            moved = True
        if work.left <= 0:
            break
    return ms, ops, changed


def stages(ops: list[Op]) -> list[int]:
    """Per op, how many route steps (forward or backward computes) come before it."""
    out, k = [], 0
    for o in ops:
        out.append(k)
        if type(o) is Compute and o.phase in ("F", "B"):
            k += 1
    return out

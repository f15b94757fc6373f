"""Polish a plan by undoing its recomputations, or swapping instead, where
that is faster (a primal heuristic of ``optimal``; it improves the
incumbent, it proves nothing).

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
there within the time limit.
"""

from __future__ import annotations

import time

from snsim.errors import ScheduleError
from snsim.graph import Graph
from snsim.policies import replay
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait


def undo(g: Graph, ops: list[Op], r: int) -> list[Op] | None:
    """``ops`` with the recomputation at index ``r`` undone, or None when some
    tensor it makes was not freed before it, or something other than a free
    touched it in between (a swap: not undone here)."""
    frees = last_frees(g, ops, r)
    if frees is None:
        return None
    drop = {r, *frees.values()}
    return [o for i, o in enumerate(ops) if i not in drop]


def last_frees(g: Graph, ops: list[Op], r: int) -> dict | None:
    """Per tensor the recomputation at index ``r`` makes, the index of its last
    ``Free`` before ``r``; None when one was never freed before it, or
    something other than a free touched it in between."""
    frees = {}
    for t in g.allocs_map[ops[r].step]:
        k = r - 1
        while k >= 0 and not (type(ops[k]) is Free and ops[k].tensor == t):
            if getattr(ops[k], "tensor", None) == t:
                return None
            k -= 1
        if k < 0:
            return None
        frees[t] = k
    return frees


def swap(g: Graph, ops: list[Op], r: int, back: int) -> list[Op] | None:
    """``ops`` with the recomputation at index ``r`` replaced by a swap: each
    tensor it makes is offloaded right after the compute that made it before,
    freed where the plan freed it, prefetched before the compute ``back``
    computes ahead of ``r`` and waited for where the recomputation was; None
    where :func:`undo` finds it cannot be undone or the prefetch would come
    before the free."""
    made = g.allocs_map[ops[r].step]
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


def trim(g: Graph, ops: list[Op], r: int) -> list[Op] | None:
    """``ops`` without the recomputation at index ``r``: of the tensors it makes,
    those a compute reads before their next free are kept instead (their
    last free before ``r`` removed, as :func:`undo`), the others were made
    for nothing (their next free removed, as :func:`drop`).  A batch norm
    recomputed only for its saved statistics (kilobytes) remakes its whole
    output (ResNet-50 b32: 106 MB, 0.93 ms) that nothing reads before it is
    freed again; undoing would keep both.  None when the plan does not have
    that shape (the ledger's walk refuses the rest)."""
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
            frees = last_frees(g, ops, r)
            if frees is None:
                return None
            out.add(frees[t])
        elif nxt is not None:
            out.add(nxt)
        else:
            return None
    return [o for i, o in enumerate(ops) if i not in out]


def variants(g: Graph, ops: list[Op], r: int):
    """The plans :func:`polish` tries for the recomputation at ``r``: dropped,
    undone, trimmed (the part read kept, the rest dropped), then swapped with
    the prefetch 1, 2, 4, 8, 16 or 32 computes ahead."""
    yield drop(g, ops, r)
    yield undo(g, ops, r)
    yield trim(g, ops, r)
    for back in (1, 2, 4, 8, 16, 32):
        yield swap(g, ops, r, back)


def polish(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float
           ) -> tuple[float, list[Op], int]:
    """(ms, ops, changed): ``ops`` with every recomputation dropped, undone or
    swapped instead that makes the plan faster and still fitting ``cap``, one
    at a time, within about ``seconds``: the better of two greedy orders,
    latest first (a recomputation that only fed a later one, once that one is
    undone, can go) and costliest first."""
    t0 = time.perf_counter()
    latest = greedy(g, cap, ops, ms, seconds / 2, lambda o, i: -i)
    left = max(0.0, seconds - (time.perf_counter() - t0))
    costliest = greedy(g, cap, ops, ms, left, lambda o, i: -g.step_ms(o.step, o.algo))
    return min(latest, costliest, key=lambda x: x[0])


def greedy(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float, key
           ) -> tuple[float, list[Op], int]:
    """:func:`polish` in one order (``key(op, index)``, least first), in passes:
    each recomputation not yet tried in this pass (one is known by its op
    and the route step it precedes, which changes elsewhere do not move) is
    tried once, and takes its best change when that makes the plan faster;
    a pass that changed something is followed by another over all of them
    (a change frees memory or the copy engines for others).  Restarting the
    search after every change instead tries the early candidates again and
    again: on ResNet-50 b32 at 2x it ran out of its 5 s before converging."""
    t0 = time.perf_counter()
    ops = list(ops)
    changed = 0
    tried: set = set()
    moved = False
    while time.perf_counter() - t0 < seconds:
        at = stages(ops)
        cands = sorted((i for i, o in enumerate(ops)
                        if type(o) is Compute and o.phase == "R" and (o, at[i]) not in tried),
                       key=lambda i: key(ops[i], i))
        if not cands:
            if not moved:
                break
            tried, moved = set(), False   # another pass over all of them
            continue
        i = cands[0]
        tried.add((ops[i], at[i]))
        better = None
        for new in variants(g, ops, i):
            if new is None:
                continue
            try:
                ledger.walk(g, replay.with_optimizer_step(g, new))
            except ScheduleError:
                continue
            # exact up to the time to beat; a slower plan's estimate stops early
            t = replay.estimate_ms(g, new, cap, ms if better is None else better[0])
            if t < ms - 1e-9 and (better is None or t < better[0]) \
                    and replay.planned_peak(g, new, cap)[1] is None:
                better = (t, new)
        if better is not None:
            ms, ops = better
            changed += 1
            moved = True
    return ms, ops, changed


def stages(ops: list[Op]) -> list[int]:
    """Per op, how many route steps (forward or backward computes) come before it."""
    out, k = [], 0
    for o in ops:
        out.append(k)
        if type(o) is Compute and o.phase in ("F", "B"):
            k += 1
    return out

"""Polish a plan by undoing its recomputations where memory allows (a primal
heuristic of ``optimal``; it improves the incumbent, it proves nothing).

A recomputation ``Compute R j`` remakes what an earlier free released.
Undoing it keeps those tensors instead: the last ``Free`` of each tensor the
recomputation makes before it, and the recomputation itself, are removed;
the tensors then live from their previous existence to the frees the plan
already has after the recomputation.  Each undo is kept only if the plan
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
from snsim.schedule.ops import Compute, Free, Op


def undo(g: Graph, ops: list[Op], r: int) -> list[Op] | None:
    """``ops`` with the recomputation at index ``r`` undone, or None when some
    tensor it makes was not freed before it, or something other than a free
    touched it in between (a swap: not undone here)."""
    op = ops[r]
    drop = {r}
    for t in g.allocs_map[op.step]:
        k = r - 1
        while k >= 0 and not (type(ops[k]) is Free and ops[k].tensor == t):
            if getattr(ops[k], "tensor", None) == t:
                return None
            k -= 1
        if k < 0:
            return None
        drop.add(k)
    return [o for i, o in enumerate(ops) if i not in drop]


def polish(g: Graph, cap: int, ops: list[Op], ms: float, seconds: float
           ) -> tuple[float, list[Op], int]:
    """(ms, ops, undone): ``ops`` with every recomputation undone that makes the
    plan faster and still fitting ``cap``, tried costliest first, within about
    ``seconds``."""
    t0 = time.perf_counter()
    ops = list(ops)
    undone = 0
    tried: set = set()
    while time.perf_counter() - t0 < seconds:
        cands = sorted(((g.step_ms(o.step, o.algo), i) for i, o in enumerate(ops)
                        if type(o) is Compute and o.phase == "R" and (o, i) not in tried),
                       reverse=True)
        better = None
        for _, i in cands:
            if time.perf_counter() - t0 >= seconds:
                break
            tried.add((ops[i], i))
            new = undo(g, ops, i)
            if new is None:
                continue
            try:
                ledger.walk(g, replay.with_optimizer_step(g, new))
            except ScheduleError:
                continue
            if replay.planned_peak(g, new, cap)[1] is not None:
                continue
            t = replay.estimate_ms(g, new, cap)
            if t < ms - 1e-9:
                better = (t, new)
                break
        if better is None:
            break
        ms, ops = better
        undone += 1
        tried = set()   # indices moved: try the rest again on the new plan
    return ms, ops, undone

"""A heuristic's plan as a start for the MILP (its binaries read off the ops).

Stage k of a plan is the ops after route step k-1's compute up to route step
k's compute.  ``R[k,j]`` is a ``Compute R_j`` in stage k, ``P[k,t]`` a
``Prefetch t`` in stage k, ``O[t]`` an ``Offload t`` during forward, and each
route step's algorithm is the plan's.  Residency is put in the class's
canonical order (frees as early as the class frees): ``S[k,t]`` holds when t
is resident right after route step k-1, is not brought back in stage k, and
is used in stage k (by the step or a recomputation) or kept to stage k+1.
That only moves frees earlier, so the plan's levels can only go down; an
offloaded tensor is freed where the plan frees it (the class waits for its
copy there, earlier would stall longer); a gradient's offload is read as
the class's, issued right after the step making it.  A plan outside the
class (a recomputation during forward, an activation offloaded during
backward, a prefetch the model has no column for) uses
keys the model lacks: :func:`plan_start` then returns None, as it does where
it breaks a row (:func:`.solve.complete` finds that out, and HiGHS starts
without it).
"""

from __future__ import annotations

from snsim.policies.optimal.formulation import Formulation
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch


def plan_start(f: Formulation, ops: list[Op]) -> tuple[list[int], list[float]] | None:
    """(columns, values) of the binaries of ``ops`` in ``f``, or None when the plan
    uses a decision ``f`` has no column for."""
    g = f.graph
    K = len(g.route)
    decision = set(f.tensors)
    resident: set = set()
    after: list[set] = []                 # resident right after route step k
    before: list[set] = []                # resident right before route step k
    brought: list[set] = [set() for _ in range(K + 1)]   # prefetched or recomputed in stage k
    used: list[set] = [set() for _ in range(K + 1)]      # needed in stage k
    offloaded: set = set()
    k = 0
    on: dict = {}
    algo: dict[int, int] = {}
    try:
        for op in ops:
            kind = type(op)
            if kind is Free:
                resident.discard(op.tensor)
            elif kind is Compute:
                if op.phase == "R":
                    on[f.R[k, op.layer]] = 1.0
                    brought[k].add(("X", op.layer))
                    used[k].update(t for t in g.needs_map[op.step] if t in decision)
                    resident.update(t for t in g.allocs_map[op.step] if t in decision)
                    continue
                if op.phase == "O":
                    continue
                algo[k] = op.algo
                before.append(set(resident))
                used[k].update(t for t in g.needs_map[op.step] if t in decision)
                resident.update(t for t in g.allocs_map[op.step] if t in decision)
                after.append(set(resident))
                k += 1
            elif kind is Prefetch:
                if op.tensor not in decision:
                    return None   # a tensor the class does not swap
                on[f.P[k, op.tensor]] = 1.0
                brought[k].add(op.tensor)
                resident.add(op.tensor)
            elif kind is Offload:
                t = op.tensor
                if t not in decision or (k >= g.n and t not in f.grads):
                    return None   # an activation offloaded in backward
                on[f.O[t]] = 1.0
                offloaded.add(t)
        kept: set = set()                  # S[k+1] of the stage after
        for k in range(K - 1, 0, -1):
            now = {t for t in after[k - 1]
                   if t not in brought[k] and (k, t) in f.S
                   and (t in used[k] or t in kept or (t in offloaded and t in before[k]))}
            for t in now:
                on[f.S[k, t]] = 1.0
            kept = now
    except (KeyError, IndexError):
        return None
    for kk, pairs in f.A.items():
        for v, a in pairs:
            on[v] = 1.0 if algo.get(kk, 0) == a else 0.0
    idx = sorted(on)
    return idx, [on[i] for i in idx]

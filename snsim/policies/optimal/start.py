"""A heuristic's plan as a start for the MILP (its binaries read off the ops).

Stage k of a plan is the ops after route step k-1's compute up to route step
k's compute.  For the formulation's binaries: ``S[k,t]`` (t resident when
stage k's first prefetch or compute is issued: the frees, offloads and waits
before it close stage k-1, as the class orders them), ``R[k,j]`` (``Compute R_j`` in stage k), ``P[k,t]`` (``Prefetch t``
in stage k), ``O[t]`` (``Offload t`` while forward runs) and each route step's
algorithm.  A plan outside the formulation's class (a recomputation during
forward, a gradient swapped, a prefetch the model has no column for) gives
keys the model lacks: :func:`plan_start` then returns None, as it does for a
plan whose binaries break a row (:func:`.solve.complete` finds that out, and
HiGHS starts without it).
"""

from __future__ import annotations

from snsim.policies.optimal.formulation import Formulation
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch


def plan_start(f: Formulation, ops: list[Op]) -> tuple[list[int], list[float]] | None:
    """(columns, values) of the binaries of ``ops`` in ``f``, or None when the plan
    uses a decision ``f`` has no column for."""
    g = f.graph
    decision = set(f.tensors)
    resident: set = set()
    k = 0                 # the stage the next ops belong to
    opened = False        # stage k's start recorded (its first op that is not a free)
    on: dict = {}
    algo: dict[int, int] = {}

    def open_stage():
        # a tensor resident where the model has no column (kept past its last
        # use) is left out: the model frees it, which only lowers the levels
        for t in resident:
            if (k, t) in f.S:
                on[f.S[k, t]] = 1.0

    try:
        for op in ops:
            if type(op) is Free:
                resident.discard(op.tensor)
                continue
            if not opened and type(op) in (Compute, Prefetch):
                open_stage()
                opened = True
            if type(op) is Compute:
                if op.phase == "R":
                    on[f.R[k, op.layer]] = 1.0
                    resident.add(("X", op.layer))
                    continue
                algo[k] = op.algo
                for t in g.allocs_map[op.step]:
                    if t in decision:
                        resident.add(t)
                k += 1
                opened = False
            elif type(op) is Prefetch:
                if op.tensor in decision:
                    on[f.P[k, op.tensor]] = 1.0
                    resident.add(op.tensor)
                else:
                    return None   # a gradient swapped: not in the class
            elif type(op) is Offload:
                if op.tensor in decision and k < g.n:
                    on[f.O[op.tensor]] = 1.0
                else:
                    return None
    except KeyError:
        return None
    for kk, pairs in f.A.items():
        for v, a in pairs:
            on[v] = 1.0 if algo.get(kk, 0) == a else 0.0
    idx = sorted(on)
    return idx, [on[i] for i in idx]

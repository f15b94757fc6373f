"""A MILP solution as a schedule, and the peak the model predicts for it.

The op order inside a stage is the one :mod:`.formulation` models (its
docstring); every byte and every time rule the model counts corresponds to
an op written here, so the ledger and the simulator see what the model saw.
"""

from __future__ import annotations

from snsim.policies.optimal.formulation import Formulation, order_key
from snsim.policies.optimal.timing import offload_key
from snsim.schedule.ledger import planned_peak
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait


def chosen(values: list[float], var: int | None) -> bool:
    return var is not None and values[var] > 0.5


def decode(f: Formulation, values: list[float]) -> tuple[list[Op], int]:
    """The ops of the solution ``values`` and the model's peak level (bytes)."""
    g = f.graph
    n, route = g.n, g.route
    S = {key for key, v in f.S.items() if chosen(values, v)}
    R = sorted(key for key, v in f.R.items() if chosen(values, v))
    P = sorted((key for key, v in f.P.items() if chosen(values, v)),
               key=lambda kt: order_key(f, *kt))
    O = sorted((t for t, v in f.O.items() if chosen(values, v)),
               key=lambda t: offload_key(f, t))
    offload_at: dict[int, list] = {}
    waits_after: dict[int, list] = {}
    wait_at: dict[int, list] = {}
    K = len(route)
    for t in O:   # the stage at whose end t is first freed (a forward one but for gradients)
        b = f.birth[t]
        offload_at.setdefault(b, []).append(t)
        k = next((k for k in range(b, K if t in f.grads else n) if (k + 1, t) not in S), None)
        if k is not None:
            waits_after.setdefault(k, []).append(t)
        else:   # kept into backward: waited for at its start
            wait_at.setdefault(n, []).append(t)
    r_at: dict[int, list[int]] = {}
    for k, j in R:
        r_at.setdefault(k, []).append(j)
    p_at: dict[int, list] = {}
    for k, t in P:
        p_at.setdefault(k, []).append(t)
        if f.P_wait[k, t] > k:
            wait_at.setdefault(f.P_wait[k, t], []).append(t)
    s_at: dict[int, list] = {}
    for k, t in S:
        s_at.setdefault(k, []).append(t)
    static = g.trace.static_bytes
    ops: list[Op] = []
    peak = static
    for k, step in enumerate(route):
        layer = step[1]
        ops.extend(Wait(t) for t in wait_at.get(k, []))
        level = static + f.fixed_start[k] + sum(g.size(t) for t in s_at.get(k, []))
        for t in p_at.get(k, []):
            ops.append(Prefetch(t))
            level += g.size(t)
        ops.extend(Wait(t) for t in p_at.get(k, []) if f.P_wait[k, t] == k)
        for j in r_at.get(k, []):
            ops.append(Compute("R", j, f.r_algo[j]))
            level += f.r_bytes[j]
            peak = max(peak, level + g.workspace_bytes(("R", j), f.r_algo[j]))
        here = set(s_at.get(k, [])) | set(p_at.get(k, []))
        here |= {("X", j) for j in r_at.get(k, [])}
        if step[0] == "B":   # freed before the step: not needed by it, not kept (a
            # swappable gradient: at the stage's end)
            early = sorted((t for t in here if t not in g.needs_map[step] and (k + 1, t) not in S
                            and t not in f.grads),
                           key=lambda t: (t[1], t[0]))
            early += [("S", j) for j in r_at.get(k, []) if f.r_bytes[j] > g.layers[j].output_bytes]
            ops.extend(Free(t) for t in early)
            level -= sum(g.size(t) for t in early)
            here -= set(early)
        algo = 0
        for v, a in f.A.get(k, []):
            if chosen(values, v):
                algo = a
        ops.append(Compute(step[0], layer, algo))
        level += f.step_alloc[k]
        peak = max(peak, level + g.workspace_bytes(step, algo))
        # its dying reads first (the ledger's run of frees: the step hands them
        # to autograd, formulation.step_peaks), then the copies and the rest
        dying = g.dying.get(step, ())
        first = sorted((t for t in here if t in dying and (k + 1, t) not in S
                        and t not in f.grads), key=lambda t: (t[1], t[0]))
        first += [t for t in f.fixed_free[k] if t in dying]
        ops.extend(Free(t) for t in first)
        here -= set(first)
        ops.extend(Offload(t) for t in offload_at.get(k, []))
        ops.extend(Wait(t) for t in waits_after.get(k, []))
        here |= {t for t in g.allocs_map[step] if f.birth.get(t) == k}
        ops.extend(Free(t) for t in sorted(here, key=lambda t: (t[1], t[0]))
                   if (k + 1, t) not in S)
        ops.extend(Free(t) for t in f.fixed_free[k] if t not in first)
    if any(g.bwd_released(s) is not None for s in route[n:]):
        # a measured trace: whether a backward step hands its dying reads to
        # autograd depends on the ops after it (the ledger's rule, which the
        # rows follow: formulation.step_peaks); the ledger says which it is
        peak = planned_peak(g, ops)[0]
    return ops, peak

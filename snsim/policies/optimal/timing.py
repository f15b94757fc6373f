"""The time rows of :mod:`.formulation`: the simulator's max-plus recurrences.

The compute stream runs each stage's recomputations and step after its
waits; the device-to-host engine copies the chosen offloads in issue order
(after the forward step that makes each); the host-to-device engine the
chosen prefetches in issue order, each after its offload ended.  Every row
is a lower bound of the form ``time >= other time + duration`` (big-M where
a binary switches it on), so with the binaries fixed the least solution is
the simulator's timing and the makespan ``Z`` its iteration time.
"""

from __future__ import annotations

from snsim.policies.optimal.milp import add


def offload_key(f, t) -> tuple:
    """Issue order of the offloads (the device-to-host engine's): by the stage
    whose step makes the tensor, X first, then by kind and layer."""
    return (f.birth[t], t[0] != "X", t[0], t[1])


def time_rows(f, r_at: dict, p_at: dict, horizon: float) -> None:
    """Add the time rows to ``f.milp`` (``f``: the
    :class:`.formulation.Formulation`); ``r_at``/``p_at``: stage -> [(layer or
    tensor, column)] of candidate recomputations / prefetches in issue order."""
    g, m = f.graph, f.milp
    n, route = g.n, g.route
    K = len(route)
    dev = g.trace.device
    d2h_ms, h2d_ms = 1e3 / dev.d2h_Bps, 1e3 / dev.h2d_Bps
    size = {t: g.size(t) for t in f.tensors}
    # time: the compute stream; W[k] is stage k's start after the waits for
    # the prefetches it issued itself (T[k] where it has none)
    least = lambda v: m.lb[v]   # noqa: E731
    most = lambda v: m.ub[v]   # noqa: E731
    W = list(f.T[:K])
    for k in {k for (k, t), u in f.P_wait.items() if u == k}:
        W[k] = m.var(m.lb[f.T[k]], m.ub[f.T[k]], integer=False)
        m.row({W[k]: 1.0, f.T[k]: -1.0}, lo=0.0)
    # C[k]: the end of stage k's step, where an offload is issued after it
    # (T[k+1] where no op after the step can delay the next stage)
    C = {}
    for k in sorted({f.birth[t] for t in f.O}):
        C[k] = m.var(m.lb[f.T[k]], m.ub[f.T[k + 1]], integer=False)
        m.row({f.T[k + 1]: 1.0, C[k]: -1.0}, lo=0.0)
    for k, step in enumerate(route):
        c = {C.get(k, f.T[k + 1]): 1.0, W[k]: -1.0}
        const = 0.0
        for j, r in r_at.get(k, []):
            add(c, r, -g.step_ms(("R", j), f.r_algo[j]))
        if k in f.A:
            for v, a in f.A[k]:
                add(c, v, -g.step_ms(step, a))
        else:
            const = g.step_ms(step, 0)
        m.row(c, lo=const)            # T[k+1] (or C[k]) >= the step's end
    # d2h: one chain over the candidate offloads in issue order (X_i, then S_i,
    # after F_i; a gradient after the backward step making it); E[t] is the
    # engine's time after candidate t (its copy's end when chosen), after C.
    E: dict = {}
    prev = None
    for t in sorted(f.O, key=lambda t: offload_key(f, t)):
        i, o = f.birth[t], f.O[t]
        q = E[t] = m.var(m.lb[f.T[i]], horizon, integer=False)
        copy = size[t] * d2h_ms
        m.row({q: 1.0, C[i]: -1.0, o: -copy}, lo=0.0)
        if prev is not None:
            m.row({q: 1.0, prev: -1.0, o: -copy}, lo=0.0)
        prev = q
    if prev is not None:
        m.row({f.Z: 1.0, prev: -1.0}, lo=0.0)
    # h2d: the same over the candidate prefetches; a chosen one's wait is at
    # the start of its stage P_wait, and it starts after its offload ended
    prev = None
    for k in sorted(p_at):
        for t, p in p_at[k]:
            q = m.var(m.lb[f.T[k]], horizon, integer=False)
            copy = size[t] * h2d_ms
            m.row({q: 1.0, f.T[k]: -1.0, p: -copy}, lo=0.0)
            if prev is not None:
                m.row({q: 1.0, prev: -1.0, p: -copy}, lo=0.0)
            big = max(0.0, most(E[t]) - least(q))
            m.row({q: 1.0, E[t]: -1.0, p: -copy - big}, lo=-big)
            u = f.P_wait[k, t]
            wait = W[u] if u == k else f.T[u]
            big = max(0.0, most(q) - least(wait))
            m.row({wait: 1.0, q: -1.0, p: -big}, lo=-big)
            prev = q
    engine_rows(f, p_at, W)
    for t, o in f.O.items():
        # freed at the end of forward stage k (a gradient: of any stage; after
        # waiting for its copy): T[k+1] >= E[t] when o = 1 and S[k,t] - S[k+1,t]
        # = 1 (S[i,t] = 1)
        i = f.birth[t]
        for k in range(f.first_free.get(t, f.last_fwd.get(t)), K if t in f.grads else n):
            big = max(0.0, most(E[t]) - least(f.T[k + 1]))
            row = {f.T[k + 1]: 1.0, E[t]: -1.0, o: -big}
            lo = -2 * big
            if k == i:
                lo += big
            elif (k, t) in f.S:
                add(row, f.S[k, t], -big)
            else:
                break   # t's last use was before stage k
            add(row, f.S.get((k + 1, t)), big)
            m.row(row, lo=lo)
        if (n, t) in f.S:
            # kept into backward: its copy is waited for at backward's start
            big = max(0.0, most(E[t]) - least(f.T[n]))
            m.row({f.T[n]: 1.0, E[t]: -1.0, o: -big, f.S[n, t]: -big}, lo=-2 * big)
    m.row({f.Z: 1.0, f.T[K]: -1.0}, lo=0.0)


ENGINE_TERMS = 200_000   # at most this many nonzeros in the rows of engine_rows


def engine_rows(f, p_at: dict, W: list) -> None:
    """Rows the integer solutions already satisfy, written without a big-M:
    the prefetches issued at stage a or later and waited for by stage b's
    compute copy one after another on the host-to-device engine, each after
    its issue (at ``T[a]`` or later) and before its wait (at ``W[b]`` or
    earlier), so ``W[b] - T[a] >= sum of their copy times``.  (The chain of
    engine times gives that for chosen prefetches: the last of them in issue
    order ends at least the sum after ``T[a]``, and is waited for by
    ``W[b]``.)  The LP relaxation otherwise meets a wait through its big-M
    row with a fractional prefetch for a fraction of the copy.  Pairs (a, b)
    by growing distance, while the rows stay under ``ENGINE_TERMS`` terms."""
    g, m = f.graph, f.milp
    h2d_ms = 1e3 / g.trace.device.h2d_Bps
    by_issue: dict = {}
    for k, pairs in p_at.items():
        for t, p in pairs:
            by_issue.setdefault(k, []).append((f.P_wait[k, t], g.size(t) * h2d_ms, p))
    stages = sorted(by_issue)
    if not stages:
        return
    last = max(u for items in by_issue.values() for u, _, _ in items)
    terms_left = ENGINE_TERMS
    for span in range(last - stages[0] + 1):
        for a in stages:
            b = a + span
            if b > last or W[b] == f.T[a]:   # a == b: only same-stage prefetches count
                continue
            row = {W[b]: 1.0, f.T[a]: -1.0}
            for k in range(a, b + 1):
                for u, copy, p in by_issue.get(k, ()):
                    if u <= b:
                        add(row, p, -copy)
            if len(row) == 2:
                continue
            if len(row) > terms_left:
                return
            terms_left -= len(row)
            m.row(row, lo=0.0)

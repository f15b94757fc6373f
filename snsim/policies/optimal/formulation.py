"""The MILP of ``optimal``: keep / recompute / offload / prefetch over stages.

Stages are the route steps (stage k runs route step k).  The schedule class
(what the model can express, and what :mod:`.decode` writes) is:

* stage k's ops, in order: the waits for the prefetches issued in stage k-1;
  the prefetches of stage k (the one waited for first first, then highest
  layer first); the waits for those used in stage k itself; the recomputations
  ``R_j`` of stage k (lowest layer first, backward stages only, never the data
  layer); in a backward stage, the frees of what the step does not need and
  the next stage does not keep; the route step (with a chosen workspace algorithm); the
  offloads chosen of what it made (``X_i`` after ``F_i``, a gradient after
  the backward step making it); the waits for the offloads of the tensors
  freed for the first time at this stage's end; then the frees;
* an activation ``X_i`` is resident at the start of stage k (``S[k,i]``) only if
  it was resident, recomputed or prefetched in stage k-1 (Checkmate's keep
  matrix); an offloaded tensor freed in forward is freed (the first time)
  after waiting for its copy, so the free is immediate and the memory count
  exact; one kept into backward is waited for at the start of backward (and
  freed there like any tensor); it may come back by a prefetch issued in a forward stage
  between two of its forward uses (a residual block's input, for the add:
  freed again after it) or in any backward stage up to a use (waited for
  at the start of the stage of its next use);
* saved extras ``S_i`` of layers with a backward step are decisions like
  ``X_i`` (kept or swapped; a recomputation does not remake them);
* a gradient of :func:`gradient_swaps` (one that waits across stages before
  its first in-place write) is offloaded, if chosen, right after the
  backward step that makes it, freed at the end of a stage (the first time
  after waiting for its copy; never before a backward step), and
  prefetched for a use up to that write; every other gradient lives as
  under ``liveness``;
* a recomputation uses the layer's algorithm with the least workspace.

Memory rows are the ledger's levels of every op that can raise the peak
(each recomputation, each route step); time rows are the
simulator's max-plus recurrences for the compute stream and the two copy
engines, so for fixed binaries the least solution is the simulator's
timing and the objective (the makespan) is its iteration time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from snsim.graph import Graph
from snsim.policies.optimal.milp import MiB, Milp, add
from snsim.policies.optimal.timing import time_rows



@dataclass
class Formulation:
    graph: Graph
    capacity: int
    milp: Milp
    S: dict = field(default_factory=dict)     # (k, t) -> tensor t on the device at stage k's start
    R: dict = field(default_factory=dict)     # (k, j) -> R_j runs in stage k
    P: dict = field(default_factory=dict)     # (k, t) -> t prefetched in stage k
    P_wait: dict = field(default_factory=dict)  # (k, t) -> stage whose start waits for it
    O: dict = field(default_factory=dict)     # t -> t offloaded after the forward step making it
    A: dict = field(default_factory=dict)     # k -> [(var, algo)] workspace choice of step k
    T: list = field(default_factory=list)     # stage start times
    Z: int = -1                               # makespan
    last_fwd: dict = field(default_factory=dict)   # t -> stage of t's last forward use
    first_free: dict = field(default_factory=dict)  # t -> first stage at whose end an
    #                                                 offloaded t may be freed (last_fwd if absent)
    birth: dict = field(default_factory=dict)   # t -> the stage whose step makes t (X_i, S_i: i)
    grads: set = field(default_factory=set)     # the gradients among the decision tensors
    tensors: list = field(default_factory=list)    # the decision tensors (X_i, S_i, grads)
    fixed_start: list = field(default_factory=list)  # G/S bytes resident at each stage start
    step_alloc: list = field(default_factory=list)   # bytes each route step allocates
    r_bytes: dict = field(default_factory=dict)      # j -> bytes R_j allocates
    r_algo: dict = field(default_factory=dict)       # j -> R_j's algorithm (least workspace)
    fixed_free: list = field(default_factory=list)   # G/S tensors freed at each stage end
    early: list = field(default_factory=list)   # k -> least start of stage k (K: of the end)
    late: list = field(default_factory=list)    # k -> latest start of stage k within the horizon


def demand(graph: Graph, recomputable: list[bool]) -> tuple[dict, list[set]]:
    """Stages where each decision tensor may be needed (by a route step, or for
    X_j by a recomputation of a consumer), and where R_j may run (backward
    stages in X_j's set).  Decision tensors: every X_i, and the saved extras
    S_i of layers with a backward step."""
    n = graph.n
    need: dict = {("X", i): set() for i in range(n)}
    for k, step in enumerate(graph.route):
        if step[0] == "B" and graph.layers[step[1]].saved_extra_bytes:
            need[("S", step[1])] = set()
        for t in graph.needs_map[step]:
            if t in need or t[0] == "S":
                need.setdefault(t, set()).add(k)
    rdom: list[set] = [set() for _ in range(n)]
    for j in range(n - 1, -1, -1):
        x = ("X", j)
        for c in graph.consumers[j]:
            need[x] |= rdom[c]
        if recomputable[j]:
            rdom[j] = {k for k in need[x] if k >= n}
    return need, rdom


def gradient_swaps(graph: Graph) -> dict:
    """The gradients the class may swap: ``t -> (birth, uses, write)`` for
    each gradient buffer ``("G", j)`` one route step makes (``birth``) and
    later steps read (``uses``), where some step between its birth and its
    first in-place write (``write``: an accumulating contribution,
    ``Graph.written``, else its last use; a host copy made before it is
    stale after it) neither makes nor reads it: it
    may be offloaded after its birth step, freed, and prefetched back for
    its next use up to that write.  (A ResNet block input's gradient: made
    by the add's backward, added to by the branch's first layer's.)  Every
    other gradient is fixed memory, as ``liveness`` holds it."""
    route = graph.route
    made: dict = {}
    uses: dict = {}
    for k, step in enumerate(route):
        for t in graph.allocs_map[step]:
            if t[0] == "G":
                made.setdefault(t, []).append(k)
        for t in graph.needs_map[step]:
            if t[0] == "G":
                uses.setdefault(t, []).append(k)
    written = graph.written
    last = graph.last_use
    out: dict = {}
    for t, ks in made.items():
        if len(ks) != 1 or not graph.size(t):
            continue
        b = ks[0]
        later = [k for k in uses.get(t, ()) if k > b]
        if not later or len(later) != len(uses.get(t, ())) or last.get(t) != later[-1]:
            continue
        w = next((k for k in later if t in written.get(route[k], ())), later[-1])
        if any(c > a + 1 for a, c in zip([b] + later, later) if c <= w):
            out[t] = (b, later, w)
    return out


def build(graph: Graph, capacity: int, window: int | None = None, sync: bool = True,
          forward_prefetch: bool = True, cutoff: float | None = None) -> Formulation:
    """The MILP of ``graph`` under ``capacity`` bytes.  ``window`` (stages) limits
    a prefetch to the ``window`` stages before a use (None: any stage);
    ``sync=False`` leaves out prefetches waited for in their own stage (a
    smaller model whose solutions are solutions of the full one).
    ``cutoff`` (ms of the route, optimizer step excluded): only plans at most
    this fast are of interest; it is the makespan's upper bound, and every
    time column's (so the big-M of the time rows, :mod:`.timing`, shrink to
    it): the model is then infeasible when no plan of the class reaches it."""
    g = graph
    n, route = g.n, g.route
    K = len(route)
    m = Milp()
    f = Formulation(g, capacity, m)
    recomputable = [layer.kind != "data" for layer in g.layers]
    need, rdom = demand(g, recomputable)
    f.birth = {t: t[1] for t in need}
    write: dict = {}   # swappable gradient -> the stage of its first in-place write
    for t, (b, uses, w) in gradient_swaps(g).items():
        need[t] = set(uses)
        f.birth[t] = b
        f.grads.add(t)
        write[t] = w
    f.tensors = tensors = sorted(need, key=lambda t: (f.birth[t], t[0] != "X", t))
    last = {t: max(need[t]) if need[t] else t[1] for t in tensors}
    dev = g.trace.device
    d2h_ms, h2d_ms = 1e3 / dev.d2h_Bps, 1e3 / dev.h2d_Bps
    size = {t: g.size(t) for t in tensors}

    # fixed memory: gradients (and saved extras of layers without backward) as liveness holds them
    born: dict = {}
    for k, step in enumerate(route):
        for t in g.allocs_map[step]:
            if t not in need:
                born.setdefault(t, k)
    fixed_delta = [0] * (K + 1)
    f.fixed_free = [[] for _ in range(K)]
    for t, k0 in born.items():
        k1 = g.last_use[t]
        fixed_delta[k0 + 1] += g.size(t)
        fixed_delta[k1 + 1] -= g.size(t)
        f.fixed_free[k1].append(t)
    for k, step in enumerate(route):   # set-to-none: parameter gradients from their step on
        fixed_delta[k + 1] += g.param_grad_bytes(step)
    level = 0
    for k in range(K):
        level += fixed_delta[k]
        f.fixed_start.append(level)
    f.step_alloc = [g.step_bytes(s) - sum(g.size(t) for t in g.needs_map[s])
                    + g.param_grad_bytes(s) for s in route]
    for j in range(n):
        layer = g.layers[j]
        extra = layer.saved_extra_bytes if ("S", j) not in need else 0
        f.r_bytes[j] = layer.output_bytes + extra
        f.r_algo[j] = min(range(max(1, len(layer.workspace))),
                          key=lambda a: (g.workspace_bytes(("R", j), a), g.step_ms(("R", j), a)))

    # columns
    for t in tensors:
        i = f.birth[t]
        for k in range(i + 1, last[t] + 1):
            f.S[k, t] = m.var()
        if t in f.grads:
            # offloaded after its birth step, prefetched for a use up to its
            # first in-place write (after it the host copy is stale)
            uses = sorted(need[t])
            f.O[t] = m.var()
            f.first_free[t] = i
            for a, u in zip([i] + uses, uses):
                if u > write[t]:
                    break
                if u == a + 1:
                    continue
                for k in range(a + 1, u + 1):
                    if (sync or u > k) and (window is None or u <= k + window):
                        f.P[k, t] = m.var()
                        f.P_wait[k, t] = u
            continue
        if t[0] == "X":
            for k in sorted(rdom[i]):
                f.R[k, i] = m.var()
        fwd = sorted(k for k in need[t] if k < n)
        lf = max([i] + fwd)
        f.last_fwd[t] = lf
        later = [k for k in need[t] if k > lf and k >= n]
        # forward gaps: t is not needed between two forward uses (a residual
        # block's input between the block's first layer and its add): it may
        # be offloaded, freed and prefetched back for the later use
        gaps = [(a, b) for a, b in zip([i] + fwd, fwd) if b > a + 1] if forward_prefetch else []
        if (later or gaps) and i < n - 1:
            f.O[t] = m.var()
            if gaps:
                f.first_free[t] = i
            stages = [k for a, b in gaps for k in range(a + 1, b + 1)]
            stages += list(range(n, max(later) + 1)) if later else []
            for k in stages:
                u = min(x for x in need[t] if x >= k)
                if (sync or u > k) and (window is None or u <= k + window):
                    f.P[k, t] = m.var()
                    f.P_wait[k, t] = u
    for k, step in enumerate(route):
        ws = g.layers[step[1]].workspace
        if len(ws) > 1:
            f.A[k] = [(m.var(), a) for a in range(len(ws))]
            m.row({v: 1.0 for v, _ in f.A[k]}, 1.0, 1.0)
    horizon = sum(max(g.step_ms(s, a) for a in range(max(1, len(g.layers[s[1]].workspace))))
                  for s in route)
    horizon += sum(g.layers[j].fwd_ms * len(rdom[j]) for j in range(n))
    horizon += sum(size[t] for t in f.O) * (d2h_ms + h2d_ms) + 1.0
    if cutoff is not None and math.isfinite(cutoff):
        horizon = min(horizon, max(0.0, cutoff))
    # stage k starts no earlier than every step before it at its fastest, and
    # no later than the horizon less every step from it on (the compute
    # stream runs them in order): bounds of the least solution, so valid
    fast = [min(g.step_ms(s, a) for a in range(max(1, len(g.layers[s[1]].workspace))))
            for s in route]
    f.early = [0.0]
    for c in fast:
        f.early.append(f.early[-1] + c)
    f.late = [horizon - (f.early[K] - f.early[k]) for k in range(K + 1)]
    f.T = [m.var(f.early[k], max(f.early[k], f.late[k]) if k else 0.0, integer=False)
           for k in range(K + 1)]
    f.Z = m.var(f.early[K], max(f.early[K], horizon), cost=1.0, integer=False)
    if f.early[K] > horizon:   # no plan reaches the cutoff: an infeasible row
        m.row({f.Z: 1.0}, hi=horizon)

    # residency
    for (k, t), s in f.S.items():
        if k == f.birth[t] + 1:
            continue
        prev = {s: 1.0, f.S[k - 1, t]: -1.0}
        if t[0] == "X":
            add(prev, f.R.get((k - 1, t[1])), -1.0)
        add(prev, f.P.get((k - 1, t)), -1.0)
        m.row(prev, hi=0.0)
    def usable(k: int, t) -> dict:
        """t is resident for stage k's computations: kept, recomputed, or fetched now."""
        terms = {f.S[k, t]: 1.0}
        if t[0] == "X":
            add(terms, f.R.get((k, t[1])), 1.0)
        if f.P_wait.get((k, t)) == k:
            add(terms, f.P[k, t], 1.0)
        return terms

    # in flight: flight[k2, t] = the prefetches of t issued before stage k2 and
    # waited for at its next use u >= k2 (a running sum over the issue stages
    # before u); t is on the device meanwhile, so not freed
    groups: dict = {}
    for (k, t) in f.P:
        u = f.P_wait[k, t]
        if u > k:
            groups.setdefault((t, u), []).append(k)
    flight: dict = {}
    for (t, u), ks in groups.items():
        prev = None
        for k2 in range(min(ks) + 1, u + 1):
            c = m.var(0.0, 1.0, integer=False)
            terms = {c: 1.0}
            add(terms, prev, -1.0)
            add(terms, f.P.get((k2 - 1, t)) if k2 - 1 in ks else None, -1.0)
            m.row(terms, 0.0, 0.0)
            m.row({f.S[k2, t]: 1.0, c: -1.0}, lo=0.0)
            flight[k2, t] = prev = c
    for (k, i), r in f.R.items():
        x = ("X", i)
        m.row({r: 1.0, f.S[k, x]: 1.0, **({f.P[k, x]: 1.0} if (k, x) in f.P else {})}, hi=1.0)
        for j in dict.fromkeys(g.layers[i].inputs):
            t = {r: 1.0}
            for v, c in usable(k, ("X", j)).items():
                add(t, v, -c)
            m.row(t, hi=0.0)
        xs = ("S", i)
        if (k, xs) in f.S:   # a recomputation keeps its saved extras resident, not in flight
            m.row({r: 1.0, f.S[k, xs]: -1.0}, hi=0.0)
            if (k + 1, xs) in flight:
                m.row({r: 1.0, flight[k + 1, xs]: 1.0}, hi=1.0)
    for (k, t), p in f.P.items():
        if t[0] != "X" or (k, t[1]) not in f.R:
            m.row({p: 1.0, f.S[k, t]: 1.0}, hi=1.0)
        m.row({p: 1.0, f.O[t]: -1.0}, hi=0.0)
    for k, step in enumerate(route):
        for t in g.needs_map[step]:
            if t in need:
                m.row(usable(k, t), lo=1.0)

    # memory: the level of each op that can set the peak
    at_stage: dict[int, list] = {}
    for (k, t), s in f.S.items():
        at_stage.setdefault(k, []).append((s, size[t]))
    r_at: dict[int, list] = {}
    for (k, j), r in sorted(f.R.items()):
        r_at.setdefault(k, []).append((j, r))
    p_at: dict[int, list] = {}
    for (k, t), p in sorted(f.P.items(), key=lambda kv: order_key(f, *kv[0])):
        p_at.setdefault(k, []).append((t, p))
    static = g.trace.static_bytes
    prefetches = None   # tensor -> [(stage, column)] of its prefetches, made where needed
    for k, step in enumerate(route):
        base = {v: b / MiB for v, b in at_stage.get(k, [])}
        for t, p in p_at.get(k, []):
            add(base, p, size[t] / MiB)
        fixed = (static + f.fixed_start[k]) / MiB
        if r_at.get(k):
            # every recomputation's level (the step's row does not bound it: what
            # only recomputations need is freed before the step), through a
            # running level U (Checkmate's U matrix) to keep the rows short
            U = m.var(0.0, math.inf, integer=False)
            terms = {U: 1.0}
            for v, c in base.items():
                add(terms, v, -c)
            m.row(terms, 0.0, 0.0)
            for j, r in r_at[k]:
                add(base, r, f.r_bytes[j] / MiB)
                U2 = m.var(0.0, math.inf, integer=False)
                m.row({U2: 1.0, U: -1.0, r: -f.r_bytes[j] / MiB}, 0.0, 0.0)
                U = U2
                ws = g.workspace_bytes(("R", j), f.r_algo[j])
                m.row({U: 1.0, r: ws / MiB}, hi=capacity / MiB - fixed)
        if k >= n:
            # backward: what the step does not need and the next stage does not
            # keep is freed before the step (after the recomputations); a
            # swappable gradient is freed at the stage's end (after waiting for
            # its offload), so it counts while resident; one the step makes is
            # in step_alloc
            needed = set(g.needs_map[step])
            t = {}
            for x in tensors:
                if x in needed:
                    for v in (f.S.get((k, x)), f.P.get((k, x)),
                              f.R.get((k, x[1])) if x[0] == "X" else None):
                        add(t, v, size[x] / MiB)
                elif x in f.grads:
                    if f.birth[x] != k:
                        add(t, f.S.get((k, x)), size[x] / MiB)
                        add(t, f.P.get((k, x)), size[x] / MiB)
                else:
                    add(t, f.S.get((k + 1, x)), size[x] / MiB)
        else:
            t = dict(base)
        alloc = f.step_alloc[k]
        const = fixed + alloc / MiB
        if k in f.A:   # the larger of the two where the step's algorithm is a choice
            for v, a in f.A[k]:
                own, released = step_peaks(g, step, a, alloc)
                add(t, v, (own if released is None else max(own, released)) / MiB - alloc / MiB)
        else:
            own, released = step_peaks(g, step, 0, alloc)
            if released is None or released >= own:
                const += ((own if released is None else released) - alloc) / MiB
            else:
                # a decoded plan frees the dying reads right after the step, so it
                # hands them over (the lower peak) unless one's latest copy is an
                # offload: y = 1 there, the step's own peak (the ledger's rule)
                const += (released - alloc) / MiB
                y = m.var(0.0, 1.0, integer=False)
                add(t, y, (own - released) / MiB)
                if prefetches is None:
                    prefetches = {}
                    for (j, x), v in f.P.items():
                        prefetches.setdefault(x, []).append((j, v))
                for x in sorted(g.dying[step]):
                    if x in f.O:   # y >= O[x] - its prefetches up to stage k
                        terms = {y: 1.0, f.O[x]: -1.0}
                        for j, v in prefetches.get(x, ()):
                            if j <= k:
                                add(terms, v, 1.0)
                        m.row(terms, lo=0.0)
        m.row(t, hi=capacity / MiB - const)

    time_rows(f, r_at, p_at, horizon)
    return f


def step_peaks(g: Graph, step, algo: int, alloc: int) -> tuple[int, int | None]:
    """A route step's peak above the level before it, as the ledger counts it
    (``ledger.workspace``; ``alloc``: what the step allocates): (with its own
    allocation and workspace, where its dying reads are handed to autograd or
    None).  The second is the trace's measured ``bwd_released`` less the
    parameter gradients the step makes, for a backward step with dying reads
    on a measured trace: the ledger counts it where the plan frees them right
    after the step and none's latest copy is an offload.  (A transposed-linear
    model's MILP plan at 1.2x the lower bound peaked 132 B above the first, 27
    B over its budget, when the row counted the first alone; an attention
    model's class was empty at 1.0x-1.2x, its second 81,920 B against
    262,144.)"""
    own = alloc + g.workspace_bytes(step, algo)
    released = g.bwd_released(step, algo)
    if released is None or not g.dying.get(step):
        return own, None
    return own, released - g.param_grad_bytes(step)


def warm_start(small: Formulation, values: list[float], full: Formulation
               ) -> tuple[list[int], list[float]]:
    """The binaries of a solution of ``small`` as a (partial) start for ``full``."""
    idx, val = [], []
    for name in ("S", "R", "P", "O"):
        a, b = getattr(small, name), getattr(full, name)
        for key, v in a.items():
            if key in b:
                idx.append(b[key])
                val.append(round(values[v]))
    for k, pairs in small.A.items():
        for (v, _), (w, _) in zip(pairs, full.A[k]):
            idx.append(w)
            val.append(round(values[v]))
    return idx, val


def order_key(f: Formulation, k: int, t) -> tuple:
    """Issue order of the prefetches of a stage: the one waited for first first,
    then highest layer first, X first, then by kind."""
    return (k, f.P_wait[k, t], -t[1], t[0] != "X", t[0])

"""The one meaning of a schedule: what each op does to device memory.

Which tensors are on the device after each op does not depend on time: it
follows from the op sequence alone.  :func:`walk` replays a schedule once,
checks every rule of ``verify`` on the way (raising :class:`ScheduleError`
that names the op), and returns one :data:`Effect` per op:

    (alloc_bytes, workspace_bytes, free_bytes)

* ``alloc_bytes``: the bytes of the tensors the op makes resident (a compute
  step's outputs that are not already resident, a prefetch's tensor; a
  backward step's parameter gradients when they are born in backward,
  ``set-to-none``, which stay to the iteration's end);
* ``workspace_bytes``: a compute step's transient workspace, held only for
  its duration (the optimizer step's temporaries; for a backward step that
  hands its dying reads to autograd,
  :func:`hands_over`, what makes ``alloc + workspace`` its measured peak above
  the level before it, which may be negative);
* ``free_bytes``: the bytes a ``Free`` releases (immediately, or when an
  offload of the tensor still copying ends: that part is time, and belongs
  to the interpreter that keeps time).

Every interpreter reads memory through these effects: the verifier
(``walk`` itself), the simulator (adds simpy time, copy engines and waiting
for memory), the planners' replay (:func:`planned_peak`, and
``snsim.policies.replay.estimate_ms``, which adds the same time rules without
simpy).  A new op kind or a new aliasing rule (a tensor that shares another
one's storage) is written here once.
"""

from __future__ import annotations

import gc
from itertools import islice
from typing import Sequence
from weakref import WeakKeyDictionary

from snsim.errors import ScheduleError
from snsim.graph import Graph, step_name, tensor_name
from snsim.schedule.ops import (RELEASE, TO_DEVICE, TO_HOST, Compute, Free, Offload, Op,
                                Prefetch, Schedule, Wait)

ABSENT, RESIDENT, INBOUND = 0, 1, 2

Effect = tuple  # (alloc_bytes: int, workspace_bytes: int, free_bytes: int)
_NONE: Effect = (0, 0, 0)

_SHARED: WeakKeyDictionary = WeakKeyDictionary()   # graph -> shared_effects(graph)


def shared_effects(graph: Graph) -> tuple[dict, dict]:
    """The effects that recur in every walk of ``graph``, one tuple each, made once
    per graph: a ``Free``'s ``(0, 0, size)`` per tensor; per phase (``F``, ``R``,
    ``B``), each layer's step that allocates all of its outputs (none resident
    yet) with its first algorithm's plain workspace (``Graph.plain_workspace``;
    None where the workspace is worked out from the ops around the step).

    A walk appends these instead of a new tuple per op: a deep trace's plan has
    ~10^5 ops, and its new tuples were memory written once per walk and then
    visited by the cyclic collector's first pass after the point (to untrack
    them), a cost that grew faster than the trace (2.5-3x per doubling at 16k
    to 32k layers) once the walk's data outgrew the CPU caches.
    """
    got = _SHARED.get(graph)
    if got is None:
        # one tuple per distinct value (a deep network repeats a few shapes: fewer,
        # hotter objects for the walks to read)
        same: dict = {}
        frees = {t: same.setdefault((0, 0, s), (0, 0, s)) for t, s in graph.sizes.items()}
        all_bytes, plain = graph.alloc_bytes_table, graph.plain_workspace
        born = graph.born_bytes if graph.grads_born else None
        steps: dict = {}
        for phase in graph.step_tables:
            nb, ws = all_bytes[phase], plain[phase]
            grads = born if born and phase == "B" else [0] * len(nb)
            steps[phase] = [None if b is None or w is None
                            else same.setdefault((b + g, w, 0), (b + g, w, 0))
                            for b, w, g in zip(nb, ws, grads)]
        got = _SHARED[graph] = (frees, steps)
    return got


def walk(graph: Graph, ops: Sequence[Op], policy: str = "?", route: bool = True,
         check: bool = True) -> list[Effect]:
    """The memory effect of every op of ``ops``; :class:`ScheduleError` on a broken rule.

    With ``route`` (a whole schedule) the route steps must all appear, in
    order; planners replaying a partial op list pass ``route=False``.
    ``check=False`` skips the rules (a planner replaying its own candidate
    many times; the verifier checks the plan it returns) but not the
    residency that decides the bytes.
    """
    # ~10^5 small tuples and no reference cycles: the cyclic collector's passes
    # over the (large) graph would cost more than the walk itself
    was = gc.isenabled()
    gc.disable()
    try:
        return _bytes_only(graph, ops) if not check else _walk(graph, ops, policy, route)
    finally:
        if was:
            gc.enable()


def _walk(graph: Graph, ops: Sequence[Op], policy: str, route: bool) -> list[Effect]:
    # Residency as two sets (resident; prefetched, not yet waited for): the common
    # case of each rule is one set operation in C (all needs resident; no alloc
    # resident or in flight), the per-tensor loop runs only to word a failure or
    # for a step that re-makes a resident tensor.  Where a tensor was freed is
    # looked up only to word a failure (:func:`_freed_at`).  The op kinds are
    # tested by frequency (frees, then computes); a compute step's tables (needs,
    # allocs, their bytes, plain workspace) are one lookup per phase.
    resident: set = set()
    inbound: set = set()
    host: set = set()         # tensors with a host copy (offload issued)
    stale: dict = {}          # tensor -> the step that wrote into it since its copy
    written = graph.written
    steps = graph.route
    n_steps = len(steps)
    needs_map, allocs_map = graph.needs_map, graph.allocs_map
    sizes = graph.sizes
    layers = graph.layers
    remade = graph.multi_result
    born = graph.born_bytes if graph.grads_born else None   # param_grad_bytes, inline
    in_place = graph.in_place_of
    plain = graph.plain_workspace
    all_bytes = graph.alloc_bytes_table
    free_fx, step_fx = shared_effects(graph)
    per_phase = {phase: (needs, allocs, all_bytes[phase], plain[phase], len(needs),
                         step_fx[phase])
                 for phase, (needs, allocs) in graph.step_tables.items()}
    pos = 0
    out: list[Effect] = []
    append = out.append

    def fail(k: int, msg: str):
        raise ScheduleError(f"schedule of {policy}: op {k} ({ops[k]}): {msg}")

    optimized = None          # op index of the optimizer step, once it ran
    for op in ops:   # op k's effect is out[k]: k is len(out), read where needed
        tp = type(op)
        if tp is Free:
            t = op.tensor
            try:
                resident.remove(t)   # one lookup: the rule and the free
            except KeyError:
                at = _freed_at(ops, len(out), t)
                fail(len(out), f"frees {tensor_name(t)}, which it does not hold"
                     + (f" (freed at op {at})" if at is not None else ""))
            append(free_fx[t])
        elif tp is Compute:
            phase, i = op.phase, op.layer
            if optimized is not None:
                fail(len(out), f"computes after the optimizer step (op {optimized}): the "
                     "optimizer step ends the iteration")
            if phase == "O":
                step = (phase, i)
                if step != graph.optimizer_step:
                    fail(len(out), "no optimizer step in this trace" if graph.optimizer_step is None
                         else f"the optimizer step is {step_name(graph.optimizer_step)}")
                if route and pos != n_steps:
                    fail(len(out), f"optimizer step before route step {step_name(steps[pos])}")
                optimized = len(out)
                append((0, graph.workspace_bytes(step), 0))
                continue
            table = per_phase.get(phase)
            if table is not None and type(i) is int and 0 <= i < table[4]:
                needs, allocs = table[0][i], table[1][i]
                new_bytes = table[2][i]
            else:   # another phase, or a layer index of another type: the maps
                needs, allocs = needs_map.get((phase, i)), allocs_map.get((phase, i))
                new_bytes = None
            if phase == "R":
                if needs is None:
                    fail(len(out), "unknown step")
                if layers[i].kind == "data":
                    fail(len(out), "recomputes the data layer: the input is kept or copied back "
                         "from the host, never recomputed")
            elif phase == "F" or phase == "B":
                if route:
                    if pos >= n_steps or steps[pos] != (phase, i):
                        want = step_name(steps[pos]) if pos < n_steps else "nothing"
                        fail(len(out), f"route step out of order: expected {want}")
                    pos += 1
                elif needs is None:
                    fail(len(out), "unknown step")
            else:
                fail(len(out), "unknown step")
            algo = op.algo
            if algo and not 0 <= algo < len(layers[i].workspace):
                fail(len(out), f"layer has no workspace algorithm {algo}")
            if not resident.issuperset(needs):
                for t in needs:
                    if t not in resident:
                        if t in inbound:
                            fail(len(out), f"needs {tensor_name(t)}, prefetched but not waited for")
                        at = _freed_at(ops, len(out), t)
                        if at is not None:
                            fail(len(out), f"uses {tensor_name(t)} after it was freed at op {at}")
                        fail(len(out), f"needs {tensor_name(t)}, which is not resident")
            if phase == "B" and written:
                for t in written.get((phase, i), ()):   # written into in place
                    if t in host:
                        stale[t] = (phase, i)
            if resident.isdisjoint(allocs) and (not inbound or inbound.isdisjoint(allocs)):
                resident.update(allocs)
                if new_bytes is not None and not algo:
                    fx = table[5][i]   # all made fresh, the plain workspace: shared
                    if fx is not None:
                        append(fx)
                        continue
                nbytes = sum(map(sizes.__getitem__, allocs)) if new_bytes is None else new_bytes
            else:
                nbytes = 0
                for t in allocs:
                    if t in inbound:
                        fail(len(out), f"allocates {tensor_name(t)} while it is being prefetched")
                    if t not in resident:
                        resident.add(t)
                        nbytes += sizes[t]
                    elif t[0] != "S" and not (phase == "R" and i in remade):
                        fail(len(out), f"allocates {tensor_name(t)}, which is already resident")
                    # a resident S (saved extras re-made by a recompute), or a resident
                    # result of an op with several (its recompute returns them all), is
                    # overwritten in place
            # the first algorithm's plain workspace read from a table; else worked out
            w = table[3][i] if not algo else None
            if w is None:
                w = workspace(graph, ops, len(out), nbytes, host) \
                    if layers[i].workspace or i in in_place else 0
            if born and phase == "B":
                nbytes += born[i]
            append((nbytes, w, 0))
        elif tp is Offload:
            t = op.tensor
            if t not in resident:
                fail(len(out), f"offloads {tensor_name(t)}, which is not resident")
            host.add(t)
            stale.pop(t, None)
            append(_NONE)
        elif tp is Prefetch:
            t = op.tensor
            if t not in host:
                fail(len(out), f"prefetches {tensor_name(t)}, which has no host copy")
            if t in stale:
                fail(len(out), f"prefetches {tensor_name(t)}, whose host copy is older than "
                     f"{step_name(stale[t])}'s write into it (offload it again after that)")
            if t in resident or t in inbound:
                fail(len(out), f"prefetches {tensor_name(t)}, which is already on the device")
            inbound.add(t)
            append((sizes[t], 0, 0))
        elif tp is Wait:
            t = op.tensor
            if t in inbound:
                inbound.remove(t)
                resident.add(t)
            elif not (t in resident and t in host):
                fail(len(out), f"waits for {tensor_name(t)}, which has no copy in flight")
            append(_NONE)
        else:
            fail(len(out), f"unknown operation {type(op).__name__}")
    if route and pos != n_steps:
        raise ScheduleError(f"schedule of {policy}: ends before route step "
                            f"{step_name(steps[pos])}")
    if route and graph.optimizer_step is not None and optimized is None:
        raise ScheduleError(f"schedule of {policy}: ends without the optimizer step "
                            f"{step_name(graph.optimizer_step)}")
    return out


def _freed_at(ops: Sequence[Op], k: int, t) -> int | None:
    """Index of the last ``Free`` of ``t`` before op ``k`` (None if none): for the
    wording of a failure only."""
    for m in range(k - 1, -1, -1):
        op = ops[m]
        if type(op) is Free and op.tensor == t:
            return m
    return None


def _bytes_only(graph: Graph, ops: Sequence[Op]) -> list[Effect]:
    """:func:`walk` without the rules: the same residency, so the same bytes."""
    return list(iter_effects(graph, ops))


def iter_effects(graph: Graph, ops: Sequence[Op], start: int = 0,
                 resident: set | None = None, host: set | None = None):
    """The effects of :func:`walk` with ``check=False``, one op at a time, for a
    reader that may stop early (a plan that does not fit is known at its first
    op over the budget).

    From op ``start`` on, with ``resident`` and ``host`` (updated in place) the
    tensors on the device and those with a host copy before it: a reader
    that resumes, on a plan that shares ``ops[:start + 1]`` with another, a
    walk of that other it stopped at ``start`` (an op that is not a
    ``Free``: an op's effects look ahead only at the run of frees right
    after it, which ends there, so those of the ops before ``start`` are
    the same in both)."""
    resident = set() if resident is None else resident
    host = set() if host is None else host
    add = resident.add
    allocs_of, sizes, layers = graph.allocs_map, graph.sizes, graph.layers
    tables = {phase: table[1] for phase, table in graph.step_tables.items()}
    free_fx, step_fx = shared_effects(graph)
    all_bytes = graph.alloc_bytes_table
    size = sizes.__getitem__
    born = graph.born_bytes if graph.grads_born else None
    in_place = graph.in_place_of
    plain = graph.plain_workspace
    for k, op in enumerate(islice(ops, start, None) if start else ops, start):
        tp = type(op)
        if tp is Compute:
            phase = op.phase
            if phase == "O":
                yield (0, graph.workspace_bytes((phase, op.layer)), 0)
                continue
            i = op.layer
            if type(i) is int and i >= 0:
                allocs, nbytes = tables[phase][i], all_bytes[phase][i]
                if not op.algo and resident.isdisjoint(allocs):
                    fx = step_fx[phase][i]   # all made fresh, the plain workspace: shared
                    if fx is not None:
                        resident.update(allocs)
                        yield fx
                        continue
            else:
                allocs = allocs_of[(phase, i)]
                nbytes = sum(map(size, allocs))
            if resident.isdisjoint(allocs):
                resident.update(allocs)
            else:
                nbytes = 0
                for t in allocs:
                    if t not in resident:
                        add(t)
                        nbytes += sizes[t]
            grads = born[i] if born and phase == "B" else 0
            # the first algorithm's plain workspace read from a table; else worked out
            w = plain[phase][i] if not op.algo else None
            if w is None:
                w = workspace(graph, ops, k, nbytes, host) \
                    if layers[i].workspace or i in in_place else 0
            yield (nbytes + grads, w, 0)
        elif tp is Free:
            t = op.tensor
            resident.discard(t)
            yield free_fx[t]
        elif tp is Prefetch:
            t = op.tensor
            add(t)
            yield (sizes[t], 0, 0)
        else:
            if tp is Offload:
                host.add(op.tensor)
            yield _NONE


def dying_reads(graph: Graph, ops: Sequence[Op], k: int, host=()) -> list:
    """Tensors backward step ``ops[k]`` needs that the run of frees right after it
    releases (offloads of tensors it does not need may come among them): those
    the executor hands to autograd for the step (DESIGN, "Dying reads").  Not
    among them: a tensor whose latest copy is an offload (its free may wait
    for the copy; one copied back and waited for is handed over), the step's
    own output gradient ``G_i`` and a shared parameters' buffer ``P_j``, which
    the step holds throughout."""
    step = ops[k].step
    needs = graph.needs_map[step]
    own = graph.grad_in[step[1]]
    out = []
    for op in ops[k + 1:]:
        if op.action == TO_HOST and op.tensor not in needs:
            continue   # a copy of what the step made (its input gradient) goes first
        if op.action != RELEASE:
            break
        t = op.tensor
        if t in needs and t != own and t[0] != "P" and (t not in host or came_back(ops, k, t)):
            out.append(t)
    return out


def came_back(ops: Sequence[Op], k: int, t) -> bool:
    """Whether tensor ``t``'s last copy before op ``k`` brought it back to the
    device (a prefetch, waited for by then: its free waits for nothing), not
    an offload (whose copy may still be under way)."""
    for j in range(k - 1, -1, -1):
        op = ops[j]
        if op.action == TO_HOST and op.tensor == t:
            return False
        if op.action == TO_DEVICE and op.tensor == t:
            return True
    return False


def in_place_bytes(graph: Graph, ops: Sequence[Op], k: int, nbytes: int, host=()) -> int:
    """Bytes forward (or recompute) step ``ops[k]`` of an in-place layer writes into
    its input's storage instead of allocating (DESIGN 3, "In-place storage"): where
    the layer says it does (``inplace_alias``), the step makes ``X_i`` anew
    (``nbytes`` holds it) and the run of frees right after it releases the input
    ``X_j`` (no host copy: an offload may still be reading it).  0 otherwise."""
    op = ops[k]
    t = graph.in_place_of.get(op.layer)
    if t is None or op.phase == "B" or t in host or nbytes < graph.sizes[("X", op.layer)]:
        return 0
    for m in range(k + 1, len(ops)):   # no slice: ~10^4 in-place layers on deep traces
        nxt = ops[m]
        if nxt.action != RELEASE:
            return 0
        if nxt.tensor == t:
            return graph.alias_bytes(op.layer)
    return 0


def in_place_steps(graph: Graph, ops: Sequence[Op]) -> frozenset:
    """Indices of the ops that run in place (:func:`in_place_bytes` > 0): what the
    executor runs with the layer's in-place kernel."""
    if not graph.in_place_of:
        return frozenset()
    out = []
    host: set = set()
    for k, (op, (nbytes, _, _)) in enumerate(zip(ops, iter_effects(graph, ops))):
        tp = type(op)
        if tp is Offload:
            host.add(op.tensor)
        elif tp is Compute and op.layer in graph.in_place_of \
                and in_place_bytes(graph, ops, k, nbytes, host):
            out.append(k)
    return frozenset(out)


def hands_over(graph: Graph, ops: Sequence[Op], k: int, host=()) -> bool:
    """Does backward step ``ops[k]`` hand its dying reads to autograd?  Only where the
    trace measured that (``bwd_released``) for exactly these dying reads: the ones
    liveness frees after the step."""
    op = ops[k]
    step = op.step
    if graph.bwd_released(step, op.algo) is None:
        return False
    dying = graph.dying.get(step)
    return bool(dying) and set(dying_reads(graph, ops, k, host)) == dying


def workspace(graph: Graph, ops: Sequence[Op], k: int, nbytes: int, host=()) -> int:
    """Workspace of compute step ``ops[k]`` that allocates ``nbytes``; for a backward
    step that hands its dying reads to autograd, what makes ``alloc + workspace`` its
    measured peak above the level before it (possibly negative: autograd frees
    what the step read as its nodes run); for an in-place step writing into its
    dying input, less that input's bytes (:func:`in_place_bytes`)."""
    op = ops[k]
    step = (op.phase, op.layer)
    if op.phase == "B":
        if hands_over(graph, ops, k, host):
            # the measured peak holds the step's gradients born in backward (set-to-none)
            return graph.bwd_released(step, op.algo) - nbytes - graph.param_grad_bytes(step)
        return graph.workspace_bytes(step, op.algo)
    return graph.workspace_bytes(step, op.algo) - in_place_bytes(graph, ops, k, nbytes, host)


def effects(graph: Graph, schedule: Schedule) -> list[Effect]:
    """:func:`walk` of a whole schedule, computed once per (graph, schedule)."""
    cached = schedule.checked
    if cached is not None and cached[0] is graph and cached[1] == len(schedule.ops):
        return cached[2]
    # an infeasible plan may stop where it failed: its ops are a prefix of the route
    out = walk(graph, schedule.ops, schedule.policy, route=schedule.infeasible_reason is None)
    schedule.checked = (graph, len(schedule.ops), out)
    return out


def peak_of(graph: Graph, fx: Sequence[Effect], capacity: int | None = None
            ) -> tuple[int, int | None]:
    """Peak level of a plan's effects (a walk's output) counting every free as
    immediate, and the index of the first effect whose level does not fit
    ``capacity`` (None if all fit)."""
    level = peak = graph.trace.static_bytes
    first = None
    for k, (nbytes, ws, freed) in enumerate(fx):
        level += nbytes - freed
        top = level + ws
        if top > peak:
            peak = top
        if capacity is not None and first is None and top > capacity:
            first = k
    return peak, first


def planned_peak(graph: Graph, ops: Sequence[Op], capacity: int | None = None
                 ) -> tuple[int, int | None]:
    """:func:`peak_of` the effects of ``ops`` (walked without the rules)."""
    return peak_of(graph, walk(graph, ops, route=False, check=False), capacity)


def fits(graph: Graph, ops: Sequence[Op], capacity: int) -> bool:
    """Does every op of ``ops`` fit ``capacity``, counting every free as immediate
    (``planned_peak(graph, ops, capacity)[1] is None``, stopping at the first op
    that does not)?"""
    level = graph.trace.static_bytes
    was = gc.isenabled()
    gc.disable()
    try:
        for nbytes, ws, freed in iter_effects(graph, ops):
            level += nbytes - freed
            if level + ws > capacity:
                return False
        return True
    finally:
        if was:
            gc.enable()

"""The simulator's memory and time rules replayed without simpy, for planners
that choose between plans (a policy never imports the simulator).

Memory per op is the ledger's (:mod:`snsim.schedule.ledger`); this module
adds the copy engines' and the compute stream's time.  A helper of the
policies, not a policy (the registry skips it).

Note 1 (frees and the budget).  The simulator releases a freed tensor whose
offload is still copying when the copy ends, and an allocation that does not
fit waits for such frees.  A planner may therefore count every ``Free`` as
immediate: whatever fits in the planner's count fits in the simulator once
the copies under way have ended (the wait is a stall, not a failure).

Note 2 (the optimizer step).  Planners plan the route; ``policies.plan``
appends the optimizer step (DESIGN 3a).  Its temporaries, and the parameter
gradients backward steps make under ``set-to-none`` (the ledger's effects),
are part of every estimate here, so a plan these call fitting is one the
simulator finds fitting.

Note 3 (stopping early).  A planner that only asks whether a plan is faster
than a known time need not replay all of it: the clock moves by each compute
step's time and by waits, never back, so the makespan is at least the plan's
compute time plus the waiting so far.  Once that exceeds the time asked about
(by more than rounding can account for), the answer is known.

Note 4 (replaying from a prefix).  A polish (:mod:`.polish`) estimates many
plans that each change one place of the same plan, most of them in
backward: replayed whole, each walked the ~90% of the plan it shares with
the others again (ResNet-50 b16 at 1.10x the lower bound, superneurons'
swaps refined: 1,309 estimates, 1.8 of 2.2 s).  :class:`Resumable` keeps
the replay's state along the plan and starts each from the last one kept
before the first op that differs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from itertools import compress, count, islice, repeat
from operator import is_

from snsim.graph import Graph, Step, tensor_name
from snsim.schedule import ledger
from snsim.schedule.ops import COMPUTE, RELEASE, SYNC, TO_DEVICE, TO_HOST, Compute, Op, Schedule
from snsim.units import fmt_bytes



def with_optimizer_step(graph: Graph, ops: list[Op]) -> list[Op]:
    """``ops`` ending with the trace's optimizer step, as every plan ends (note 2)."""
    step = graph.optimizer_step
    if step is None or (ops and ops[-1] == Compute(step[0], step[1])):
        return ops
    return ops + [Compute(step[0], step[1])]


def planned_peak(graph: Graph, ops: list[Op], capacity: int | None = None
                 ) -> tuple[int, str | None]:
    """Peak level of ``ops`` counting frees as immediate (note 1), and why the
    first op that does not fit ``capacity`` does not (None if all fit); the
    optimizer step the plan will end with is counted (note 2)."""
    ops = with_optimizer_step(graph, ops)
    peak, first = ledger.planned_peak(graph, ops, capacity)
    if first is None:
        return peak, None
    op = ops[first]
    if type(op) is Compute:
        level = ledger.planned_peak(graph, ops[:first + 1])[0]
        return peak, shortfall(graph, op.step, level - capacity, capacity)
    return peak, (f"prefetch of {tensor_name(op.tensor)} does not fit the "
                  f"{fmt_bytes(capacity)} budget")


def fits(graph: Graph, ops: list[Op], capacity: int) -> bool:
    """``planned_peak(graph, ops, capacity)[1] is None``, stopping at the first op
    that does not fit; the optimizer step the plan will end with is counted (note 2)."""
    return ledger.fits(graph, with_optimizer_step(graph, ops), capacity)


def schedule_fits(graph: Graph, schedule: Schedule, capacity: int) -> bool:
    """:func:`fits` of ``schedule``'s ops, read from the checked walk its planner
    kept on it where it has one (no optimizer step to add), else walked."""
    got = schedule.checked
    if (got is not None and got[0] is graph and got[1] == len(schedule.ops)
            and graph.optimizer_step is None):
        return ledger.peak_of(graph, got[2], capacity)[1] is None
    return fits(graph, schedule.ops, capacity)


def shortfall(graph: Graph, step: Step, short: int, capacity: int) -> str:
    return (f"step {graph.step_label(step)} is {short} bytes "
            f"({fmt_bytes(short)}) short of the {fmt_bytes(capacity)} budget")


def estimate_ms(graph: Graph, ops: list[Op], capacity: int, limit: float = math.inf) -> float:
    """Makespan of ``ops`` under the simulator's rules (DESIGN section 2,
    "Time"), without simpy; ``inf`` when an allocation can never fit.  Memory
    per op is the ledger's (:func:`snsim.schedule.ledger.walk`); the optimizer
    step the plan will end with is counted (note 2).

    With a finite ``limit``: a makespan of at most ``limit`` is returned
    exactly; a larger one may be cut short (note 3), and what is returned
    then is above ``limit`` and, up to rounding, a lower bound of it."""
    return _run(graph, with_optimizer_step(graph, ops), capacity, limit, None, None)


class Resumable:
    """:func:`estimate_ms` of plans that differ from one ``base`` plan only
    from some op on (a polish's moves: note 4).  The base is replayed once,
    keeping the replay's state before every ``EVERY``-th op or so (at a
    compute, never a free); a plan is then replayed from the last state kept
    before its first op that differs from the base.  The same arithmetic in
    the same order as a whole replay, so the same figure; only a plan cut
    short (note 3) may read another figure above ``limit``."""

    EVERY = 32

    def __init__(self, graph: Graph, base: list[Op], capacity: int) -> None:
        self.graph, self.capacity = graph, capacity
        self.base = with_optimizer_step(graph, base)
        self.states: list = []
        self.ms = _run(graph, self.base, capacity, math.inf, None, self.states)
        self.at = [st[0] for st in self.states]

    def estimate(self, ops: list[Op], limit: float = math.inf) -> float:
        ops = with_optimizer_step(self.graph, ops)
        # a state kept before the first differing op, not at it: an op's
        # effects look ahead at the frees right after it, up to the op a
        # state is kept at, which must then be the same in both plans
        k = bisect.bisect_left(self.at, common_prefix(self.base, ops)) - 1
        return _run(self.graph, ops, self.capacity, limit,
                    self.states[k] if k >= 0 else None, None)


def common_prefix(a: list, b: list) -> int:
    """How many first items ``a`` and ``b`` share (a bisection over slices
    compared in C: plans share long prefixes of the very same op objects)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _run(graph: Graph, ops: list[Op], capacity: int, limit: float, state, states) -> float:
    """:func:`estimate_ms` of ``ops`` (the optimizer step included), from
    ``state`` (a state :class:`Resumable` kept; None: from the start),
    appending states to ``states`` where it is a list."""
    size = graph.sizes
    fwd_ms, bwd_ms = graph.plain_ms["F"], graph.plain_ms["B"]
    dev = graph.trace.device
    d2h_ms, h2d_ms = 1e3 / dev.d2h_Bps, 1e3 / dev.h2d_Bps
    if state is None:
        start, now, d2h, h2d, level, waited, busy0 = 0, 0.0, 0.0, 0.0, graph.trace.static_bytes, \
            0.0, 0.0
        off_done: dict = {}
        in_done: dict = {}
        pending: list = []   # (time, bytes) of frees under way
        resident: set = set()
        host: set = set()
    else:
        start, now, d2h, h2d, level, waited, busy0, off_done, in_done, pending, resident, host = \
            state
        off_done, in_done, pending = dict(off_done), dict(in_done), list(pending)
        resident, host = set(resident), set(host)
    heappop = heapq.heappop
    # note 3: the plan's compute time, and how much waiting makes the makespan
    # exceed ``limit`` (a relative margin far above the sums' rounding)
    busy = _compute_ms(graph, ops, start, busy0) if limit < math.inf else 0.0
    slack = limit + 1e-6 * (abs(limit) + 1.0) - busy
    if waited > slack:
        return busy + waited   # over ``limit`` before ``start`` already (note 3)
    keep_at = start if states is not None else len(ops)   # the next state kept
    done_ms = busy0   # the compute time of the ops before k, for the states kept

    def fit(need: int) -> bool:
        nonlocal now, level, waited
        while pending and pending[0][0] <= now:
            level -= heappop(pending)[1]
        while level + need > capacity:
            if not pending:
                return False
            t, b = heappop(pending)
            if t > now:
                waited += t - now
                now = t
            level -= b
        return True

    # effects one op at a time: a plan that does not fit stops at its first op over
    # (each taken after the state before its op is kept: the walk updates
    # ``resident`` and ``host`` as it yields)
    effect = ledger.iter_effects(graph, ops, start, resident, host).__next__
    for k, op in zip(count(start), islice(ops, start, None)):
        act = op.action
        if act == COMPUTE:
            if k >= keep_at:
                states.append((k, now, d2h, h2d, level, waited, done_ms, dict(off_done),
                               dict(in_done), list(pending), set(resident), set(host)))
                keep_at = k + Resumable.EVERY
            nb, ws, _ = effect()
            if level + nb + ws > capacity and not fit(nb + ws):
                return math.inf
            level += nb
            phase = op.phase
            if op.algo or phase == "O":
                step = graph.step_ms(op.step, op.algo)
            else:
                step = (bwd_ms if phase == "B" else fwd_ms)[op.layer]
            now += step
            if states is not None:
                done_ms += step
        elif act == RELEASE:
            freed = effect()[2]
            if off_done:
                done = off_done.get(op.tensor, 0.0)
                if done > now:
                    heapq.heappush(pending, (done, freed))
                    continue
            level -= freed
        elif act == TO_HOST:
            effect()
            d2h = max(d2h, now) + size[op.tensor] * d2h_ms
            off_done[op.tensor] = d2h
        elif act == TO_DEVICE:
            nb = effect()[0]
            t = op.tensor
            if level + nb > capacity and not fit(nb):
                return math.inf
            level += nb
            h2d = max(h2d, now, off_done.get(t, 0.0)) + nb * h2d_ms
            in_done[t] = h2d
        elif act == SYNC:
            effect()
            t = op.tensor
            done = in_done.pop(t, None)
            if done is None:
                done = off_done.get(t, 0.0)
            if done > now:
                waited += done - now
                now = done
                if waited > slack:   # over ``limit`` whatever follows (note 3)
                    return busy + waited
    return max(now, d2h, h2d)


def _compute_ms(graph: Graph, ops: list[Op], start: int = 0, total: float = 0.0) -> float:
    """The compute steps' time of ``ops`` from op ``start`` on, each with its
    algorithm, added to ``total`` (those before it: note 3)."""
    fwd_ms, bwd_ms = graph.plain_ms["F"], graph.plain_ms["B"]
    step_ms = graph.step_ms
    if start:
        ops = ops[start:]
    for op in compress(ops, map(is_, map(type, ops), repeat(Compute))):   # picked in C
        phase = op.phase
        if op.algo or phase == "O":
            total += step_ms(op.step, op.algo)
        else:
            total += (bwd_ms if phase == "B" else fwd_ms)[op.layer]
    return total

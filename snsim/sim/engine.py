"""Discrete-event replay of a schedule (DESIGN.md section 2, "Time").

Three simpy processes share one memory pool:

* the compute stream issues the schedule's ops in order; compute steps take
  their time, copies are handed to the engines, ``Wait`` blocks;
* the host-to-device and device-to-host copy engines each run their copies
  in order, ``bytes / bandwidth`` each.

All allocations are made by the compute stream (the host thread that issues
the ops).  One that does not fit the budget waits for frees already under
way (an offload finishing, see ``ops.Free``); if none is under way, the run
ends infeasible with the step and the shortfall.

What each op does to memory (which tensors it makes resident, how many bytes
it allocates, frees or holds as workspace) comes from the ledger
(:mod:`snsim.schedule.ledger`), which also checks the schedule's rules; this
module adds time.
"""

from __future__ import annotations

import gc
from collections import deque

from snsim.graph import Graph, tensor_name
from snsim.schedule.ledger import effects
from snsim.schedule.ops import COMPUTE, RELEASE, SYNC, TO_DEVICE, TO_HOST, Compute, Schedule
from snsim.sim.result import (Interval, IntervalKind, LevelKind, MemoryPoint, SimResult,
                              Stream)
from snsim.units import fmt_bytes


class _Infeasible(Exception):
    pass


class _Queue:
    """A copy engine's FIFO: ``put`` appends and wakes the engine if it is idle
    (waiting on ``idle``); the engine pops without an event while copies are
    queued."""

    __slots__ = ("items", "idle")

    def __init__(self):
        self.items: deque = deque()
        self.idle = None

    def put(self, item) -> None:
        self.items.append(item)
        idle = self.idle
        if idle is not None:
            self.idle = None
            idle.succeed()


class Replay:
    """State of one replay: build it, ``env.run()`` it, read ``peak`` and ``env.now``;
    :func:`simulate` does that and returns a :class:`SimResult`."""

    def __init__(self, graph: Graph, schedule: Schedule, capacity: int, record: bool,
                 static_bytes: int | None = None):
        self.g = graph
        self.schedule = schedule
        self.capacity = capacity
        self.record = record
        self.level = graph.trace.static_bytes if static_bytes is None else static_bytes
        self.peak = self.level
        self.offloading: dict = {}    # tensor -> completion event of its D2H copy
        self.inbound: dict = {}       # tensor -> completion event of its H2D copy
        self.copied_out: dict = {}    # tensor -> completion event of its last D2H copy
        self.deferred: dict = {}      # tensor -> bytes of freed copies waiting for their offload
        # where the compute stream stands while it waits: the index of the first op
        # not yet begun (its memory not yet taken); and, per offload op, that index
        # when its copy ended (the executor keeps the same order on CPU: see
        # ``SimResult.offload_ends``)
        self.pos = 0
        self.offload_ends: dict[int, int] = {}
        self.stall_ms = 0.0
        self.recompute_ms = 0.0
        self.h2d_bytes = 0
        self.d2h_bytes = 0
        self.forward_end_ms = 0.0
        self.reason: str | None = None
        self.timeline: list[MemoryPoint] = [MemoryPoint(0.0, self.level, "static", LevelKind.STATIC)]
        self.intervals: list[Interval] = []
        # the ledger's memory effect of each op (checks the rules; cached by verify)
        self.effects = effects(graph, schedule) if schedule.infeasible_reason is None else []
        self.durations, self.planned_ms, self.copies = _durations(graph, schedule.ops)
        self.end_ms = 0.0
        # the simpy processes, made on first use of ``env`` (a plan without copies
        # replays without them, and without importing simpy: ~25 ms of a process)
        self._env = None
        self.stream = None
        self.engines: tuple = ()

    @property
    def env(self):
        """The simpy environment of the three processes (made on first use)."""
        if self._env is None:
            self._start()
        return self._env

    def _start(self) -> None:
        import simpy

        self._env = env = simpy.Environment()
        self.freed_event = env.event()
        # each engine's queue of copies, and the event an idle engine waits on (a
        # plain deque: a simpy.Store costs a put and a get event per copy)
        self.h2d = _Queue()
        self.d2h = _Queue()
        dev = self.g.trace.device
        self.engines = (self._copy_engine(self.h2d, "h2d", dev.h2d_Bps),
                        self._copy_engine(self.d2h, "d2h", dev.d2h_Bps))
        for engine in self.engines:
            env.process(engine)
        self.stream = self._compute_stream()
        self.done = env.process(self.stream)

    def run(self) -> None:
        """Replay the schedule; ``end_ms`` is the time it ended (or stopped).

        A schedule without copies (no offload, prefetch or wait) has nothing to
        overlap: its replay is one pass over the ops (:meth:`_sequential`), the
        same arithmetic as the simpy run (each step ends at ``now + duration``)
        without an event per step.  One with copies runs the three processes.
        """
        try:
            if self.schedule.infeasible_reason is not None:
                return
            if not self.copies:
                self._sequential()
                return
            self.env.run()
            self.end_ms = self.env.now
        finally:
            # the copy engines wait on their queues for ever (and the compute stream
            # never starts on a copy-free plan): each one's frame holds this replay
            # (its schedule, effects and durations) in a reference cycle through an
            # event it waits on; closing them lets reference counting free the
            # replay at once, without the cyclic collector
            if self.stream is not None:
                for gen in (self.stream, *self.engines):
                    gen.close()

    # -------------------------------------------------------------- memory
    def _release(self, t, nbytes: int) -> None:
        self.level -= nbytes
        if self.record:
            self.timeline.append(MemoryPoint(self.env.now, self.level, "free " + tensor_name(t),
                                             LevelKind.FREE))

    def _reserve(self, nbytes: int, what: str):
        """Wait until ``nbytes`` fit under the capacity (generator)."""
        while self.level + nbytes > self.capacity:
            if not self.deferred:
                self._shortfall(nbytes, what)
                raise _Infeasible()
            start = self.env.now
            yield self.freed_event
            self._stall(start, "memory")

    def _shortfall(self, nbytes: int, what: str) -> None:
        short = self.level + nbytes - self.capacity
        self.reason = (f"{what} needs {fmt_bytes(nbytes)} but only "
                       f"{fmt_bytes(self.capacity - self.level)} of the "
                       f"{fmt_bytes(self.capacity)} budget is free "
                       f"({short} bytes short) and no free is under way")

    def _stall(self, start: float, why: str) -> None:
        if self.env.now > start:
            self.stall_ms += self.env.now - start
            if self.record:
                self.intervals.append(Interval(start, self.env.now, Stream.COMPUTE, "stall", why,
                                               IntervalKind.STALL))

    # ------------------------------------------------------------- streams
    def _sequential(self) -> None:
        """:meth:`_compute_stream` for a schedule without copies, without simpy: no
        copy is ever under way, so a free is immediate, nothing waits, and an
        allocation over the budget ends the run.  Same order of additions, same
        floats, same timeline (the simpy run's clock advances by ``now + d``)."""
        g = self.g
        record = self.record
        capacity = self.capacity
        forward_end = g.forward_end
        timeline, intervals = self.timeline, self.intervals
        level, peak, now = self.level, self.peak, 0.0
        recompute_ms, forward_end_ms, done_route = 0.0, 0.0, 0
        for op, (nbytes, ws, freed), dur in zip(self.schedule.ops, self.effects,
                                                self.durations):
            if op.action == COMPUTE:
                need = ws + nbytes
                if level + need > capacity:
                    self.level = level
                    self._shortfall(need, f"step {g.step_label(op.step)}")
                    break
                level += need
                if level > peak:
                    peak = level
                start = now
                if dur:
                    now = now + dur
                if op.phase == "R":
                    recompute_ms += dur
                else:
                    done_route += 1
                    if done_route == forward_end:
                        forward_end_ms = now
                if record:
                    timeline.append(MemoryPoint(start, level, f"{op.phase}{op.layer}"))
                    intervals.append(Interval(
                        start, now, Stream.COMPUTE, f"{op.phase}{op.layer}", "",
                        IntervalKind.RECOMPUTE if op.phase == "R" else IntervalKind.STEP))
                if ws:
                    level -= ws
                    if record:
                        timeline.append(MemoryPoint(now, level, "workspace",
                                                    LevelKind.WORKSPACE_END))
            else:   # RELEASE: the only other action without copies
                level -= freed
                if record:
                    timeline.append(MemoryPoint(now, level, "free " + tensor_name(op.tensor),
                                                LevelKind.FREE))
        self.level, self.peak, self.end_ms = level, peak, now
        self.recompute_ms, self.forward_end_ms = recompute_ms, forward_end_ms

    def _compute_stream(self):
        # The hot loop of the simulator: one pass over the ops with the ledger's
        # effects and each compute op's duration precomputed (``durations``);
        # names of steps and tensors are built only when recording.
        g, env = self.g, self.env
        size = g.size
        record = self.record
        capacity = self.capacity
        timeout = env.timeout
        forward_end = g.forward_end
        done_route = 0
        for k, (op, (nbytes, ws, freed), dur) in enumerate(
                zip(self.schedule.ops, self.effects, self.durations)):
            act = op.action
            if act == COMPUTE:
                need = ws + nbytes
                if self.level + need > capacity:
                    self.pos = k
                    try:
                        yield from self._reserve(need, f"step {g.step_label(op.step)}")
                    except _Infeasible:
                        return
                level = self.level = self.level + need
                if level > self.peak:
                    self.peak = level
                if record:
                    self.timeline.append(MemoryPoint(env.now, level, f"{op.phase}{op.layer}"))
                if record:
                    start = env.now
                if dur:
                    self.pos = k + 1   # its memory is taken: a copy ending now is after it
                    yield timeout(dur)
                if op.phase == "R":
                    self.recompute_ms += dur
                else:
                    done_route += 1
                    if done_route == forward_end:
                        self.forward_end_ms = env.now
                if record:
                    self.intervals.append(Interval(
                        start, env.now, Stream.COMPUTE, f"{op.phase}{op.layer}", "",
                        IntervalKind.RECOMPUTE if op.phase == "R" else IntervalKind.STEP))
                if ws:
                    self.level -= ws
                    if record:
                        self.timeline.append(MemoryPoint(env.now, self.level, "workspace",
                                                         LevelKind.WORKSPACE_END))
            elif act == RELEASE and not self.offloading:   # the common case: freed now
                self.level -= freed
                if record:
                    self.timeline.append(MemoryPoint(env.now, self.level,
                                                     "free " + tensor_name(op.tensor),
                                                     LevelKind.FREE))
            elif act == RELEASE:
                t = op.tensor
                if t in self.offloading:
                    # The device copy leaves now (a prefetch may bring the tensor
                    # back before the copy ends) but holds its memory until then.
                    self.deferred[t] = self.deferred.get(t, 0) + freed
                else:
                    self._release(t, freed)
            elif act == TO_HOST:
                t = op.tensor
                ev = env.event()
                self.offloading[t] = ev
                self.copied_out[t] = ev
                self.d2h_bytes += size(t)
                self.d2h.put((t, ev, k))
            elif act == TO_DEVICE:
                t = op.tensor
                if self.level + nbytes > self.capacity:
                    self.pos = k
                    try:
                        yield from self._reserve(nbytes, f"prefetch of {tensor_name(t)}")
                    except _Infeasible:
                        return
                self.level += nbytes
                if self.level > self.peak:
                    self.peak = self.level
                if self.record:
                    self.timeline.append(MemoryPoint(env.now, self.level,
                                                     "prefetch " + tensor_name(t),
                                                     LevelKind.PREFETCH))
                ev = env.event()
                self.inbound[t] = ev
                self.h2d_bytes += nbytes
                self.h2d.put((t, ev, k))
            elif act == SYNC:
                ev = self.inbound.get(op.tensor) or self.copied_out.get(op.tensor)
                if not ev.triggered:
                    start = env.now
                    self.pos = k
                    yield ev
                    self._stall(start, "wait " + tensor_name(op.tensor))
                self.inbound.pop(op.tensor, None)
        self.pos = len(self.schedule.ops)

    def _copy_engine(self, queue, name: str, bandwidth: float):
        env, size = self.env, self.g.size
        items = queue.items
        while True:
            if not items:
                queue.idle = env.event()
                yield queue.idle
            t, ev, k = items.popleft()
            if name == "h2d":
                pending = self.offloading.get(t)
                if pending is not None and not pending.triggered:
                    yield pending  # the host copy must exist before it comes back
            start = env.now
            nbytes = size(t)
            yield env.timeout(nbytes / bandwidth * 1e3)
            if self.record:
                self.intervals.append(Interval(start, env.now, Stream(name), tensor_name(t), "",
                                               IntervalKind.COPY))
            ev.succeed()
            if name == "d2h":
                self.offload_ends[k] = self.pos
                if self.offloading.get(t) is ev:
                    del self.offloading[t]
                if t in self.deferred:
                    self.level -= self.deferred.pop(t)
                    if self.record:
                        self.timeline.append(MemoryPoint(env.now, self.level,
                                                         "free " + tensor_name(t),
                                                         LevelKind.FREE))
                    old, self.freed_event = self.freed_event, env.event()
                    old.succeed()


def _durations(graph: Graph, ops) -> tuple[list[float], float, bool]:
    """Each op's duration (0 for the ops that are not computes; ``Graph.step_ms``
    inline), the planned time of the route's steps (the recomputes left out),
    and whether any op is a copy or waits for one."""
    layers = graph.layers
    durations = []
    append = durations.append
    planned = 0.0
    copies = False
    for op in ops:
        if type(op) is Compute:
            phase = op.phase
            if phase == "O":
                d = graph.optimizer_ms
            else:
                layer = layers[op.layer]
                if op.algo and layer.workspace:
                    w = layer.workspace[op.algo]
                    d = w.bwd_ms if phase == "B" else w.fwd_ms
                else:
                    d = layer.bwd_ms if phase == "B" else layer.fwd_ms
            if phase != "R":
                planned += d
            append(d)
        else:
            if op.action != RELEASE:
                copies = True
            append(0.0)
    return durations, planned, copies


def simulate(graph: Graph, schedule: Schedule, budget_bytes: int | None = None,
             record: bool = True) -> SimResult:
    """Replay ``schedule`` on ``graph``'s trace under a memory budget.

    ``budget_bytes=None`` means the trace device's memory.  ``record=False``
    skips the timeline and the event log (faster for sweeps).
    """
    trace = graph.trace
    capacity = trace.device.memory_bytes if budget_bytes is None else budget_bytes
    static = trace.static_bytes   # a sum over the layers: once
    # no cyclic collection during the replay: its objects (simpy's events) form no
    # cycle that outlives it (run() closes the copy engines), and a collector pass
    # over a large graph's objects costs more than the replay of a copy-free plan
    was = gc.isenabled()
    gc.disable()
    try:
        run = Replay(graph, schedule, capacity, record, static)
        run.run()
    finally:
        if was:
            gc.enable()
    feasible = run.reason is None and schedule.infeasible_reason is None
    reason = schedule.infeasible_reason or run.reason
    planned_ms = run.planned_ms
    iteration_ms = run.end_ms
    return SimResult(
        policy=schedule.policy, trace=trace.label, model=trace.model, batch=trace.batch,
        budget_bytes=budget_bytes, capacity_bytes=capacity, feasible=feasible,
        peak_bytes=run.peak, static_bytes=static,
        lower_bound_bytes=graph.lower_bound_bytes, iteration_ms=iteration_ms,
        compute_ms=planned_ms, recompute_ms=run.recompute_ms, stall_ms=run.stall_ms,
        h2d_bytes=run.h2d_bytes + graph.optimizer_copy_bytes,
        d2h_bytes=run.d2h_bytes + graph.optimizer_copy_bytes,
        samples_per_s=(trace.batch / (iteration_ms / 1e3)
                       if feasible and iteration_ms > 0 else 0.0),
        reason=reason, optimizer_state_bytes=trace.optimizer_state_bytes,
        optimizer_ms=graph.optimizer_ms, forward_end_ms=run.forward_end_ms,
        policy_stats=dict(schedule.stats), timeline=tuple(run.timeline),
        intervals=tuple(sorted(run.intervals, key=lambda iv: iv.start_ms)),
        offload_ends=dict(run.offload_ends))

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

How the processes are written (for speed: an event costs about as much as
replaying a dozen ops).  The compute stream drives the clock: it is one call,
started by an event at time 0, that waits by running the events due before
it may go on (:meth:`Clock.hold <snsim.sim.clock.Clock.hold>` for a step's
duration, :meth:`Replay._await` for a copy, :meth:`Replay._reserve` for a
free), in simpy's order, where a process would have yielded an event and
been resumed by it.  The copy engines are callbacks on their events (a
timeout per copy; an event to wake an idle engine; an event for the
host-to-device engine to wait for an offload it must copy back).  Every event
and every state change happens in the order the three generator processes
gave (``tests/test_engine.py`` and the golden numbers pin it).
"""

from __future__ import annotations

import gc
import itertools
from collections import deque
from itertools import repeat
from operator import is_

from snsim.graph import Graph, tensor_name
from snsim.schedule.ledger import effects
from snsim.schedule.ops import COMPUTE, RELEASE, SYNC, TO_DEVICE, TO_HOST, Compute, Schedule
from snsim.sim.result import (Interval, IntervalKind, LevelKind, MemoryPoint, SimResult,
                              Stream)
from snsim.units import fmt_bytes


class _Copy:
    """One copy on an engine.  ``done`` once it ended, and ``ready``: the event id
    its end would have had as an event (the compute stream waiting for it goes on
    after the events ordered before that one).  ``waiter``, an event, is made only
    for the host-to-device engine waiting for an offload to end."""

    __slots__ = ("done", "ready", "waiter")

    def __init__(self):
        self.done = False
        self.ready = 0
        self.waiter = None

    def finish(self, env) -> None:
        self.done = True
        self.ready = env.next_id()
        if self.waiter is not None:
            self.waiter.succeed()


class _Engine:
    """A copy engine: a FIFO of copies (``(tensor, copy, op index)``) it runs in
    order, each ``bytes / bandwidth``; a plain deque (a ``simpy.Store`` costs a put
    and a get event per copy).  Its methods are callbacks on simpy events, in the
    order a generator process ``while True: wait for a copy; yield timeout;
    finish`` would run them."""

    def __init__(self, replay: "Replay", stream: Stream, bandwidth: float):
        self.replay = replay
        self.env = replay.env
        self.stream = stream
        self.bandwidth = bandwidth
        self.to_host = stream is Stream.D2H
        self.sizes = replay.g.sizes
        self.items: deque = deque()
        self.idle = True       # waits for a copy: the next put wakes it (an event)
        self.current = None    # (tensor, copy, op index, start) of the copy it runs

    def put(self, item) -> None:
        self.items.append(item)
        if self.idle:
            self.idle = False
            self.env.call_soon(self._next)

    def _next(self, _event=None) -> None:
        t, copy, k = item = self.items.popleft()
        if not self.to_host:
            pending = self.replay.offloading.get(t)
            if pending is not None and not pending.done:
                # the host copy must exist before it comes back
                if pending.waiter is None:
                    pending.waiter = self.env.event()
                self.current = item
                pending.waiter.callbacks.append(self._begin)
                return
        self.current = item
        self._begin()

    def _begin(self, _event=None) -> None:
        t, copy, k = self.current
        env = self.env
        self.current = (t, copy, k, env.now)
        env.call_after(self.sizes[t] / self.bandwidth * 1e3, self._end)

    def _end(self, _event) -> None:
        t, copy, k, start = self.current
        run, env = self.replay, self.env
        if run.record:
            run.intervals.append(Interval(start, env.now, self.stream, tensor_name(t), "",
                                          IntervalKind.COPY))
        copy.finish(env)
        if self.to_host:
            run.offload_ends[k] = run.pos
            if run.offloading.get(t) is copy:
                del run.offloading[t]
            if t in run.deferred:
                run.level -= run.deferred.pop(t)
                if run.record:
                    run.timeline.append(MemoryPoint(env.now, run.level, "free " + tensor_name(t),
                                                    LevelKind.FREE))
                run.frees += 1
                run.freed = env.next_id()
        if self.items:
            self._next()
        else:
            self.idle = True


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
        self.offloading: dict = {}    # tensor -> its D2H copy (a _Copy) while copying
        self.inbound: dict = {}       # tensor -> its H2D copy, until waited for
        self.copied_out: dict = {}    # tensor -> its last D2H copy
        self.deferred: dict = {}      # tensor -> bytes of freed copies waiting for their offload
        self.frees = 0                # how many of those were released, and the event id of
        self.freed = 0                # the last one (the compute stream waits for a free)
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
        # each compute step's duration, read by the op loops (``Graph.step_ms``); the
        # planned time of the route's steps, added up by them; any copy or wait?
        self.plain_ms = graph.plain_ms
        self.planned_ms = 0.0
        self.copies = any(tp.action not in (COMPUTE, RELEASE)
                          for tp in set(map(type, schedule.ops)))
        self.end_ms = 0.0
        # the simpy processes, made on first use of ``env`` (a plan without copies
        # replays without them, and without importing simpy: ~25 ms of a process)
        self._env = None
        self.engines: tuple = ()

    @property
    def env(self):
        """The simpy environment of the three processes (made on first use)."""
        if self._env is None:
            self._start()
        return self._env

    def _start(self) -> None:
        from snsim.sim.clock import Clock

        self._env = env = Clock()
        dev = self.g.trace.device
        self.engines = (_Engine(self, Stream.H2D, dev.h2d_Bps),
                        _Engine(self, Stream.D2H, dev.d2h_Bps))
        env.call_soon(self._compute_stream)

    def run(self) -> None:
        """Replay the schedule; ``end_ms`` is the time it ended (or stopped).

        A schedule without copies (no offload, prefetch or wait) has nothing to
        overlap: its replay is one pass over the ops (:meth:`_sequential`), the
        same arithmetic as the simpy run (each step ends at ``now + duration``)
        without an event per step.  One with copies runs the three processes.
        """
        # no cyclic collection during the replay: its objects (simpy's events) form no
        # cycle that outlives it (the engines let go of it below), and a collector pass
        # over a large graph's objects costs more than the replay of a copy-free plan
        was = gc.isenabled()
        gc.disable()
        try:
            if self.schedule.infeasible_reason is not None:
                self.planned_ms = self._planned_from(0, 0.0)
                return
            if not self.copies:
                self._sequential()
                return
            self.env.run()
            self.end_ms = self.env.now
        finally:
            if was:
                gc.enable()
            # each engine holds this replay (its schedule and effects) in a
            # reference cycle; letting go of it lets reference counting free the
            # replay at once, without the cyclic collector
            for engine in self.engines:
                engine.replay = None

    # -------------------------------------------------------------- memory
    def _reserve(self, nbytes: int, what: str) -> bool:
        """Wait until ``nbytes`` fit under the capacity; False (and ``reason``) if
        they do not and no free is under way.  Each wait for a free runs the events
        before it, then those ordered before the free's own event."""
        env = self.env
        while self.level + nbytes > self.capacity:
            if not self.deferred:
                self._shortfall(nbytes, what)
                return False
            start = env.now
            frees = self.frees
            while self.frees == frees:
                env.step()
            env.settle(env.now, self.freed)
            self._stall(start, "memory")
        return True

    def _await(self, copy: _Copy) -> None:
        """Wait until ``copy`` ends, as a process yielding its end would: after the
        engine that waits for it first, if one does (the host-to-device engine, for
        an offload it copies back); else after the events before its end and those
        ordered before its end's own event."""
        env = self.env
        waiter = copy.waiter
        if waiter is not None:
            while waiter.callbacks is not None:   # until it ran
                env.step()
            return
        while not copy.done:
            env.step()
        env.settle(env.now, copy.ready)

    def _shortfall(self, nbytes: int, what: str) -> None:
        short = self.level + nbytes - self.capacity
        self.reason = (f"{what} needs {fmt_bytes(nbytes)} but only "
                       f"{fmt_bytes(self.capacity - self.level)} of the "
                       f"{fmt_bytes(self.capacity)} budget is free "
                       f"({short} bytes short) and no free is under way")

    def _stall(self, start: float, why: str, tensor=None) -> None:
        """The compute stream waited from ``start`` to now, for ``why`` (and
        ``tensor``: its name is built only for the timeline)."""
        now = self.env.now
        if now > start:
            self.stall_ms += now - start
            if self.record:
                if tensor is not None:
                    why = f"{why} {tensor_name(tensor)}"
                self.intervals.append(Interval(start, now, Stream.COMPUTE, "stall", why,
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
        plain_ms, step_ms = self.plain_ms, g.step_ms
        level, peak, now = self.level, self.peak, 0.0
        recompute_ms, forward_end_ms, done_route, planned = 0.0, 0.0, 0, 0.0
        k = len(self.schedule.ops)
        for m, (op, (nbytes, ws, freed)) in enumerate(zip(self.schedule.ops, self.effects)):
            if op.action == COMPUTE:
                need = ws + nbytes
                if level + need > capacity:
                    self.level = level
                    self._shortfall(need, f"step {g.step_label(op.step)}")
                    k = m
                    break
                dur = plain_ms[op.phase][op.layer] if not op.algo else step_ms(op.step, op.algo)
                level += need
                if level > peak:
                    peak = level
                start = now
                if dur:
                    now = now + dur
                if op.phase == "R":
                    recompute_ms += dur
                else:
                    planned += dur
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
        self.planned_ms = self._planned_from(k, planned)

    def _compute_stream(self, _event=None) -> None:
        # The hot loop of the simulator: one pass over the ops with the ledger's
        # effects precomputed, each compute step's duration read from a table;
        # names of steps and tensors are built only when recording.  ``pos`` is
        # set where the stream waits (the engines read it).
        g, env = self.g, self.env
        sizes = g.sizes
        record = self.record
        capacity = self.capacity
        hold = env.hold
        timeline, intervals = self.timeline, self.intervals
        offloading, deferred = self.offloading, self.deferred
        inbound, copied_out = self.inbound, self.copied_out
        h2d, d2h = self.engines
        plain_ms, step_ms = self.plain_ms, g.step_ms
        forward_end = g.forward_end
        done_route = 0
        planned = 0.0
        now = env.now
        for k, (op, (nbytes, ws, freed)) in enumerate(zip(self.schedule.ops, self.effects)):
            act = op.action
            if act == COMPUTE:
                need = ws + nbytes
                if self.level + need > capacity:
                    self.pos = k
                    if not self._reserve(need, f"step {g.step_label(op.step)}"):
                        self.planned_ms = self._planned_from(k, planned)
                        return
                    now = env.now
                dur = plain_ms[op.phase][op.layer] if not op.algo else step_ms(op.step, op.algo)
                level = self.level = self.level + need
                if level > self.peak:
                    self.peak = level
                start = now
                if record:
                    timeline.append(MemoryPoint(now, level, f"{op.phase}{op.layer}"))
                if dur:
                    self.pos = k + 1   # its memory is taken: a copy ending now is after it
                    now = hold(dur)
                if op.phase == "R":
                    self.recompute_ms += dur
                else:
                    planned += dur
                    done_route += 1
                    if done_route == forward_end:
                        self.forward_end_ms = now
                if record:
                    intervals.append(Interval(
                        start, now, Stream.COMPUTE, f"{op.phase}{op.layer}", "",
                        IntervalKind.RECOMPUTE if op.phase == "R" else IntervalKind.STEP))
                if ws:
                    self.level -= ws
                    if record:
                        timeline.append(MemoryPoint(now, self.level, "workspace",
                                                    LevelKind.WORKSPACE_END))
            elif act == RELEASE:
                t = op.tensor
                if t in offloading:
                    # The device copy leaves now (a prefetch may bring the tensor
                    # back before the copy ends) but holds its memory until then.
                    deferred[t] = deferred.get(t, 0) + freed
                else:
                    self.level -= freed
                    if record:
                        timeline.append(MemoryPoint(now, self.level, "free " + tensor_name(t),
                                                    LevelKind.FREE))
            elif act == TO_HOST:
                t = op.tensor
                offloading[t] = copied_out[t] = copy = _Copy()
                self.d2h_bytes += sizes[t]
                d2h.put((t, copy, k))
            elif act == TO_DEVICE:
                t = op.tensor
                if self.level + nbytes > capacity:
                    self.pos = k
                    if not self._reserve(nbytes, f"prefetch of {tensor_name(t)}"):
                        self.planned_ms = self._planned_from(k, planned)
                        return
                    now = env.now
                self.level += nbytes
                if self.level > self.peak:
                    self.peak = self.level
                if record:
                    timeline.append(MemoryPoint(now, self.level, "prefetch " + tensor_name(t),
                                                LevelKind.PREFETCH))
                inbound[t] = copy = _Copy()
                self.h2d_bytes += nbytes
                h2d.put((t, copy, k))
            elif act == SYNC:
                t = op.tensor
                copy = inbound.get(t) or copied_out.get(t)
                if not copy.done:
                    self.pos = k
                    self._await(copy)
                    self._stall(now, "wait", t)
                    now = env.now
                inbound.pop(t, None)
        self.pos = len(self.schedule.ops)
        self.planned_ms = planned

    def _planned_from(self, k: int, planned: float) -> float:
        """``planned`` plus the durations of the route's steps (not the recomputes)
        from op ``k`` on, added in order (the op loops add up those they ran)."""
        # each step's time with its first algorithm read from the op loops' table
        # (the same floats as ``Graph.step_ms``, added in the same order): an
        # infeasible plan adds up all of its ops here, ~10^5 on a deep trace
        step_ms, plain_ms = self.g.step_ms, self.plain_ms
        ops = self.schedule.ops
        kinds = map(is_, map(type, itertools.islice(ops, k, None)), repeat(Compute))
        for op in itertools.compress(itertools.islice(ops, k, None), kinds):   # in C
            phase = op.phase
            if phase != "R":
                planned += plain_ms[phase][op.layer] if not op.algo \
                    else step_ms(op.step, op.algo)
        return planned


def simulate(graph: Graph, schedule: Schedule, budget_bytes: int | None = None,
             record: bool = True) -> SimResult:
    """Replay ``schedule`` on ``graph``'s trace under a memory budget.

    ``budget_bytes=None`` means the trace device's memory.  ``record=False``
    skips the timeline and the event log (faster for sweeps).
    """
    trace = graph.trace
    capacity = trace.device.memory_bytes if budget_bytes is None else budget_bytes
    static = trace.static_bytes   # a sum over the layers: once
    run = Replay(graph, schedule, capacity, record, static)
    run.run()   # with the cyclic collector paused
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
        offload_ends=dict(run.offload_ends), replayed=schedule.infeasible_reason is None)

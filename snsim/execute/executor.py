"""Obey a schedule for real: layer-by-layer forward and backward in PyTorch.

The store holds exactly the tensors the simulator counts: ``X_i`` (layer
outputs), ``G_i`` (their gradients) and ``S_i`` (what autograd saves beyond
inputs and outputs).  The pieces that make that true:

[1] Each layer runs on *leaf* aliases of its inputs, and its backward is
    ``torch.autograd.grad`` from the layer's gradient edge to the inputs'
    edges (``torch.autograd.graph.get_gradient_edge``), so no layer keeps a
    reference to its output tensor, and the leaf aliases drop their storage
    right after the forward (``leaf.data = empty``).
[2] ``saved_tensors_hooks`` intercept what autograd saves.  A saved tensor
    that is one of the layer's inputs or its output is replaced by a handle
    to the store (``X_j``), re-read at backward time, so freeing, offloading
    and prefetching ``X_j`` really moves that memory.  Anything else (pooling
    indices, dropout masks, norm statistics) is ``S_i``, freed or moved by
    the schedule's ops on ``S_i``.  Parameters and buffers stay referenced.
[3] Recomputation reproduces the forward: the RNG state before ``F_i`` is
    kept for layers the schedule recomputes (dropout replays its mask), and
    a module's buffers (batch-norm running statistics) are restored after a
    recompute so they are not updated twice.
[4] Offload on CPU copies into a numpy buffer, memory the torch allocator
    does not count, as host memory is not device memory on a GPU, in one
    worker thread per direction (the copy engines; numpy releases the GIL
    while copying), so copies overlap compute as in the simulator.  On CUDA:
    pinned host buffers and one copy stream per direction, with events, so
    compute waits only at the schedule's ``Wait``.
[5] A gradient autograd hands to two inputs at once (``add`` passes it
    through; ``cat`` returns slices of it) is copied, so that each ``G_j``
    owns its memory as the trace's semantics count it, and accumulating
    into one never writes into another.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from snsim.errors import ScheduleError
from snsim.graph import Graph, tensor_name
from snsim.schedule.ledger import effects
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait

from snsim.torchgraph.program import Program


class _Saved:
    """One tensor autograd saved: held directly, or a handle to the store [2]."""

    __slots__ = ("t", "key", "size", "stride", "rel")

    def __init__(self, t: torch.Tensor):
        self.t: torch.Tensor | None = t
        self.key = None

    def bind(self, key, base: torch.Tensor) -> None:
        t = self.t
        self.key, self.size, self.stride = key, t.size(), t.stride()
        self.rel = t.storage_offset() - base.storage_offset()
        self.t = None

    def get(self, store: dict) -> torch.Tensor:
        if self.key is None:
            if self.t is None:
                raise ScheduleError("a saved extra tensor was freed before the backward "
                                    "step that needs it")
            return self.t
        base = store.get(self.key)
        if base is None:
            raise ScheduleError(f"backward needs {tensor_name(self.key)}, not resident")
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.rel)


@dataclass
class _Edge:
    out: Any                    # GradientEdge of the layer's output
    inputs: dict[int, Any]      # input layer -> GradientEdge of its leaf alias
    shape: torch.Size
    records: list[_Saved]       # keep the handles alive with the graph


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Executor:
    """Run ``schedule`` on ``program`` (one training step per :meth:`step`).

    Each parameter's ``.grad`` exists for the whole step (static memory, as in
    the simulator; :meth:`prepare` allocates it).  A layer's first gradient of
    a parameter replaces that buffer (its old one is freed at once, so the
    step briefly holds both, a transient the trace records as the layer's
    backward workspace); later ones are added in place.
    """

    def __init__(self, program: Program, graph: Graph, schedule: Schedule,
                 device: torch.device):
        if graph.n != program.n:
            raise ScheduleError(f"trace has {graph.n} layers but the model has {program.n}")
        self.p, self.g, self.schedule, self.device = program, graph, schedule, device
        # The ledger's walk: the one set of rules (a broken schedule is refused
        # here, naming the op, before any tensor moves); its effects say which
        # tensors each op makes resident or frees, which this class obeys.
        effects(graph, schedule)
        self.cuda = device.type == "cuda"
        self.recomputed = {op.layer for op in schedule.ops
                           if type(op) is Compute and op.phase == "R"}
        self.static_ptrs: set[int] = set()
        if self.cuda:
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)
        else:  # one thread per copy engine, as the simulator models them [4]
            self.d2h_pool = ThreadPoolExecutor(1, thread_name_prefix="snsim-d2h")
            self.h2d_pool = ThreadPoolExecutor(1, thread_name_prefix="snsim-h2d")

    def prepare(self, fresh: bool = False) -> None:
        """Allocate parameter gradients and note static storages.

        ``fresh`` allocates new gradient buffers even where they exist: a CPU
        memory window must see the buffers it will see freed (the profiler
        records no free of memory allocated before the window opened), so a
        measurement calls :meth:`release` before its window's baseline and
        ``prepare(fresh=True)`` after it.
        """
        for p in self.p.param_list:
            if p.grad is None or fresh:
                p.grad = torch.zeros_like(p)
        self.static_ptrs = {_ptr(t) for t in list(self.p.model.parameters())
                            + list(self.p.model.buffers()) if t.numel()}

    def release(self) -> None:
        """Drop the gradient buffers (see :meth:`prepare`)."""
        for p in self.p.param_list:
            p.grad = None

    # ------------------------------------------------------------------ step
    def step(self, batch: Any, annotate: bool = False, hook=None) -> None:
        """One training step on ``batch`` (a host array/tensor: ``F_0`` copies it in).

        ``annotate`` wraps each op in a profiler range ``snsim#k`` so that
        memory events can be attributed to ops (see ``memory.per_op_levels``);
        ``hook(k, "before"|"after")`` is called around each op.
        """
        self.batch = batch
        self.fresh = set(self.p.param_list)
        self.store: dict = {}
        self.extras: dict[int, list[_Saved]] = {}
        self.edges: dict[int, _Edge] = {}
        self.host: dict = {}
        self.events: dict = {}
        self.rng: dict[int, Any] = {}
        for k, op in enumerate(self.schedule.ops):
            if hook is not None:
                hook(k, "before")
            if annotate:
                with torch.profiler.record_function(f"snsim#{k}"):
                    self._do(k, op)
            else:
                self._do(k, op)
            if hook is not None:
                hook(k, "after")
        for ev in self.events.values():  # the step ends when every copy has
            if self.cuda:
                ev.synchronize()
            else:
                ev.result()
        self.store = self.extras = self.edges = self.host = self.events = {}

    def _do(self, k: int, op) -> None:
        try:
            kind = type(op)
            if kind is Compute:
                if op.phase == "B":
                    self._backward(op.layer)
                else:
                    self._forward(op.layer, op.phase == "R")
            elif kind is Free:
                self._free(op.tensor)
            elif kind is Offload:
                self._offload(op.tensor)
            elif kind is Prefetch:
                self._prefetch(op.tensor)
            elif kind is Wait:
                self._wait(op.tensor)
        except ScheduleError as exc:
            raise ScheduleError(f"op {k} ({op}): {exc}") from None

    # --------------------------------------------------------------- compute
    def _forward(self, i: int, recompute: bool) -> None:
        store = self.store
        if i == 0:
            b = self.batch
            if isinstance(b, np.ndarray):
                b = torch.from_numpy(b)
            store[("X", 0)] = b.to(self.device, copy=True)  # the input enters device memory
            return
        if recompute:
            state, buffers = self._enter_recompute(i)
        elif i in self.recomputed:
            self.rng[i] = self._rng_state()
        try:
            self._run_layer(i)
        finally:
            if recompute:
                self._leave_recompute(i, state, buffers)

    def _run_layer(self, i: int) -> None:
        g, store = self.g, self.store
        ins = dict.fromkeys(g.layers[i].inputs)
        needs_grad = g.requires_grad[i]
        values, leaves = {}, {}
        for j in ins:
            t = store.get(("X", j))
            if t is None:
                raise ScheduleError(f"needs X{j}, not resident")
            if needs_grad and g.requires_grad[j] and t.is_floating_point():
                leaves[j] = values[j] = t.detach().requires_grad_()
            else:
                values[j] = t
        if not needs_grad:
            with torch.no_grad():
                out = self.p.run(i, values)
            store[("X", i)] = out
            return
        records: list[_Saved] = []

        def pack(t):
            rec = _Saved(t)
            records.append(rec)
            return rec

        with torch.enable_grad(), saved_tensors_hooks(pack, lambda rec: rec.get(store)):
            out = self.p.run(i, values)
        out_ptr = _ptr(out)
        in_ptrs = {_ptr(store[("X", j)]): j for j in ins}
        extras = []
        for rec in records:
            ptr = _ptr(rec.t)
            if ptr == out_ptr and ptr:
                rec.bind(("X", i), out)
            elif ptr in in_ptrs and ptr:
                rec.bind(("X", in_ptrs[ptr]), store[("X", in_ptrs[ptr])])
            elif ptr not in self.static_ptrs:
                extras.append(rec)
        if extras:
            self.extras[i] = extras
        if out.requires_grad:
            self.edges[i] = _Edge(get_gradient_edge(out),
                                  {j: get_gradient_edge(x) for j, x in leaves.items()},
                                  out.shape, records)
        for x in leaves.values():  # [1] the alias must not keep X_j alive
            x.data = torch.empty(0, dtype=x.dtype, device=x.device)
        store[("X", i)] = out.detach()

    def _backward(self, i: int) -> None:
        store = self.store
        edge = self.edges.pop(i, None)
        if edge is None:
            raise ScheduleError(f"backward of layer {i} without its forward graph")
        if i == self.g.n - 1:
            gout = torch.ones(edge.shape, device=self.device)
            store[("G", i)] = gout
        else:
            gout = store.get(("G", i))
            if gout is None:
                raise ScheduleError(f"needs G{i}, not resident")
        ins = [j for j in edge.inputs if self.g.requires_grad[j]]
        params = self.p.layers[i].params
        targets = [edge.inputs[j] for j in ins] + params
        if not targets:
            return
        grads = torch.autograd.grad([edge.out], targets, grad_outputs=[gout],
                                    allow_unused=True)
        del edge
        taken = {_ptr(gout)}
        for j, gj in zip(ins, grads):
            if gj is None:
                continue
            if _ptr(gj) in taken:
                # [5] add passes its gradient through, concat hands out slices of it:
                # each G_j gets its own memory, as the trace's semantics say.
                gj = gj.clone()
            taken.add(_ptr(gj))
            key = ("G", j)
            if key in store:
                store[key].add_(gj)
            else:
                store[key] = gj
        fresh = self.fresh
        for p, gp in zip(params, grads[len(ins):]):
            if gp is None:
                continue
            if p in fresh:   # first contribution this step: take it over, as autograd does
                p.grad = gp
                fresh.discard(p)
            else:
                p.grad.add_(gp)

    # -------------------------------------------------------------- recompute
    def _rng_state(self):
        # kept as numpy bytes: bookkeeping must not show up as device memory
        state = torch.get_rng_state().numpy().copy()
        cuda = torch.cuda.get_rng_state(self.device).numpy().copy() if self.cuda else None
        return state, cuda

    def _enter_recompute(self, i: int):
        state = self._rng_state()
        saved = self.rng.get(i)
        if saved is not None:
            torch.set_rng_state(torch.from_numpy(saved[0]))
            if self.cuda:
                torch.cuda.set_rng_state(torch.from_numpy(saved[1]), self.device)
        module = self.p.layers[i].module
        buffers = [b.clone() for b in module.buffers()] if module is not None else []
        return state, buffers

    def _leave_recompute(self, i: int, state, buffers) -> None:
        torch.set_rng_state(torch.from_numpy(state[0]))
        if self.cuda:
            torch.cuda.set_rng_state(torch.from_numpy(state[1]), self.device)
        module = self.p.layers[i].module
        if module is not None:
            with torch.no_grad():
                for b, old in zip(module.buffers(), buffers):
                    b.copy_(old)

    # ------------------------------------------------------------ memory ops
    def _tensors_of(self, t) -> list:
        """What holds tensor ``t``: its store key, or the saved records of ``S_i``."""
        if t[0] == "S":
            return self.extras.get(t[1], [])
        return [t]

    def _free(self, t) -> None:
        if t[0] == "S":
            for rec in self.extras.pop(t[1], []):
                rec.t = None
            return
        del self.store[t]  # the ledger has checked that it is resident

    def _get(self, item) -> torch.Tensor:
        return item.t if isinstance(item, _Saved) else self.store[item]

    def _set(self, item, value: torch.Tensor) -> None:
        if isinstance(item, _Saved):
            item.t = value
        else:
            self.store[item] = value

    def _offload(self, t) -> None:
        items = self._tensors_of(t)
        if self.cuda:
            self.d2h.wait_stream(torch.cuda.current_stream(self.device))
        copies, jobs = [], []
        for item in items:
            dev = self._get(item)
            if self.cuda:
                hostbuf = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
                with torch.cuda.stream(self.d2h):
                    hostbuf.copy_(dev, non_blocking=True)
                dev.record_stream(self.d2h)  # its memory is reused only after the copy
            else:
                # numpy memory: not counted by the torch allocator, like host memory
                hostbuf = np.empty(tuple(dev.shape), dtype=dev.detach().numpy().dtype)
                jobs.append((hostbuf, dev.detach().numpy()))
            copies.append((hostbuf, dev.size(), dev.stride()))
        self.host[t] = (items, copies)
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.d2h)
            self.events[t] = ev
        else:
            # The job holds the device tensors until the copy ends, so a Free
            # issued meanwhile releases memory only then (a free under way).
            self.events[t] = self.d2h_pool.submit(_copy_all, jobs, None)

    def _prefetch(self, t) -> None:
        items, copies = self.host[t]
        if self.cuda:
            self.h2d.wait_stream(torch.cuda.current_stream(self.device))
            offload = self.events.get(t)
            if offload is not None:  # the host copy must be complete before it comes back
                self.h2d.wait_event(offload)
        jobs = []
        for item, (hostbuf, size, stride) in zip(items, copies):
            new = torch.empty_strided(size, stride, dtype=self._dtype(hostbuf),
                                      device=self.device)
            if self.cuda:
                with torch.cuda.stream(self.h2d):
                    new.copy_(hostbuf, non_blocking=True)
                new.record_stream(self.h2d)
            else:
                jobs.append((new.numpy(), hostbuf))
            self._set(item, new)
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.h2d)
            self.events[t] = ev
        else:
            self.events[t] = self.h2d_pool.submit(_copy_all, jobs, self.events.get(t))

    @staticmethod
    def _dtype(hostbuf) -> torch.dtype:
        if isinstance(hostbuf, torch.Tensor):
            return hostbuf.dtype
        return torch.from_numpy(np.empty(0, dtype=hostbuf.dtype)).dtype

    def _wait(self, t) -> None:
        ev = self.events[t]  # the ledger has checked that a copy is in flight
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(ev)
        else:
            ev.result()

    def close(self) -> None:
        if not self.cuda:
            self.h2d_pool.shutdown()
            self.d2h_pool.shutdown()


def _copy_all(jobs, after) -> None:
    """Copy ``(dst, src)`` numpy pairs in a copy-engine thread (numpy drops the GIL)."""
    if after is not None:
        after.result()  # a prefetch waits for the offload that made its host copy
    for dst, src in jobs:
        np.copyto(dst, src)
    jobs.clear()  # drop the device tensors: a pending free completes now

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
    A recomputation of layer i makes new ``S_i`` records, the ones its new
    autograd node reads (``extras_of``); a prefetch of ``S_i`` offloaded
    before it fills those, not the records of the forward's node, and an
    ``S_i`` still resident is let go before the recomputation makes the new
    ones (the ledger overwrites it in place: its memory is not held twice).
[3] Recomputation reproduces the forward: the RNG state before ``F_i`` is
    kept for layers the schedule recomputes (dropout replays its mask), and
    a module's buffers (batch-norm running statistics) are restored after a
    recompute so they are not updated twice.
[4] Offload on CPU copies into a numpy buffer, memory the torch allocator
    does not count, as host memory is not device memory on a GPU, in one
    worker thread per direction (the copy engines; numpy releases the GIL
    while copying), so copies overlap compute as in the simulator.  On CUDA:
    pinned host buffers and one copy stream per direction, with events, so
    compute waits only at the schedule's ``Wait``.  On CPU a copy job holds
    the device tensors it reads until it ends, so a free issued meanwhile
    releases memory only then; the compute thread drops them (``reap``,
    before each op and at each wait), never the copy thread: the CPU
    allocator reports a free to the profiler only on a thread the profiler
    runs on, and a free in the copy thread left the measured running total
    that much too high for the rest of the window (vdnn-all on
    ``toymodels:residual`` read 482,088 B for a 265,000 B step, depending
    on which thread happened to drop the last reference).
[5] Gradient storage follows the graph's plan (``Graph.grad_plan``, DESIGN
    3): the store holds each gradient *storage* under its tensor name, and a
    logical ``G_j`` is a view of one (``self.gview``: storage, shape, stride,
    offset), re-read from the store when used, so offloading or freeing the
    storage moves or frees every gradient in it.  Where the trace says
    autograd hands ``j`` the step's own output gradient (``grad_shares``:
    ``add``, ``cat``), ``G_j`` is the view autograd returned of that storage;
    a contribution is added in place, or out of place into a new storage
    where the plan says so.  Where the trace does not say so but autograd
    returns one storage for two inputs, the gradient is copied, so that each
    storage the trace counts is one.
[6] A layer may return a tuple (``nn.LSTM``: ``(out, (h, c))``,
    ``nn.MultiheadAttention``: ``(out, weights)``): its ``X_i`` is the whole
    tuple (the trace's ``output_bytes`` counts every tensor of it) and its
    ``G_i`` is a list with one gradient (or None) per tensor, in
    :func:`flat` order; consumers read elements through the graph's
    ``getitem`` nodes.
[7] Dying reads.  Where the trace measured it (``bwd_released``), a backward
    step hands the tensors it reads for the last time (those the schedule
    frees right after it, ``snsim.schedule.ledger.dying_reads``, when they are
    the ones liveness frees there) to autograd before it runs: the saved
    records stop reading them from the store and hold them, once, so each is
    freed when the autograd node that saved it has run, as in a plain
    ``loss.backward()``; the schedule's frees of them are then no-ops.  The
    step's own ``G_i``, when the schedule frees it right after, is released
    once the nodes that hold it have run (a hook on each frees its storage
    after the last), as autograd keeps it no longer: the first node, and the
    nodes it hands the same storage on to (a bias's ``add``, a view), each of
    which gets the hook in turn; a linear layer over tokens
    (``proj(x.transpose(1, 2))``) frees it after ``UnsafeViewBackward0``
    copies it, not at the step's end (gMLP: the step's peak 1,064,964 ->
    540,676 B, as in ``loss.backward()``).  Where it reaches an input's or a
    parameter's gradient, it stays.
[8] Parameter gradients go into ``.grad`` as autograd makes them, through a
    hook on each parameter, not as results of ``torch.autograd.grad``: a
    whole-module layer (``nn.TransformerEncoderLayer``) would otherwise hold
    every parameter's gradient until its backward ends, where
    ``loss.backward()`` adds each into ``.grad`` and drops it at once.
[10] Shared parameters (``Graph.param_buffers``, DESIGN 3).  A parameter
    that several backward steps differentiate (a module called twice) has
    its contributions summed in the store's ``P_p`` (one tensor per shared
    parameter, in the owner's order), made by the first contributing step,
    as autograd's AccumulateGrad input buffer holds them; the last
    contributor adds it into ``.grad`` and the schedule frees it.  With
    ``set-to-none`` gradients the first contribution is the gradient (the
    hook of note [8]).
[9] In-place layers.  Where the ledger lets ``X_i`` take over its input's
    storage (``in_place_steps``: the input dies at the step), the layer runs
    the model's own in-place kernel on that storage, so no new memory is
    allocated, as in the model.  Autograd refuses an in-place op on a leaf
    (or a view of one), so the input's leaf alias passes through
    ``capture.ShareStorage``, an identity whose result is a new tensor on the same
    storage: the in-place op rebases that result's history, the gradient
    still reaches the leaf's edge.
[11] Gradient pieces (``grad_pieces``, capture note [13]).  Where the plan
    makes a layer's contribution to ``G_j`` a piece (``PIECE``), its backward
    goes to the gradient edges of the pieces of the multi-output view it
    reads (``u, v = x.chunk(2)``: ``SplitBackward0``'s outputs), not to
    ``X_j``'s leaf, and the store keeps their gradients (a list indexed by
    the view's outputs, None for those it did not make) under the piece's
    name; a piece a reader before made is added into in place, as
    autograd's input buffer does, and a piece in the step's own gradient
    storage (``PIECE_SHARE``) is kept as a view of it (``piece_views``).
    A reader that reads ``X_j`` whole too takes that contribution at the
    leaf, with a pre-hook on its view's node that hands it no gradient, so
    that the node adds nothing at the leaf (the pieces wait for the last
    reader's).  The last reader (``JOIN``, ``JOIN_ADD``, ``JOIN_COPY``)
    passes the others' piece gradients to ``torch.autograd.grad`` as
    gradients of its own copy of the view's other outputs (a piece it reads
    too through a pre-hook on the view's node that adds its own gradient
    into it, in place or, where the graph says so, out of place, as the
    node's input buffer does), so that the view's one backward node joins
    them with its own after the layer's nodes have run, as in
    ``loss.backward()``; what comes
    out at ``X_j``'s leaf is then ``G_j``, or is added to it like any other
    contribution (where layers reading ``X_j`` whole have made it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from snsim.errors import ScheduleError
from snsim.execute import optim
from snsim.execute.store import Edge, Saved, flat, remap, storage_ptr
from snsim.execute.transfer import CopyEngines
from snsim.graph import (ADD, COPY, JOIN, JOIN_ADD, JOIN_COPY, JOINS, PIECE, PIECE_SHARE,
                         SHARE, Graph, kind, tensor_name)
from snsim.schedule.ledger import dying_reads, effects, hands_over, in_place_steps
from snsim.schedule.ops import COMPUTE, RELEASE, SYNC, TO_DEVICE, TO_HOST, Schedule
from snsim.torchgraph import amp
from snsim.torchgraph.capture import ShareStorage
from snsim.torchgraph.program import Program


def _or(alias, x):
    return x if alias is None else alias


def _added(grads: tuple, into: list) -> tuple:
    """A view node's incoming gradients with each ``(k, t, apart)`` of ``into`` added
    into ``t``: in place, as autograd's input buffer adds into a gradient it holds
    alone, or, ``apart``, out of place, as it sums into one other gradients share
    (executor note [11])."""
    grads = list(grads)
    for k, t, apart in into:
        g = grads[k]
        if g is None:
            grads[k] = t
        elif apart:
            grads[k] = t + g
        else:
            grads[k] = t.add_(g)
    return tuple(grads)


def own_storage(g: torch.Tensor, taken: set) -> torch.Tensor:
    """``g``, or a copy of it where its storage is one ``taken`` already holds,
    its storage then added to ``taken``: one storage per gradient the trace
    counts [5]."""
    if storage_ptr(g) in taken:
        g = g.clone()
    taken.add(storage_ptr(g))
    return g


class _Handles:
    """Hook handles, a list that may grow while backward runs, removed together."""

    def __init__(self, handles: list):
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class Executor(CopyEngines):
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
        self.in_place = in_place_steps(graph, schedule.ops)   # [9]
        # [10] id(parameter) -> (owner layer, its slot in the owner's buffer)
        self.buffer_of: dict[int, tuple[int, int]] = {}
        self.buffer_params: dict[int, list] = {}
        for owner, (_, steps) in graph.param_buffers.items():
            others = {id(q) for u in steps if u != owner for q in program.layers[u].params}
            mine = [q for q in program.layers[owner].params if id(q) in others]
            self.buffer_params[owner] = mine
            for k, q in enumerate(mine):
                self.buffer_of[id(q)] = (owner, k)
        self.recomputed = {op.layer for op in schedule.ops
                           if op.action == COMPUTE and op.phase == "R"}
        self.static_ptrs: set[int] = set()
        # the trace's optimizer, its state created before any step (DESIGN 3a): run
        # at the schedule's optimizer step
        # (offloaded, ZeRO-Offload style: on the host, optim.Offloaded)
        self.optimizer = None
        if graph.optimizer_step is not None and graph.training.offload:
            self.optimizer = optim.Offloaded(graph.training, program.param_list)
        elif graph.optimizer_step is not None:
            self.optimizer = optim.make(graph.training, program.param_list)
            optim.initialize(self.optimizer)
        self.amp = amp.of(graph.training)
        self.open_engines(device)   # one per copy direction, as the simulator models them [4]

    def prepare(self, fresh: bool = False) -> None:
        """Allocate parameter gradients and note static storages.

        ``fresh`` allocates new gradient buffers even where they exist: a CPU
        memory window must see the buffers it will see freed (the profiler
        records no free of memory allocated before the window opened), so a
        measurement calls :meth:`release` before its window's baseline and
        ``prepare(fresh=True)`` after it.
        """
        for p in self.p.param_list:
            if self.g.grads_born:   # set-to-none: each backward makes its gradients
                p.grad = None
            elif p.grad is None or fresh:
                p.grad = torch.zeros_like(p)
        self.static_ptrs = {storage_ptr(t) for t in list(self.p.model.parameters())
                            + list(self.p.model.buffers()) if t.numel()}

    def autocast(self):
        return amp.autocast(self.amp, self.device)

    def state_bytes(self) -> int:
        """Bytes of the optimizer's state in device memory (static, created
        before any step; none when it is offloaded to the host)."""
        if isinstance(self.optimizer, optim.Offloaded):
            return 0
        return optim.state_bytes(self.optimizer)

    def release(self) -> None:
        """Drop the gradient buffers (see :meth:`prepare`)."""
        for p in self.p.param_list:
            p.grad = None

    # ------------------------------------------------------------------ step
    def step(self, batch: Any, annotate: bool = False, hook=None,
             hand_over: bool = False) -> None:
        """One training step on ``batch`` (a host array/tensor: ``F_0`` copies it in).

        ``annotate`` wraps each op in a profiler range ``snsim#k`` so that
        memory events can be attributed to ops (see ``memory.per_op_levels``);
        ``hook(k, "before"|"after")`` is called around each op.  ``hand_over``
        hands dying reads to autograd wherever they are liveness's, measured or
        not (the profiler measures ``bwd_released`` so) [7].
        """
        self.freed_early: set = set()
        self.force_hand_over = hand_over
        self.batch = batch
        self.fresh = set(self.p.param_list)
        self.store: dict = {}
        self.extras: dict[int, list[Saved]] = {}
        self.extras_of: dict[int, list[Saved]] = {}   # layer -> its latest run's S records [2]
        self.edges: dict[int, Edge] = {}
        self.host: dict = {}
        self.events: dict = {}
        self.holding: list = []   # (copy job, the device tensors it holds, op to drop them) [4]
        self.rng: dict[int, Any] = {}
        self.parts: dict[int, int] = {}   # tuple-valued layer -> number of tensors [6]
        self.gview: dict[int, tuple] = {}  # logical G_j -> (storage, size, stride, offset) [5]
        # (storage, j) -> the pieces of X_j whose gradients lie in it [11]:
        # (view output, size, stride, offset)
        self.piece_views: dict[tuple, list] = {}
        self.skeletons: dict = {}         # tuple-valued key -> its structure, for prefetch
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
        self.reap(final=True)
        self.store = self.extras = self.edges = self.host = self.events = {}
        self.extras_of = self.skeletons = {}

    def _do(self, k: int, op) -> None:
        self.k_now = k
        self.reap()
        try:
            act = op.action
            if act == COMPUTE:
                if op.phase == "B":
                    self._backward(op.layer, k)
                elif op.phase == "O":
                    self.optimizer.step()
                else:
                    self._forward(op.layer, op.phase == "R", k in self.in_place)
            elif act == RELEASE:
                if op.tensor in self.freed_early:  # handed to autograd at its step [7]
                    self.freed_early.discard(op.tensor)
                else:
                    self.free(op.tensor)
            elif act == TO_HOST:
                self.offload(op.tensor)
            elif act == TO_DEVICE:
                self.prefetch(op.tensor)
            elif act == SYNC:
                self.wait_copy(op.tensor)
        except ScheduleError as exc:
            raise ScheduleError(f"op {k} ({op}): {exc}") from None

    # --------------------------------------------------------------- compute
    def _forward(self, i: int, recompute: bool, in_place: bool = False) -> None:
        store = self.store
        if i == 0:
            b = self.batch
            if isinstance(b, np.ndarray):
                b = torch.from_numpy(b)
            store[("X", 0)] = b.to(self.device, copy=True)  # the input enters device memory
            return
        if recompute:
            # a resident S_i is overwritten by the recomputation (the ledger's
            # rule): the forward's records let go before the new ones are made [2]
            for rec in self.extras.pop(i, ()):
                rec.t = None
            state, buffers = self._enter_recompute(i)
        elif i in self.recomputed:
            self.rng[i] = self._rng_state()
        try:
            with self.autocast():   # the trace's mixed precision, forward only
                self._run_layer(i, in_place)
        finally:
            if recompute:
                self._leave_recompute(i, state, buffers)

    def _run_layer(self, i: int, in_place: bool = False) -> None:
        g, store = self.g, self.store
        ins = dict.fromkeys(g.layers[i].inputs)
        needs_grad = g.requires_grad[i]
        written = g.in_place_of[i][1] if in_place else None   # [9]
        values, leaves = {}, {}
        for j in ins:
            t = store.get(("X", j))
            if t is None:
                raise ScheduleError(f"needs X{j}, not resident")
            if needs_grad and g.requires_grad[j]:
                aliases = [x.detach().requires_grad_() if x.is_floating_point() else None
                           for x in flat(t)]
                if any(a is not None for a in aliases):
                    leaves[j] = aliases
                    it = iter(aliases)
                    values[j] = remap(t, lambda x: _or(next(it), x))
                    if j == written:
                        values[j] = ShareStorage.apply(values[j])
                    continue
            values[j] = t.detach() if j == written else t
        if not needs_grad:
            with torch.no_grad():
                out = self.p.run(i, values, in_place)
            store[("X", i)] = out
            self._note_parts(i, out)
            return
        records: list[Saved] = []

        def pack(t):
            rec = Saved(t)
            records.append(rec)
            return rec

        seen: dict = {}
        with torch.enable_grad(), saved_tensors_hooks(pack, lambda rec: rec.get(store)):
            out = self.p.run(i, values, in_place, seen)
        pieces = self._piece_edges(i, seen)   # [11]
        seen.clear()
        outs = flat(out)
        out_ptrs = {storage_ptr(o): k for k, o in enumerate(outs)}
        in_ptrs = {storage_ptr(x): (j, k) for j in ins for k, x in enumerate(flat(store[("X", j)]))}
        single = {j: isinstance(store[("X", j)], torch.Tensor) for j in ins}
        extras = []
        for rec in records:
            ptr = storage_ptr(rec.t)
            if ptr in out_ptrs and ptr:
                k = out_ptrs[ptr]
                rec.bind(("X", i), outs[k], None if len(outs) == 1 and out is outs[0] else k)
            elif ptr in in_ptrs and ptr:
                j, k = in_ptrs[ptr]
                rec.bind(("X", j), flat(store[("X", j)])[k], None if single[j] else k)
            elif ptr not in self.static_ptrs:
                extras.append(rec)
        if extras:
            self.extras[i] = self.extras_of[i] = extras
        if any(o.requires_grad for o in outs):
            self.edges[i] = Edge(
                [get_gradient_edge(o) if o.requires_grad else None for o in outs],
                {j: [get_gradient_edge(x) if x is not None else None for x in xs]
                 for j, xs in leaves.items()},
                [o.shape for o in outs], records, pieces)
        for xs in leaves.values():  # [1] the alias must not keep X_j alive
            for x in xs:
                if x is not None:
                    x.data = torch.empty(0, dtype=x.dtype, device=x.device)
        store[("X", i)] = remap(out, lambda o: o.detach())
        self._note_parts(i, out)

    def _piece_edges(self, i: int, seen: dict) -> dict[int, list]:
        """The gradient edges of the pieces of each input layer ``i`` reads through a
        multi-output view, where the plan makes or joins piece gradients [11]."""
        out: dict[int, list] = {}
        for j, mode, _, _ in self.g.grad_plan.get(i, ()):
            if mode != PIECE and mode != PIECE_SHARE and mode not in JOINS:
                continue
            got = self.p.pieces.get(i, {}).get(j)
            parts = seen.get(got[0]) if got is not None else None
            if parts is None:
                raise ScheduleError(f"the trace says layer {i} reads layer {j} through "
                                    "pieces of a view (grad_pieces); the model does not")
            out[j] = [get_gradient_edge(x) if x.requires_grad else None for x in parts]
        return out

    def _note_parts(self, i: int, out: Any) -> None:
        if not isinstance(out, torch.Tensor):  # a tuple-valued layer [6]
            self.parts[i] = len(flat(out))

    def _hand_over(self, k_op: int, edge: Edge) -> None:
        """Give the step's dying reads to autograd [7]."""
        g, ops = self.g, self.schedule.ops
        if self.force_hand_over:
            dying = g.dying.get(ops[k_op].step)
            if not dying or set(dying_reads(g, ops, k_op, self.host)) != dying:
                return False
        elif not hands_over(g, ops, k_op, self.host):
            return False
        for t in dying_reads(g, ops, k_op, self.host):
            if kind(t) == "G":   # the step sums into it (out of place) [5] or joins
                continue         # it [11]: the schedule's free releases it after the step
            if t[0] == "S":
                for rec in self.extras.pop(t[1], []):
                    rec.own(None)
            else:
                value = self.store.pop(t)
                for rec in edge.records:
                    if rec.key == t:
                        rec.own(value)
                del value
            self.freed_early.add(t)
        return True

    def _release_own(self, i: int, k_op: int, pairs) -> Any:
        """With the dying reads handed over, the step's own ``G_i`` goes too once the
        autograd nodes that hold it have run, if the schedule frees it right after
        the step and no node hands it to an input or a parameter [7]."""
        own = self.g.grad_in[i]
        if len(pairs) != 1 or own in self.host \
                or any(old == own or (mode in JOINS and own in old) or mode == PIECE_SHARE
                       for _, mode, _, old in self.g.grad_plan[i]):
            return None   # (the step also sums a gradient it holds into a new buffer)
        for op in self.schedule.ops[k_op + 1:]:
            if op.action != RELEASE:
                return None
            if op.tensor == own:
                break
        else:
            return None
        edge, gx = pairs[0]
        ptr = storage_ptr(gx)
        storage = gx.untyped_storage()
        holders = {edge.node}   # nodes that hold (or will be handed) G_i's storage
        handles = []
        kept = []   # a node handed it on to a leaf or a parameter: it stays

        def post(grad_inputs, grad_outputs, node):
            holders.discard(node)
            for g, (nxt, _) in zip(grad_inputs, node.next_functions):
                if g is None or nxt is None or storage_ptr(g) != ptr:
                    continue
                if not hasattr(nxt, "variable"):
                    if nxt not in holders:   # passed on (a view, a bias's add):
                        holders.add(nxt)     # autograd frees it after that node
                        handles.append(nxt.register_hook(
                            lambda gi, go, n=nxt: post(gi, go, n)))
                else:   # an input's gradient, or a parameter's .grad
                    kept.append(nxt)
            if not holders and not kept:
                storage.resize_(0)

        handles.append(edge.node.register_hook(lambda gi, go: post(gi, go, edge.node)))
        return _Handles(handles)

    def _backward(self, i: int, k_op: int) -> None:
        store = self.store
        edge = self.edges.pop(i, None)
        if edge is None:
            raise ScheduleError(f"backward of layer {i} without its forward graph")
        handed = self._hand_over(k_op, edge)
        if i == self.g.n - 1:
            # the loss's gradient: 1, or the loss scale under fp16 (optim.Scaled)
            gouts = [torch.full(edge.shapes[0], optim.loss_scale(self.optimizer),
                                device=self.device)]
            store[("G", i)] = gouts[0]
        else:
            gout = self._grad(i)
            gouts = gout if isinstance(gout, list) else [gout]
        ins = [j for j in edge.inputs if self.g.requires_grad[j]]
        params = self.p.layers[i].params
        # [11] a piece's contribution goes to the view's edges, not to X_j's leaf
        # (pplan); a layer that reads X_j whole too contributes at the leaf as well
        plan, pplan = {}, {}
        for j, mode, where, old in self.g.grad_plan[i]:
            (pplan if mode == PIECE or mode == PIECE_SHARE else plan)[j] = (mode, where, old)
        own_pieces = [(j, k) for j in ins if j in pplan
                      for k in self.p.pieces[i][j][1] if edge.pieces[j][k] is not None]
        slots = [(j, k) for j in ins if j in plan
                 for k, e in enumerate(edge.inputs[j]) if e is not None]
        targets = [edge.inputs[j][k] for j, k in slots] \
            + [edge.pieces[j][k] for j, k in own_pieces] + params
        pairs = [(e, gx) for e, gx in zip(edge.out, gouts) if e is not None and gx is not None]
        if not targets or not pairs:
            return
        joined, joined_g, adds = self._joined(i, edge, plan)
        n_view = {j: len(ks) for j, ks in edge.pieces.items()}   # [11] each view's outputs
        hooks = [p.register_hook(self._into_buffer(p, i) if id(p) in self.buffer_of
                                 else self._accumulate(p)) for p in params]   # [8], [10]
        for j in pplan.keys() & plan.keys():   # [11] the view's node must not run: its
            node = next(e.node for e in edge.pieces[j] if e is not None)   # pieces wait
            hooks.append(node.register_prehook(lambda grads: (None,) * len(grads)))
        for node, into in adds.items():   # [11] its own piece, added into another's
            hooks.append(node.register_prehook(lambda grads, into=into: _added(grads, into)))
        if handed and i != self.g.n - 1:
            hooks.append(self._release_own(i, k_op, pairs))
        hooks = [h for h in hooks if h is not None]
        try:
            grads = torch.autograd.grad([e for e, _ in pairs] + joined, targets,
                                        grad_outputs=[gx for _, gx in pairs] + joined_g,
                                        allow_unused=True)
        finally:
            for h in hooks:
                h.remove()
        del edge, joined, joined_g, adds
        for owner in self.g.buffer_steps.get(i, ()):   # the last contribution [10]
            if self.g.param_buffers[owner][1][-1] == i:
                parts = store.get(("P", owner))
                if parts is None:
                    raise ScheduleError(f"needs P{owner}, not resident")
                for q, t in zip(self.buffer_params[owner], parts):
                    if t is not None:
                        q.grad.add_(t)
        own = {storage_ptr(gx) for _, gx in pairs}
        taken = set(own)
        got = grads[len(slots):len(slots) + len(own_pieces)]
        for (j, k), gk in zip(own_pieces, got):   # [11] one list per piece tensor,
            if gk is None:                           # indexed by the view's outputs
                continue
            mode, made, olds = pplan[j]
            if mode == PIECE_SHARE:   # a view of the step's own gradient's storage
                if storage_ptr(gk) not in own:
                    raise ScheduleError(f"the trace says layer {i}'s backward hands a piece "
                                        f"of G{j} its own gradient's storage; autograd did not")
                base = store[made]
                self.piece_views.setdefault((made, j), []).append(
                    (k, gk.size(), gk.stride(), gk.storage_offset() - base.storage_offset()))
                continue
            into = None   # a piece a reader before made: autograd's buffer adds in place
            for q in olds or ():
                parts = store.get(q)
                if parts is None:
                    raise ScheduleError(f"needs {tensor_name(q)}, not resident")
                if parts[k] is not None:
                    into = parts
            if into is not None:
                into[k].add_(gk)
            else:
                parts = store.setdefault(made, [None] * n_view[j])
                parts[k] = own_storage(gk, taken)
        del got
        for (j, k), gj in zip(slots, grads):
            if gj is None:
                continue
            key = ("G", j)
            n_parts = self.parts.get(j)
            if n_parts is None:
                mode, where, old = plan[j]
                if mode == SHARE:
                    if storage_ptr(gj) not in own:
                        raise ScheduleError(f"G{j}: the trace says layer {i}'s backward "
                                            "hands it its own gradient's storage; "
                                            "autograd did not")
                    self._bind_grad(j, where, gj)
                elif mode == ADD or mode == JOIN_ADD:
                    self._grad(j).add_(gj)
                elif mode == COPY or mode == JOIN_COPY:
                    total = self._grad(j) + gj
                    del gj
                    store[where] = total
                    self._bind_grad(j, where, total)
                else:   # NEW, JOIN
                    gj = own_storage(gj, taken)
                    store[where] = gj
                    self._bind_grad(j, where, gj)
            else:   # a tuple-valued layer [6]
                mode, where, old = plan[j]
                if mode == SHARE and storage_ptr(gj) in own:   # its one gradient element
                    self._bind_grad(j, where, gj, (k, n_parts))
                    continue
                if j in self.gview:   # that element lives in another layer's storage
                    now = self._grad(j)[k]
                    if mode == ADD:
                        now.add_(gj)
                    else:
                        parts = [None] * n_parts
                        parts[k] = now + gj
                        del self.gview[j], now
                        store[where] = parts
                    continue
                parts = store.setdefault(key, [None] * n_parts)
                if parts[k] is None:
                    parts[k] = gj
                else:
                    parts[k].add_(gj)

    def _joined(self, i: int, edge, plan) -> tuple[list, list, dict]:
        """The other readers' piece gradients that layer ``i``'s backward joins into
        ``G_j``, with the edges of its own view's pieces they are the gradients of,
        and, per view node, those of the pieces ``i`` reads too, which the node's
        buffer adds its own gradient into [11]."""
        outs, grads, adds = [], [], {}
        for j, (mode, _, old) in plan.items():
            if mode not in JOINS:
                continue
            mine = self.p.pieces[i][j][1]
            # (JOIN_ADD's and JOIN_COPY's last is the storage the join is added to)
            for q in old if mode == JOIN else old[:-1]:
                parts = self.store.get(q)
                if parts is None:
                    raise ScheduleError(f"needs {tensor_name(q)}, not resident")
                views = self.piece_views.pop((q, j), None)
                if views is not None:   # pieces in a reader's own gradient storage
                    got = [(k, parts.as_strided(size, stride, parts.storage_offset() + rel))
                           for k, size, stride, rel in views]
                else:
                    got = [(k, gk) for k, gk in enumerate(parts) if gk is not None]
                for k, gk in got:
                    e = edge.pieces[j][k]
                    if k in mine and e is not None:
                        adds.setdefault(e.node, []).append(
                            (k, gk, (i, q) in self.g.piece_sums_out_of_place))
                    else:
                        outs.append(e)
                        grads.append(gk)
        return outs, grads, adds

    def _accumulate(self, p: torch.Tensor):
        """A hook that adds a parameter's gradient into ``p.grad`` the moment autograd
        makes it, as ``loss.backward()``'s AccumulateGrad does, and hands
        ``torch.autograd.grad`` a zero-byte stand-in instead [8]."""
        fresh = self.fresh

        def hook(gp: torch.Tensor) -> torch.Tensor:
            if p in fresh:   # first contribution this step: take it over, as autograd does
                p.grad = gp
                fresh.discard(p)
            else:
                p.grad.add_(gp)
            return gp.new_zeros(()).expand(gp.shape)
        return hook

    def _into_buffer(self, q: torch.Tensor, i: int):
        """A hook that sums shared parameter ``q``'s gradient from layer ``i``'s
        backward into its owner's buffer ``P_p`` [10]."""
        owner, k = self.buffer_of[id(q)]
        key = ("P", owner)
        first = self.g.param_buffers[owner][1][0] == i
        n = len(self.buffer_params[owner])

        def hook(gq: torch.Tensor) -> torch.Tensor:
            parts = self.store.get(key)
            if parts is None:
                if not first:
                    raise ScheduleError(f"needs P{owner}, not resident")
                parts = self.store[key] = [None] * n
            if parts[k] is None:
                parts[k] = gq
            else:
                parts[k].add_(gq)
            return gq.new_zeros(()).expand(gq.shape)
        return hook

    def _bind_grad(self, j: int, where, value: torch.Tensor, part=None) -> None:
        """Logical ``G_j`` is ``value``, a view of the storage ``where`` [5] (its offset
        kept relative to the store's tensor, which a prefetch replaces); ``part``:
        ``(k, n)``, element k of a tuple of n, the only one with a gradient [6]."""
        base = self.store[where]
        self.gview[j] = (where, value.size(), value.stride(),
                         value.storage_offset() - base.storage_offset(), part)

    def _grad(self, i: int):
        """Logical ``G_i``: a view of the storage the plan put it in [5] (a list for a
        tuple-valued layer [6])."""
        view = self.gview.get(i)
        base = self.store.get(view[0] if view is not None else ("G", i))
        if base is None:
            raise ScheduleError(f"needs G{i}, not resident")
        if view is None or isinstance(base, list):
            return base
        _, size, stride, rel, part = view
        if not rel and base.size() == size and base.stride() == stride:
            value = base
        else:
            value = base.as_strided(size, stride, base.storage_offset() + rel)
        if part is None:
            return value
        parts = [None] * part[1]
        parts[part[0]] = value
        return parts

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

    def close(self) -> None:
        if isinstance(self.optimizer, optim.Offloaded):
            self.optimizer.close()
        self.optimizer = None   # its state goes with it
        self.close_engines()

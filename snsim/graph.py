"""The iteration as a graph of steps and tensors (DESIGN.md section 2).

Tensors are small tuples ``(kind, layer)``: ``("X", i)`` the forward output
of layer i, ``("G", i)`` its gradient, ``("S", i)`` its saved extras,
``("P", i)`` the buffer of its shared parameters' gradients, ``("G<c>", i)`` the
piece of ``G_i`` that layer c's backward makes apart (``grad_pieces``).  Steps
are ``(phase, layer)`` with phase ``"F"`` (forward), ``"B"`` (backward) or
``"R"`` (a recomputed forward, outside the route).

:class:`Graph` answers everything a planner or the simulator asks of the
trace: the route, which layers require grad, what each step needs and
allocates, every tensor's last use under the route, and the lower bound.
"""

from __future__ import annotations

import gc
from functools import cached_property
from itertools import repeat

from snsim import devices
from snsim import training as training_state
from snsim.trace.model import Trace

Tensor = tuple[str, int]
Step = tuple[str, int]


def X(i: int) -> Tensor:
    return ("X", i)


def G(i: int) -> Tensor:
    return ("G", i)


def S(i: int) -> Tensor:
    return ("S", i)


def P(i: int) -> Tensor:
    """The buffer autograd sums the gradients of layer i's shared parameters in."""
    return ("P", i)


def piece(c: int, j: int) -> Tensor:
    """The gradient of the pieces of ``X_j`` that layer c reads (``grad_pieces``), kept
    apart until the last such layer's backward joins them into ``G_j``."""
    return (f"G{c}", j)


def kind(t: Tensor) -> str:
    """What ``t`` is, one letter: ``"X"`` a forward result (``X_i`` or another of
    its layer's results), ``"G"`` a gradient (``G_i`` or a piece of it), ``"S"``
    saved extras, ``"P"`` a shared parameters' gradient buffer."""
    return t[0][0]


def result(i: int, k: int) -> Tensor:
    """Result ``k`` of layer i's op (``output_sizes``): ``X_i`` is result 0."""
    return ("X", i) if k == 0 else (f"X{k}", i)


# How a backward step contributes to an input's gradient (Graph.grad_plan)
NEW, SHARE, ADD, COPY = "new", "share", "add", "copy"
# pieces of a multi-output view (grad_pieces): made apart, then joined into G_j as its
# first contribution (JOIN) or added to it in place (JOIN_ADD) or out of place (JOIN_COPY)
PIECE, JOIN, JOIN_ADD, JOIN_COPY = "piece", "join", "join-add", "join-copy"
JOINS = (JOIN, JOIN_ADD, JOIN_COPY)
# a piece whose gradient the step hands on in its own gradient's storage (u + f(v))
PIECE_SHARE = "piece-share"


def tensor_name(t: Tensor) -> str:
    return f"{t[0]}{t[1]}" if len(t[0]) == 1 else f"{t[0]}.{t[1]}"


def step_name(step: Step) -> str:
    return f"{step[0]}{step[1]}"


class Graph:
    """Route, requires-grad, per-step needs/allocs and last uses of a trace."""

    def __init__(self, trace: Trace):
        # ~10^5 small tuples and no reference cycles: the cyclic collector's passes
        # while they are made cost about a fifth of the build on a deep trace
        was = gc.isenabled()
        gc.disable()
        try:
            self._build(trace)
        finally:
            if was:
                gc.enable()

    def _build(self, trace: Trace) -> None:
        self.trace = trace
        layers = trace.layers
        self.n = n = len(layers)
        self.layers = layers
        self.consumers: list[list[int]] = [[] for _ in range(n)]
        consumers = self.consumers
        # each layer's inputs, unique, in order (most layers have one)
        self._ins = ins_of = [layer.inputs if len(layer.inputs) < 2
                              else tuple(dict.fromkeys(layer.inputs)) for layer in layers]
        for i, ins in enumerate(ins_of):
            for j in ins:
                consumers[j].append(i)
        # Reaches the loss (the last layer) through consumers.
        reaches = [False] * n
        reaches[n - 1] = True
        for i in range(n - 2, -1, -1):
            for c in consumers[i]:
                if reaches[c]:
                    reaches[i] = True
                    break
        rg = [False] * n
        for layer in layers:
            i = layer.id
            if layer.kind == "data":
                continue
            rg[i] = reaches[i] and (layer.param_bytes > 0
                                    or any(map(rg.__getitem__, layer.inputs)))
        self.reaches_loss = reaches
        self.requires_grad = rg
        # Gradient G_j is allocated by the first backward step that contributes to
        # it: the largest-id consumer that requires grad (consumers are in id order).
        self.grad_owner: list[int | None] = [None] * n
        for j in range(n):
            if rg[j]:
                for c in reversed(consumers[j]):
                    if rg[c]:
                        self.grad_owner[j] = c
                        break
        # One tuple object per tensor: every map below (sizes, needs, allocs, the
        # gradient plan, in-place inputs) holds the same object for a tensor, so
        # the hot loops' set and dict lookups find it by identity before comparing
        # tuples (the verifier's walk ~10% faster on ResNet-2500)
        # (and one int object per layer index in all of them, and in the steps
        # below: hashing a tuple reads its int, and a layer's tensors and steps are
        # read together)
        ids = list(range(n))
        self._xs = xs = [("X", i) for i in ids]
        self._gs = gs = [("G", i) for i in ids]
        self._ss = ss = [("S", i) for i in ids]
        self._ps: dict[int, Tensor] = {}
        # op-log traces (DESIGN, "Op-log traces"): results of multi-result layers
        self.x_bytes = [layer.output_bytes for layer in layers]
        self.result_bytes: dict[Tensor, int] = {}
        extras = [layer for layer in layers if layer.extra]   # the op-log fields, if any
        for layer in extras:
            sizes = layer.extra.get("output_sizes")
            if sizes:
                self.x_bytes[layer.id] = int(sizes[0])
                for k in range(1, len(sizes)):
                    if sizes[k] > 0:
                        self.result_bytes[result(layer.id, k)] = int(sizes[k])
        # layers whose recompute re-makes several results (resident ones in place)
        self._results = {t: t for t in self.result_bytes}   # each result's one tuple
        self.results_of: dict[int, tuple[Tensor, ...]] = {}
        for t in self.result_bytes:
            self.results_of[t[1]] = self.results_of.get(t[1], ()) + (t,)
        self.multi_result = frozenset(self.results_of)
        # every tensor's bytes, looked up by the hot loops (``size`` is its getter)
        # The byte counts as one int object per value (``_same``): a deep network
        # repeats a few shapes, and every read of a count writes its object's
        # reference count, so thousands of equal ints spread over the heap are
        # cache misses where a few shared ones are not
        self._same_int: dict[int, int] = {}
        one = self._same_int.setdefault   # (ints only: see _same)
        sizes: dict[Tensor, int] = {}
        self.sizes = sizes
        self.x_bytes = x_bytes = self._same(self.x_bytes)
        for layer in layers:
            i = layer.id
            sizes[xs[i]] = x_bytes[i]
            s, g = layer.saved_extra_bytes, layer.gradient_bytes
            sizes[ss[i]] = one(s, s) if type(s) is int else s
            sizes[gs[i]] = one(g, g) if type(g) is int else g
        sizes.update(zip(self.result_bytes, self._same(self.result_bytes.values())))
        # in-place layers that write their output into an input's storage (DESIGN 3,
        # "In-place storage"): layer -> the tensor whose storage X_i takes over
        self.in_place_of: dict[int, Tensor] = {}
        for layer in extras:
            j = layer.extra.get("inplace_of")
            if layer.extra.get("inplace_alias") and j in layer.inputs \
                    and j not in self.results_of and "input_results" not in layer.extra:
                self.in_place_of[layer.id] = xs[j]
        self._plan_gradients()
        # Training state (DESIGN 3a): the optimizer step ("O", n) follows the route
        # (``route`` stays the planners' forward and backward steps; ``plan`` appends
        # it to every schedule); it reads weights, gradients and state (static, or
        # born in backward: not tensors a schedule moves) and holds its temporaries
        # as workspace.
        self.training = t = trace.training
        self.grads_born = bool(t is not None and t.set_to_none)
        self.optimizer_step: Step | None = ("O", n) if t is not None and t.has_step else None
        self._plan_param_buffers()
        # One tuple object per step, as per tensor: the route's steps are the keys of
        # needs_map and allocs_map (a lookup matches by identity, without comparing
        # tuples), and planners take their steps from ``steps`` (per phase, by layer)
        self.steps: dict[str, list[Step]] = {ph: [(ph, i) for i in ids] for ph in "FRB"}
        self.route: list[Step] = list(self.steps["F"])
        bs = self.steps["B"]
        self.route += [bs[i] for i in range(n - 1, -1, -1) if rg[i]]
        # step -> tensors it needs / allocates (read-only; needs() and allocs() per step)
        self.needs_map: dict[Step, tuple[Tensor, ...]] = {}
        self.allocs_map: dict[Step, tuple[Tensor, ...]] = {}
        self._build_steps()

    # ------------------------------------------------------------------ steps
    def _build_steps(self) -> None:
        """``needs_map`` and ``allocs_map``: per layer, its forward (and recompute)
        step, then its backward step where it requires grad."""
        xs, ss, gs, ps = self._xs, self._ss, self._gs, self._ps
        needs_map, allocs_map = self.needs_map, self.allocs_map
        results_of, grad_in, grad_plan = self.results_of, self.grad_in, self.grad_plan
        rg, buffer_steps = self.requires_grad, self.buffer_steps
        last_i = self.n - 1
        # the same tuples by layer, per phase (step_tables), as they are made
        f_needs, f_allocs, b_needs, b_allocs = [], [], [None] * self.n, [None] * self.n
        fs, rs, bs = self.steps["F"], self.steps["R"], self.steps["B"]
        self._tables = {"F": (f_needs, f_allocs), "R": (f_needs, f_allocs),
                        "B": (b_needs, b_allocs)}
        for i, layer in enumerate(self.layers):
            ins = self._ins[i]
            more = results_of.get(i, ()) if results_of else ()
            saved = layer.saved_extra_bytes
            fwd_allocs = (xs[i],) + more + ((ss[i],) if saved else ())
            reads = layer.extra.get("input_results") if layer.extra else None
            fwd_needs = tuple(t for t in dict.fromkeys(self.read(j, k) for j, k in reads)
                              if t is not None) if reads else tuple(map(xs.__getitem__, ins))
            needs_map[fs[i]] = fwd_needs
            allocs_map[fs[i]] = fwd_allocs
            needs_map[rs[i]] = fwd_needs
            allocs_map[rs[i]] = fwd_allocs
            f_needs.append(fwd_needs)
            f_allocs.append(fwd_allocs)
            if not rg[i]:
                continue
            last = i == last_i
            needs: list[Tensor] = [] if last else [grad_in[i]]
            if saved:
                needs.append(ss[i])
            bwd_reads = layer.bwd_reads
            if "inputs" in bwd_reads:    # layer.reads_inputs
                needs.extend(map(xs.__getitem__, ins))
            if "output" in bwd_reads:    # layer.reads_output
                needs.append(xs[i])
            allocs: list[Tensor] = [gs[i]] if last else []
            for _, mode, store, old in grad_plan[i]:
                if mode == NEW or mode == COPY or mode == JOIN or mode == JOIN_COPY \
                        or (mode == PIECE and store is not None):
                    allocs.append(store)
                if mode == ADD or mode == COPY:
                    needs.append(old)
                elif mode in JOINS or (mode == PIECE and old):
                    needs.extend(old)
            if buffer_steps:
                for p in buffer_steps.get(i, ()):   # shared parameters' buffers
                    (allocs if self.param_buffers[p][1][0] == i else needs).append(ps[p])
            needs_map[bs[i]] = b_needs[i] = tuple(dict.fromkeys(needs)) \
                if len(needs) > 1 else tuple(needs)
            allocs_map[bs[i]] = b_allocs[i] = tuple(dict.fromkeys(allocs)) \
                if len(allocs) > 1 else tuple(allocs)

    def _plan_gradients(self) -> None:
        """Which storage holds each ``G_j`` at each backward step (DESIGN 3,
        "Gradient storage").

        In route order: the first contributor to ``G_j`` makes it, in a new
        buffer ``("G", j)`` (``NEW``) or, where autograd hands ``j`` the step's
        own output gradient (``grad_shares``: ``add``, ``cat``), in that storage
        (``SHARE``: nothing allocated).  A later contribution is added in place
        (``ADD``) unless the storage is shared with another gradient still to be
        read, or ``G_j`` is a part of it (a slice of ``cat``'s): then autograd
        sums out of place into a new buffer ``("G", j)`` (``COPY``), as its
        input buffers do.  Without ``grad_shares`` every ``G_j`` is ``("G", j)``
        and this is the plain rule of section 3.

        Where two or more layers read ``X_j`` through pieces of one multi-output
        view (``grad_pieces``: ``u, v = x.chunk(2)``), each but the last of them
        makes its pieces' gradient apart (``PIECE``: a new tensor ``piece(i,
        j)``; where a reader before made some of its pieces, it adds into
        those, needing them: ``old`` names them, and the store is None where it
        makes nothing new), and the last joins them all, needing the others'
        pieces, as the view's one backward node does once it has them all: into
        a new ``("G", j)`` where that is the first contribution to ``G_j``
        (``JOIN``), else added to ``G_j`` as any contribution is (``JOIN_ADD``,
        ``JOIN_COPY``, whose ``old`` ends with the storage added to).  Each
        view of ``X_j`` with such readers joins apart.  Layers that read
        ``X_j`` whole contribute as they always do.
        """
        n, rg, layers, gs = self.n, self.requires_grad, self.layers, self._gs
        # layer j -> its views' groups: the layers whose pieces autograd joins into
        # G_j, in backward order; (layer, j) -> the group it is in
        groups, member, adds_to, passed, whole = self._piece_groups()
        self.piece_groups = groups
        pieces_in: dict[tuple[int, int], Tensor] = {}   # (c, j) -> storage of c's piece
        # (last reader, storage of a piece it reads too that it sums out of place)
        self.piece_sums_out_of_place: set[tuple[int, Tensor]] = set()
        cur: dict[int, Tensor] = {}        # logical G_j -> storage now holding it
        # storage -> the gradients in it still to be read (whose backward has not run),
        # and the pieces in it still to be joined
        live: dict[Tensor, set] = {}
        self.grad_in: list[Tensor | None] = [None] * n
        self.grad_plan: dict[int, tuple] = {}
        for i in range(n - 1, -1, -1):
            if not rg[i]:
                continue
            own = cur.get(i, gs[i])   # the loss makes its own
            self.grad_in[i] = own
            readers = live.get(own)
            if readers is not None:
                readers.discard(i)   # this step reads G_i for the last time
            shares = layers[i].extra.get("grad_shares", ())
            plan = []
            for j in dict.fromkeys(layers[i].inputs):
                if not rg[j]:
                    continue
                group = member.get((i, j)) if member else None
                joined = ()
                if group is not None:
                    if i != group[-1] and (i, j) in passed:
                        pieces_in[(i, j)] = own   # it lives while the piece waits
                        live.setdefault(own, set()).add(piece(i, j))
                        plan.append((j, PIECE_SHARE, own, None))
                        continue
                    if i != group[-1]:
                        made = piece(i, j) if piece(i, j) in self.sizes else None
                        plan.append((j, PIECE, made, adds_to.get((i, j))))
                        if (i, j) not in whole:
                            continue
                        # and X_j whole: a contribution to G_j as well, below
                    else:
                        joined = tuple(dict.fromkeys(
                            pieces_in.get((c, j), piece(c, j)) for c in group[:-1]
                            if (c, j) in pieces_in or piece(c, j) in self.sizes))
                        into = adds_to.get((i, j), ())
                        for c in group[:-1]:
                            if (c, j) in pieces_in:
                                at = pieces_in[(c, j)]
                                live[at].discard(piece(c, j))
                                if piece(c, j) in into and live[at]:
                                    # it adds its own gradient of that piece into a
                                    # storage other gradients are in: out of place
                                    self.piece_sums_out_of_place.add((i, at))
                if groups and j in groups:
                    first = j not in cur   # a piece reader before may not have made it
                else:
                    first = self.grad_owner[j] == i
                if joined and first:
                    cur[j] = gs[j]
                    live.setdefault(gs[j], set()).add(j)
                    plan.append((j, JOIN, gs[j], joined))
                    continue
                if first:
                    if j in shares and i != n - 1 and (i, j) not in passed:
                        cur[j] = own
                        plan.append((j, SHARE, own, None))
                    else:
                        cur[j] = gs[j]
                        plan.append((j, NEW, gs[j], None))
                    readers = live.get(cur[j])
                    if readers is None:
                        readers = live[cur[j]] = set()
                    readers.add(j)
                    continue
                old = cur[j]
                part = self.size(old) != layers[j].gradient_bytes
                if part or len(live[old]) > 1:   # a part, or shared with another
                    cur[j] = gs[j]
                    live[old].discard(j)
                    live.setdefault(gs[j], set()).add(j)
                    plan.append((j, JOIN_COPY, gs[j], joined + (old,)) if joined
                                else (j, COPY, gs[j], old))
                else:
                    plan.append((j, JOIN_ADD, old, joined + (old,)) if joined
                                else (j, ADD, old, old))
            self.grad_plan[i] = tuple(plan)

    def _piece_groups(self) -> tuple[dict, dict, dict, set, set]:
        """Per layer j part of whose gradient autograd assembles from pieces
        (``grad_pieces``, DESIGN 3, "Gradient storage"): one group per view of
        ``X_j`` whose pieces two or more backward steps read, those steps in
        backward order.  Each but the last makes ``piece(c, j)`` of the pieces no
        step before it made (none: no tensor) and adds into the tensors of those
        it reads that one did (``adds_to[(c, j)]``); the last's are joined with
        them (added into those a step before it made, inside its step).  A step
        that also lists ``j`` in ``grad_shares`` hands its one piece its own
        gradient's storage (``passed``: ``u + relu(v)``'s add), where that
        piece is read by no other step.  A step that lists ``j`` in
        ``grad_whole`` reads ``X_j`` whole too (``whole``): that contribution
        goes to ``G_j`` (the last's is joined with the pieces)."""
        listed: dict[tuple[int, int], dict[int, dict]] = {}   # (j, view) -> {c: pieces}
        groups: dict[int, tuple[tuple[int, ...], ...]] = {}
        member: dict[tuple[int, int], tuple[int, ...]] = {}
        adds_to: dict[tuple[int, int], tuple[Tensor, ...]] = {}
        passed: set[tuple[int, int]] = set()
        whole: set[tuple[int, int]] = set()
        for layer in self.layers:
            if layer.extra and "grad_pieces" in layer.extra:
                whole.update((layer.id, j) for j in layer.extra.get("grad_whole", ()))
                for entry in layer.extra["grad_pieces"]:
                    j, nb = entry[0], entry[1]
                    view = entry[2] if len(entry) > 2 else 0
                    # a short entry's pieces are its own: no other reader reads them
                    got = dict(zip(entry[3::2], entry[4::2])) if len(entry) > 2 \
                        else {("own", layer.id): nb}
                    listed.setdefault((j, view), {})[layer.id] = got
                    if j in layer.extra.get("grad_shares", ()):
                        passed.add((layer.id, j))
        if not listed:
            return groups, member, adds_to, passed, whole
        rg, one = self.requires_grad, self._same_int.setdefault
        for (j, _), by in listed.items():
            if not rg[j]:
                continue
            contributors = [c for c in reversed(self.consumers[j]) if rg[c] and c in by]
            if len(contributors) < 2:
                continue
            maker: dict = {}   # piece -> the step whose tensor holds it
            for c in contributors[:-1]:
                for k in by[c]:
                    maker.setdefault(k, c)
            last = contributors[-1]
            shared = {c for c in contributors[:-1] if (c, j) in passed}
            if any(len(by[c]) != 1 or any(maker[k] != c for k in by[c]) or (c, j) in whole
                   for c in shared) \
                    or any(maker.get(k) in shared for c in contributors[1:-1] for k in by[c]
                           if maker.get(k) != c):
                continue   # a shared piece that is not one reader's one piece
            group = tuple(contributors)
            groups[j] = groups.get(j, ()) + (group,)
            for c in group:
                member[(c, j)] = group
            for c in contributors[:-1]:
                nb = sum(b for k, b in by[c].items() if maker[k] == c)
                if nb and c not in shared:
                    self.sizes[piece(c, j)] = one(nb, nb)
                olds = tuple(dict.fromkeys(piece(maker[k], j) for k in by[c] if maker[k] != c))
                if olds:
                    adds_to[(c, j)] = olds
            olds = tuple(dict.fromkeys(piece(maker[k], j) for k in by[last] if k in maker))
            if olds:   # the last reader's own gradients of them are added into them
                adds_to[(last, j)] = olds
        return groups, member, adds_to, passed, whole

    def _plan_param_buffers(self) -> None:
        """Shared parameters (DESIGN 3, "Shared parameters"; capture note [11]).

        A parameter that several backward steps differentiate gets its gradient
        contributions summed by autograd in a buffer of its own, from the first
        contributing step to the last, which adds it into ``.grad``.  Per owner
        layer ``p`` (the one whose ``param_bytes`` count the parameters) that is
        ``("P", p)``, of the most bytes any later layer lists for it in
        ``param_shares``: made by the first contributor, needed by the others.
        With ``set-to-none`` gradients the buffer *is* the gradient: it is born
        at the first contributor instead of the owner (``born_bytes``), and there
        is no ``("P", p)``."""
        rg, layers = self.requires_grad, self.layers
        users: dict[int, list[int]] = {}
        shared: dict[int, int] = {}
        for layer in layers:
            for p, nb in layer.extra.get("param_shares", ()):
                users.setdefault(p, []).append(layer.id)
                shared[p] = max(shared.get(p, 0), nb)
        # owner -> (bytes, contributing backward steps' layers in backward order)
        self.param_buffers: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.buffer_steps: dict[int, list[int]] = {}   # layer -> owners it contributes to
        # parameter-gradient bytes each backward step makes under set-to-none
        self.born_bytes = [layer.param_bytes for layer in layers]
        for p, us in users.items():
            steps = tuple(sorted({u for u in us + [p] if rg[u]}, reverse=True))
            if len(steps) < 2 or not shared[p]:
                continue
            if self.grads_born:
                self.born_bytes[steps[0]] += shared[p]
                if rg[p]:
                    self.born_bytes[p] -= shared[p]
                continue
            self.param_buffers[p] = (shared[p], steps)
            self._ps[p] = P(p)
            self.sizes[self._ps[p]] = shared[p]
            for u in steps:
                self.buffer_steps.setdefault(u, []).append(p)

    def step_label(self, step: Step) -> str:
        """``B3 (conv3)``; the optimizer step ``O8 (adam step)``."""
        if step[0] == "O":
            return f"{step_name(step)} ({self.training.optimizer} step)"
        return f"{step_name(step)} ({self.layers[step[1]].name})"

    def needs(self, step: Step) -> tuple[Tensor, ...]:
        """Tensors that must be resident when ``step`` runs (read or accumulated)."""
        return self.needs_map[step]

    def allocs(self, step: Step) -> tuple[Tensor, ...]:
        """Tensors ``step`` creates (a recompute re-creates the forward's)."""
        return self.allocs_map[step]

    def param_grad_bytes(self, step: Step) -> int:
        """Parameter-gradient bytes ``step`` allocates: with ``set-to-none``
        gradients, a backward step makes its layer's (kept to the iteration's end)."""
        if self.grads_born and step[0] == "B":
            return self.born_bytes[step[1]]
        return 0

    @cached_property
    def optimizer_ms(self) -> float:
        """The optimizer step's time: measured, or bytes moved over the device's
        memory bandwidth (the trace's preset; else ``training.DEFAULT_STEP_Bps``)."""
        t = self.training
        if t is None or not t.has_step:
            return 0.0
        if t.offload:
            return self.host_step_ms
        if t.step_ms is not None:
            return float(t.step_ms)
        key = self.trace.source.get("device_model")
        bw = devices.PRESETS[key].mem_Bps if key in devices.PRESETS \
            else training_state.DEFAULT_STEP_Bps
        return training_state.modeled_step_ms(t.optimizer, self.trace.param_bytes, bw,
                                              t.amsgrad)

    @property
    def host_step_ms(self) -> float:
        """The offloaded step (ZeRO-Offload): gradients to the host, the step there
        (measured when the trace was measured on a CPU, else bytes moved at
        ``training.DEFAULT_STEP_Bps``), parameters back; one after the other."""
        t, trace = self.training, self.trace
        p = trace.param_bytes
        if t.step_ms is not None and trace.source.get("device") == "cpu":
            host = float(t.step_ms)
        else:
            host = training_state.modeled_step_ms(t.optimizer, p,
                                                  training_state.DEFAULT_STEP_Bps, t.amsgrad)
        return host + 1e3 * p / trace.device.d2h_Bps + 1e3 * p / trace.device.h2d_Bps

    @property
    def optimizer_copy_bytes(self) -> int:
        """Bytes the offloaded step copies each way (gradients down, parameters up)."""
        t = self.training
        return self.trace.param_bytes if t is not None and t.has_step and t.offload else 0

    @cached_property
    def optimizer_transient_bytes(self) -> int:
        """The optimizer step's temporaries: measured, or modeled for ``foreach``."""
        t = self.training
        if t is None or not t.has_step or t.offload:   # offloaded: temporaries on the host
            return 0
        if t.step_transient_bytes is not None:
            return t.step_transient_bytes
        return training_state.modeled_transient_bytes(t.optimizer, self.trace.param_bytes)

    def read(self, j: int, k: int) -> Tensor | None:
        """The tensor a consumer of result ``k`` of layer j needs: that result;
        ``X_j`` for result 0, or for a result without bytes of a view layer
        (``alias_of``: ``X_j`` holds the storage); None for another empty result."""
        if k == 0:
            return self._xs[j]
        t = self._results.get(result(j, k))
        if t is not None:
            return t
        return self._xs[j] if "alias_of" in self.layers[j].extra else None

    def size(self, t: Tensor) -> int:
        return self.sizes[t]

    def alias_bytes(self, i: int) -> int:
        """Bytes an in-place layer ``i`` writes into its input's storage instead of
        allocating them (DESIGN 3, "In-place storage"), when that input dies at it."""
        return min(self.sizes[X(i)], self.sizes[self.in_place_of[i]])

    def workspace_bytes(self, step: Step, algo: int = 0) -> int:
        if step[0] == "O":
            return self.optimizer_transient_bytes
        ws = self.layers[step[1]].workspace
        if not ws:
            return 0
        w = ws[algo]
        return w.backward_bytes if step[0] == "B" else w.fwd_bytes

    def min_workspace_bytes(self, step: Step) -> int:
        if step[0] == "O":
            return self.optimizer_transient_bytes
        ws = self.layers[step[1]].workspace
        if not ws:
            return 0
        return min(w.backward_bytes if step[0] == "B" else w.fwd_bytes for w in ws)

    def bwd_released(self, step: Step, algo: int = 0) -> int | None:
        """A backward step's peak above the level before it when its dying reads are
        handed to autograd, if the trace measured it (DESIGN, "Dying reads")."""
        if step[0] != "B":
            return None
        ws = self.layers[step[1]].workspace
        return ws[algo].bwd_released if ws else None

    @cached_property
    def written(self) -> dict[Step, tuple[Tensor, ...]]:
        """Per backward step, the tensors it writes into in place: a gradient it
        adds its contribution to (``ADD``, ``JOIN_ADD``, a piece another step
        made), and a shared
        parameters' buffer after its first contributor.  A host copy made
        before such a step is stale after it."""
        out: dict[Step, tuple[Tensor, ...]] = {}
        for i, plan in self.grad_plan.items():
            ts = [store for _, mode, store, _ in plan if mode == ADD or mode == JOIN_ADD]
            ts += [t for _, mode, _, old in plan if mode == PIECE and old for t in old]
            ts += [P(p) for p in self.buffer_steps.get(i, ())
                   if self.param_buffers[p][1][0] != i]
            if ts:
                out[("B", i)] = tuple(dict.fromkeys(ts))
        return out

    @cached_property
    def dying(self) -> dict[Step, frozenset]:
        """Per backward step, the tensors it needs for the last time on the route
        (what ``liveness`` frees right after it), less its own output gradient."""
        last = self.last_use
        out = {}
        for k, step in enumerate(self.route):
            if step[0] == "B":
                own = self.grad_in[step[1]]
                out[step] = frozenset(t for t in self.needs_map[step]
                                      if last.get(t) == k and t != own and t[0] != "P")
        return out

    def _same(self, values) -> list:
        """``values`` with each int the graph's one object of its value (see
        ``sizes`` in ``_build``); anything else (None) as it is, so that no value
        changes type (``2.0 == 2``)."""
        pool = self._same_int
        return [pool.setdefault(v, v) if type(v) is int else v for v in values]

    def step_ms(self, step: Step, algo: int = 0) -> float:
        """Duration of a step; algorithm ``algo`` of the layer's workspace list."""
        if step[0] == "O":
            return self.optimizer_ms
        layer = self.layers[step[1]]
        if layer.workspace and algo:
            w = layer.workspace[algo]
            return w.bwd_ms if step[0] == "B" else w.fwd_ms
        return layer.bwd_ms if step[0] == "B" else layer.fwd_ms

    def step_bytes(self, step: Step) -> int:
        """Bytes of what a step needs and allocates (no workspace, no statics)."""
        sizes = self.sizes
        return (sum([sizes[t] for t in self.needs_map[step]])
                + sum([sizes[t] for t in self.allocs_map[step]]))

    @cached_property
    def step_tables(self) -> dict[str, tuple[list, list]]:
        """Per phase (``F``, ``R``, ``B``): the needs and the allocs of each layer's
        step, indexed by layer (None where the layer has no such step): the two
        maps as lists, for the per-op loops (an index instead of a tuple hashed)."""
        # F and R steps share their tuples: one pair of lists for both, filled
        # by _build_steps as it makes the two maps
        return self._tables

    @cached_property
    def needs_bytes_table(self) -> dict[str, list]:
        """Per phase (``F``, ``R``, ``B``), per layer: the bytes of all that its
        step needs, None where the layer has no such step (summed in C: the lower
        bound and the recomputation planners read it)."""
        sizes = self.sizes.__getitem__
        tables = self.step_tables
        fwd = self._same(map(sum, map(map, repeat(sizes), tables["F"][0])))   # R: the same
        return {"F": fwd, "R": fwd, "B": self._same(
            None if nd is None else sum(map(sizes, nd)) for nd in tables["B"][0])}

    @cached_property
    def alloc_bytes_table(self) -> dict[str, list]:
        """Per phase (``F``, ``R``, ``B``), per layer: the bytes of all that its
        step allocates (what it makes when none of it is resident yet), None where
        the layer has no such step."""
        sizes = self.sizes.__getitem__
        tables = self.step_tables
        fwd = self._same(map(sum, map(map, repeat(sizes), tables["F"][1])))   # R: the same
        return {"F": fwd, "R": fwd, "B": self._same(
            None if a is None else sum(map(sizes, a)) for a in tables["B"][1])}

    @cached_property
    def plain_workspace(self) -> dict[str, list]:
        """Per phase (``F``, ``R``, ``B``), per layer: the workspace of its step with
        the first algorithm where that is all there is to it (no in-place input
        for ``F``/``R``, no measured hand-over peak for ``B``: then the ledger's
        ``workspace`` is ``workspace_bytes``); None where the ledger must work it
        out from the ops around the step."""
        fwd, bwd = [], []
        in_place = self.in_place_of
        for layer in self.layers:
            ws = layer.workspace
            fwd.append(None if layer.id in in_place else (ws[0].fwd_bytes if ws else 0))
            bwd.append((None if ws[0].bwd_released is not None else ws[0].backward_bytes)
                       if ws else 0)
        fwd = self._same(fwd)
        return {"F": fwd, "R": fwd, "B": self._same(bwd)}

    @cached_property
    def algorithms(self) -> dict[str, list[tuple]]:
        """Per phase (``F``, ``R``, ``B``), per layer: its step's algorithms as
        ``(workspace_bytes(step, k), step_ms(step, k))`` pairs in workspace order,
        ``()`` for a layer without a workspace list (for the planners that pick an
        algorithm per step, without two method calls per algorithm)."""
        same: dict = {}
        fwd, bwd = [], []
        for layer in self.layers:
            ws = layer.workspace
            if not ws:
                fwd.append(())
                bwd.append(())
                continue
            f = [(w.fwd_bytes, w.fwd_ms) for w in ws]
            b = [(w.backward_bytes, w.bwd_ms) for w in ws]
            f[0], b[0] = (ws[0].fwd_bytes, layer.fwd_ms), (ws[0].backward_bytes, layer.bwd_ms)
            fwd.append(same.setdefault(tuple(f), tuple(f)))
            bwd.append(same.setdefault(tuple(b), tuple(b)))
        return {"F": fwd, "R": fwd, "B": bwd}

    @cached_property
    def plain_ms(self) -> dict:
        """Per phase (``F``, ``R``, ``B``), per layer: its step's duration with the
        first algorithm (``step_ms(step)``); ``O``: the optimizer step's, by layer.
        Read by the simulator's op loops and the planners' estimates (never
        change it)."""
        same: dict[float, float] = {}   # one float object per value, as _same's ints

        def one(v):
            return same.setdefault(v, v) if type(v) is float else v
        fwd = [one(layer.fwd_ms) for layer in self.layers]
        out: dict = {"F": fwd, "R": fwd, "B": [one(layer.bwd_ms) for layer in self.layers]}
        if self.optimizer_step is not None:
            out["O"] = {self.optimizer_step[1]: self.optimizer_ms}
        return out

    # ------------------------------------------------------------- analyses
    @cached_property
    def last_use(self) -> dict[Tensor, int]:
        """Route index of the last step that needs or allocates each tensor, or
        later where :attr:`holds` keeps it."""
        last = self._uses_end()
        for t, k in self.holds.items():
            if k > last.get(t, -1):
                last[t] = k
        return last

    def _uses_end(self) -> dict[Tensor, int]:
        last: dict[Tensor, int] = {}
        for k, step in enumerate(self.route):
            for t in self.needs_map[step]:
                last[t] = k
            for t in self.allocs_map[step]:
                last[t] = k
        return last

    # ------------------------------------------------- op-log traces (DESIGN)
    @cached_property
    def views(self) -> tuple[tuple[int, ...], ...]:
        """Per layer, the layers whose output is a view of its storage (``alias_of``)."""
        per: dict[int, list[int]] = {}   # only the layers that have views
        for layer in self.layers:
            alias = layer.extra.get("alias_of")
            if alias:
                for j, _ in alias:
                    v = per.setdefault(j, [])
                    if layer.id not in v:
                        v.append(layer.id)
        views: list[tuple[int, ...]] = [()] * self.n
        for j, v in per.items():
            views[j] = tuple(v)
        return tuple(views)

    @cached_property
    def holds(self) -> dict[Tensor, int]:
        """Route index through which a result must stay resident although no step
        needs it: its release point (``released_after``, ``output_released_after``,
        when the trace says ``free_at: release``) and that of every view of its
        storage (``alias_of``: a storage lives while any view of it does).  Empty
        for a trace with neither field."""
        layers = self.layers
        release = self.trace.extra.get("free_at") == "release"
        if not release and not any(self.views):
            return {}
        end = self._uses_end()
        hold: dict[Tensor, int] = {}

        def extend(t: Tensor, k: int) -> None:
            if k > hold.get(t, -1):
                hold[t] = k

        for i in range(self.n - 1, -1, -1):   # views come after their storage's owner
            extra = layers[i].extra
            if release:
                per = extra.get("output_released_after")
                if per is not None:
                    for k, rel in enumerate(per):
                        t = self.read(i, k)
                        if t is not None:
                            extend(t, rel)
                elif "released_after" in extra:
                    extend(X(i), extra["released_after"])
            alias = extra.get("alias_of")
            if alias:
                mine = (X(i),) + self.results_of.get(i, ())
                keep = max(max(hold.get(t, -1), end.get(t, -1)) for t in mine)
                for j, k in alias:
                    t = self.read(j, k)
                    if t is not None:
                        extend(t, keep)
        return {t: k for t, k in hold.items() if k > end.get(t, -1)}

    @cached_property
    def compute_ms(self) -> float:
        """Pure compute time of the route with each layer's first algorithm, and the
        optimizer step's."""
        return sum(self.step_ms(s) for s in self.route) + self.optimizer_ms

    @cached_property
    def lower_bound_bytes(self) -> int:
        """Static + the largest single step's own need (DESIGN section 2).

        A backward step with a measured hand-over peak needs at least what it
        reads plus that peak (DESIGN, "Dying reads").  Parameter gradients born in
        backward (``set-to-none``) are resident from their step on, in every
        schedule, so each step also needs those made up to and including it."""
        born = 0
        best = 0
        least = self.least_step_bytes
        born_bytes = self.born_bytes if self.grads_born else None
        reads, all_bytes = self.needs_bytes_table, self.alloc_bytes_table
        # a step with no in-place input and no measured hand-over peak needs its
        # reads, its allocs and its smallest workspace (least_step_bytes, inline)
        simple = self.simple_min_workspace
        for phase, i in self.route:
            if born_bytes is not None and phase == "B":   # param_grad_bytes, inline
                born += born_bytes[i]
            ws = simple[phase][i]
            if ws is None:
                need = least((phase, i))
            else:
                need = reads[phase][i] + all_bytes[phase][i] + ws
            need += born
            if need > best:
                best = need
        if self.optimizer_step:
            need = born + least(self.optimizer_step)
            if need > best:
                best = need
        return self.trace.static_bytes + best

    @cached_property
    def simple_min_workspace(self) -> dict[str, list]:
        """Per phase (``F``, ``R``, ``B``), per layer: the smallest workspace of its
        step where that is all :meth:`least_step_bytes` adds to what the step reads
        and allocates (no in-place input for ``F``/``R``, no measured hand-over
        peak for ``B``; 0 without workspace); None where it works out more."""
        in_place = self.in_place_of
        fwd, bwd = [], []
        for layer in self.layers:
            ws = layer.workspace
            if not ws:
                fwd.append(None if layer.id in in_place else 0)
                bwd.append(0)
                continue
            fwd.append(None if layer.id in in_place else min(w.fwd_bytes for w in ws))
            bwd.append(None if any(w.bwd_released is not None for w in ws)
                       else min(w.backward_bytes for w in ws))
        return {"F": fwd, "R": fwd, "B": bwd}

    def least_step_bytes(self, step: Step) -> int:
        """The smallest level ``step`` itself can run at, over its workspace entries:
        what it reads and allocates (less what an in-place step writes into its
        dying input), plus the smallest workspace; a backward step with a measured
        hand-over peak at least what it reads plus that peak."""
        if step[0] == "O":
            return self.optimizer_transient_bytes
        size = self.sizes.__getitem__
        reads = sum(map(size, self.needs_map[step]))
        need = reads + sum(map(size, self.allocs_map[step]))
        if step[0] != "B" and step[1] in self.in_place_of:
            need -= self.alias_bytes(step[1])   # its input dies into its output
        ws = self.layers[step[1]].workspace
        if not ws:
            return need
        if step[0] != "B":
            return need + min(w.fwd_bytes for w in ws)
        best = need + min(w.backward_bytes for w in ws)
        # the measured peak holds gradients born in the step, which the lower bound
        # counts on its own (set-to-none)
        own = self.param_grad_bytes(step)
        for w in ws:
            if w.bwd_released is not None:
                best = min(best, reads + w.bwd_released - own)
        return best

    @cached_property
    def forward_end(self) -> int:
        """Route index of the first backward step (= number of forward steps)."""
        return self.n

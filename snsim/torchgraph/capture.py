"""Graph capture: an ``nn.Module`` -> trace layers in execution order.

torch.fx traces the model into a graph; every graph node that computes a new
tensor becomes one layer (keyed by node, so a module called twice is two
layers).  The nodes then run one at a time, each on *leaf* copies of its
recorded inputs, which gives exact output shapes, the tensors autograd saves
(through ``torch.autograd.graph.saved_tensors_hooks``) and, for the timing
modules, a self-contained op to replay (:class:`LayerOp`).  The same code runs
on a real device (measured mode) and on ``meta`` (modeled mode; fake tensors
under autocast, snsim.torchgraph.amp), so both give the same bytes.

Notes the code points back to:

[1] Views fold.  A node whose every output tensor shares storage with one of
    its inputs (``view``, ``flatten``, ``reshape`` of a contiguous tensor,
    ``permute``, ``split`` + ``getitem``, ``nn.Identity``, slicing) makes no new
    tensor: it is not a layer, its consumers read the producer's layer.  A
    reshape that must copy makes a new tensor and is an ``other`` layer.
    Nodes that depend on no layer (``arange`` positions, ``size()`` numbers,
    parameters read with ``get_attr``) are constants, not layers; a parameter
    counts in the ``param_bytes`` of the first layer that uses it.
[2] In-place ops (``ReLU(inplace=True)``, ``+=``, ``relu_``) are layers
    marked ``"inplace": true`` with ``"inplace_of"`` the input they write
    into.  The analysis (saved tensors, gradient shares) runs the model's own
    in-place kernel (:func:`inplace_callable`) on a copy of that input passed
    through :class:`ShareStorage` (autograd refuses in-place ops on leaves),
    since what autograd saves differs in place (``LeakyReLU`` keeps its
    result, not its input); the recorded op that the timing modules replay
    runs out of place, so that no recorded input is overwritten.  Where the
    output is the whole of a single-tensor input's storage the layer also
    says ``"inplace_alias": true``, and the ledger lets ``X_i`` take over
    ``X_j``'s storage where ``X_j`` dies at the step (DESIGN 3, "In-place
    storage"); the executor then runs the in-place kernel.  Later readers of
    the mutated variable read the modified value, so capture rewires them
    to the in-place node; a model that reads the old value through another
    view of it is refused.
[3] ``saved_extra_bytes``: bytes of the distinct storages autograd saves for
    the node's backward, minus those that are its inputs, its output,
    parameters or buffers (weights are static memory), or constants passed to
    it (the loss's integer targets).  Examples: max-pool indices (int64),
    dropout's mask (float32 in PyTorch's CPU/meta path), batch-norm
    mean/invstd, the loss's log-softmax.
[4] ``bwd_reads`` is what autograd actually saved, for every kind: ``inputs``
    if a saved storage is an input's, ``output`` if it is the output's
    (ReLU/sigmoid/tanh save the output, GELU/SiLU and convolutions the input,
    max pooling its input and int64 indices, cross entropy only its
    log-softmax, which is ``saved_extra_bytes``, not the logits; attention
    (``scaled_dot_product_attention``) its inputs and its output).  A layer
    on a non-contiguous input whose kernel saves a contiguous copy reads no
    input: the copy is its saved extra.
[5] The loss is appended after the model's output: cross entropy of the
    logits (flattened to 2-D) against random integer targets; the targets are
    a constant, not a layer.  A model returning several tensors (a tuple or
    list) gets one cross entropy per output, each against its own targets,
    summed: the loss layer's inputs are all the output layers.
[6] On ``meta`` (and fake tensors, a modeled mixed-precision profile:
    snsim.torchgraph.amp) only, results are memoized by what determines them: a stock
    ``torch.nn`` module's type, ``extra_repr()`` (its whole configuration),
    parameter shapes and training flag, or a function's identity, plus the
    shapes, strides and dtypes of the arguments.  ResNet-2500's 8336 layers
    have a few dozen distinct keys; batch norm on ``meta`` runs a Python
    decomposition (~5 ms a call); this cuts ResNet-2500 at batch 32 from ~31 s
    to ~9 s on a 2-core laptop.  Parameter bytes and graph structure are never
    memoized.  ``MEMO = False`` disables it.
[8] Unpacking a tensor (``q, k, v = t``) runs ``t.unbind(0)`` in eager
    PyTorch, whose backward stacks the pieces' gradients into one buffer;
    torch.fx records it as one ``getitem`` (``select``) per piece, whose
    backwards each allocate a zero tensor of ``t``'s size.  The tracer marks
    unpacking, and capture rewrites it into one ``torch.unbind`` node (a view,
    note [1]) once the value is known to be a tensor (a module's tuple output
    unpacks by plain ``getitem``).  Explicit indexing (``t[0], t[1]``) stays
    ``select``, as in eager PyTorch.
[9] A tuple-valued layer's gradient ``G_i`` holds the gradients of the
    elements something reads; ``a, _ = attn(q, k, v)`` gives the attention
    weights none, and autograd allocates none for them.  ``grad_bytes`` says
    so where it is less than ``output_bytes`` (integer elements get none).
[10] Gradients that are the output gradient's storage.  After the forward,
    one backward from a ones gradient runs on the node's leaves
    (``torch.autograd.grad``), and the inputs whose gradient comes back in
    that same storage are the layer's ``grad_shares``: ``add`` passes its
    gradient through to both inputs, ``cat`` hands each input a slice of it,
    a reshape returns a view.  An input read through a smaller view (a
    ``chunk`` piece, a slice) is not listed: that view's backward makes the
    input layer's gradient anew.  Read from autograd, never from a table of op
    names; memoized with the rest on ``meta`` [6].  Only single-tensor layers
    fed by single-tensor layers are checked (a tuple's gradient is a list).
[11] A parameter used by several layers (a module called twice, a tied
    weight read through ``W.t()``) counts in the ``param_bytes`` of the first
    layer that uses it; every later layer that differentiates it lists
    ``[owner, bytes]`` in ``param_shares``.  Autograd sums such a parameter's
    gradient contributions in a buffer of its own (the AccumulateGrad node's
    input buffer) from the first contributing backward step to the last
    (DESIGN 3, "Shared parameters").
[12] A model's buffers (batch-norm running statistics) and the constant
    tensors computed once (positions from ``arange``, masks) are memory the
    model holds for the whole iteration: the trace's top-level
    ``constant_bytes``, static beside the weights and their gradients.
[13] Pieces of one multi-output view read by different layers (gMLP's
    ``u, v = x.chunk(2, -1)``, a GLU's halves).  The view has one backward
    node (``SplitBackward0``, ``UnbindBackward0``) for all its pieces:
    autograd keeps the gradient of the pieces one reader's backward makes in
    that node's input buffer until every reader's has run, and only then
    joins them into the input's gradient.  Where two or more layers read
    ``X_j`` only through pieces of one such view, and every other reader
    reads ``X_j`` whole (a residual) or through pieces of one other view,
    each piece reader lists ``[j, bytes of its pieces]`` in ``grad_pieces``
    (DESIGN 3, "Gradient storage"); where a piece is read by two layers
    (``u * norm(v) + tanh(u)``: autograd adds their gradients in the node's
    buffer) or two views of ``X_j`` have such readers (each view's node
    joins its own), the entry is ``[j, bytes, view, piece, bytes, ...]``:
    the view's number among ``X_j``'s listed views and each piece's index
    in it.  A reader whose backward hands its one piece its own gradient's
    storage (``u + relu(v)``'s add, ``passes_to_view``) lists ``j`` in
    ``grad_shares`` too; a reader of pieces that reads ``X_j`` whole as well
    (``u.T @ h``) lists it in ``grad_whole``.  The executor makes each
    reader's piece gradients apart and joins them with the view's own
    backward node.  Other shapes (a reader of two views' pieces, an
    in-place reader, a pass-through reader of two pieces) keep the plain
    rule.
[14] What the model's own code holds.  In eager PyTorch a tensor lives while
    a Python variable of the forward refers to it (or to a view of it), not
    only until its last reader: ``o = self.side(x)`` read by ``h + o`` stays
    until ``forward`` returns.  fx tracing runs the same Python code on
    proxies, so a proxy is dropped where the eager tensor would be: the
    tracer keeps a weak reference per proxy and notes on its node the node
    made last when it went (a view's counts for its layer, an in-place
    layer that takes over its input's storage inherits the input's).  Where
    that is after the layer's last forward reader, the layer says
    ``released_after`` (the last layer made by then); ``snsim validate``'s
    plain-PyTorch comparison keeps the tensor that long, policies do not
    (snsim's executor runs the layers itself).  Two fx habits that eager
    code lacks are avoided: ``s = x.shape`` holds ``x``'s node, not its
    proxy (eager keeps a ``torch.Size``), and unpacking lets go of the
    frames it inspects (a frame kept in its own local is a reference cycle
    that would hold the model's locals until the collector runs).  A
    tuple-valued layer's output is one tensor here: holding one element
    (``a, _ = attn(...)``) holds all of it.
"""

from __future__ import annotations

import bisect
import dis
import inspect
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from snsim.errors import SnsimError
from snsim.torchgraph.amp import is_fake
from snsim.torchgraph.kinds import OUT_OF_PLACE, bwd_reads, kind_of

MEMO = True  # note [6]


class Tracer(fx.Tracer):
    """fx tracer that keeps modules marked ``snsim_leaf = True`` as single nodes,
    marks tuple unpacking (``q, k, v = t``) for note [8] and notes on each node
    the node made last when the model's code let go of its value [14]."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drops = _Drops()

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return getattr(m, "snsim_leaf", False) or super().is_leaf_module(m, qualname)

    def create_node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        self.drops.last = node
        return node

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return self.drops.watch(UnpackingProxy(node, self), node)

    def trace(self, root, concrete_args=None) -> fx.Graph:
        try:
            return super().trace(root, concrete_args)
        finally:
            self.drops.close()


class _Drops:
    """When the model's code drops each proxy [14]: a weak reference per proxy,
    whose callback writes the node made last into ``meta["snsim_dropped_after"]``
    of the proxy's node (the latest over a node's proxies)."""

    def __init__(self) -> None:
        self.last: fx.Node | None = None
        self.refs: list[weakref.ref] = []

    def watch(self, proxy: fx.Proxy, node: fx.Node) -> fx.Proxy:
        self.refs.append(weakref.ref(proxy, lambda _, node=node: self.dropped(node)))
        return proxy

    def dropped(self, node: fx.Node) -> None:
        node.meta["snsim_dropped_after"] = self.last

    def close(self) -> None:
        """The trace is over: proxies still alive are held to its end; no callbacks."""
        refs, self.refs = self.refs, []
        for ref in refs:
            if ref() is not None:
                self.dropped(ref().node)


def _unpack(proxy: fx.Proxy):
    """``a, b, c = proxy``: one ``getitem`` proxy per name, the unpacking recorded
    on the nodes [8]; None where the caller does not unpack.  The frames are let
    go before returning: a frame kept in a local of its own is a reference cycle
    that would hold the model's locals until the collector runs [14]."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back else None
    try:
        if caller is None:
            return None
        insts = list(dis.get_instructions(caller.f_code))
        k = bisect.bisect_left(insts, caller.f_lasti, key=lambda x: x.offset)
        if k >= len(insts) or insts[k].opname != "UNPACK_SEQUENCE":
            return None
        n = insts[k].argval
    finally:
        del frame, caller
    proxy.node.meta["snsim_unpack"] = n
    items = [proxy[i] for i in range(n)]
    for item in items:
        item.node.meta["snsim_unpacked"] = True
    return iter(items)


class _Attribute(fx.proxy.Attribute):
    """``x.shape`` and friends, holding ``x``'s node, not its proxy: eager
    PyTorch's ``s = x.shape`` keeps a ``torch.Size``, not ``x`` [14].  fx's own
    unpacking (``b, c = x.shape``) keeps its frame in a reference cycle, and
    with it the model's locals: unpacked here instead."""

    @property
    def root(self) -> fx.Proxy:   # for the node made from it now: not a variable
        return fx.Proxy(self.root_node, self.tracer)

    @root.setter
    def root(self, proxy: fx.Proxy) -> None:
        self.root_node = proxy.node

    def __iter__(self):
        items = _unpack(self)
        return self.tracer.iter(self) if items is None else items


class UnpackingProxy(fx.Proxy):
    """A proxy whose unpacking ``a, b, c = p`` is recorded on the nodes [8]."""

    def __getattr__(self, k: str) -> fx.proxy.Attribute:
        return _Attribute(self, k)

    def __iter__(self):
        items = _unpack(self)
        return self.tracer.iter(self) if items is None else items

    # ``x += y`` runs in place in eager PyTorch (``add_``), but fx.Proxy has no
    # ``__iadd__``, so Python would record ``x = x + y``: record the in-place
    # operator, which capture treats as an in-place layer [2]
    def __iadd__(self, other):
        return self.tracer.create_proxy("call_function", operator.iadd, (self, other), {})

    def __isub__(self, other):
        return self.tracer.create_proxy("call_function", operator.isub, (self, other), {})

    def __imul__(self, other):
        return self.tracer.create_proxy("call_function", operator.imul, (self, other), {})

    def __itruediv__(self, other):
        return self.tracer.create_proxy("call_function", operator.itruediv, (self, other), {})


@dataclass
class LayerOp:
    """A layer as a replayable op: ``fn(*inputs)`` with ``params`` to differentiate."""

    fn: Callable[..., Any]
    inputs: list[torch.Tensor]          # recorded input values (detached)
    params: list[torch.Tensor] = field(default_factory=list)
    # Per input: does training differentiate through it?  (The data layer's output
    # and anything computed from it without parameters do not.)
    grad_inputs: list[bool] | None = None
    key: tuple | None = None   # same key => same shapes, bytes and costs [6]

    def leaves(self) -> list[torch.Tensor]:
        """Fresh leaf copies of the inputs; those training differentiates require grad."""
        mask = self.grad_inputs or [True] * len(self.inputs)
        return [x.detach().requires_grad_(g and x.is_floating_point())
                for x, g in zip(self.inputs, mask)]


@dataclass
class CapturedLayer:
    name: str
    kind: str
    inputs: tuple[int, ...]
    output_bytes: int
    param_bytes: int
    saved_extra_bytes: int
    bwd_reads: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    op: LayerOp | None           # None for the data layer
    target: str = ""
    inplace_of: int | None = None
    inplace_alias: bool = False     # X_i is the whole of X_{inplace_of}'s storage [2]
    requires_grad: bool = True
    grad_bytes: int | None = None   # a tuple's elements that receive a gradient [9]
    grad_shares: tuple[int, ...] = ()   # inputs whose gradient is G_i's storage [10]
    # inputs read through a smaller view to which the backward passes G_i's storage [10]
    passes_to_view: tuple[int, ...] = ()
    param_shares: tuple[tuple[int, int], ...] = ()   # (owner layer, bytes) used again [11]
    grad_pieces: tuple[tuple[int, int], ...] = ()   # (input layer, bytes of its pieces) [13]
    grad_whole: tuple[int, ...] = ()   # inputs read whole as well as through pieces [13]
    # input layer -> (the multi-output view's fx node name, the pieces read) [13]
    pieces: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    released_after: int | None = None   # the model's code holds X_i until then [14]


@dataclass
class Capture:
    layers: list[CapturedLayer]
    graph_module: fx.GraphModule
    # fx node name -> layer id it produced or aliases (folded views); None = constant
    node_layer: dict[str, int | None]
    # constants computed from parameters (``W.t()``, ``cls_token.expand(...)``) [7]:
    # re-evaluated inside each consuming layer, with gradients
    derived: frozenset[str] = frozenset()
    constant_bytes: int = 0     # buffers and constant tensors [12]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    return []


def _sid(t: torch.Tensor) -> int:
    """Identity of a tensor's storage; works on ``meta`` too (the impl pointer)."""
    return t.untyped_storage()._cdata


def symbolic_trace(model: nn.Module) -> fx.GraphModule:
    """fx-trace ``model`` or raise :class:`SnsimError` with the reason in one line."""
    try:
        graph = Tracer().trace(model)
    except Exception as exc:  # fx raises many types; all mean "not traceable"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SnsimError(f"torch.fx cannot trace model {type(model).__name__}: {first} "
                         "(profile needs a model without data-dependent control flow)") from None
    return fx.GraphModule(model, graph)


def op_callable(gm: fx.GraphModule, node: fx.Node) -> tuple[Callable, bool]:
    """The node's callable, made out of place [2]; returns (fn, was_inplace)."""
    inplace = False
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if getattr(mod, "inplace", False) is True:
            def out_of_place(*a, **k):  # the module stays in place for real training steps
                mod.inplace = False
                try:
                    return mod(*a, **k)
                finally:
                    mod.inplace = True
            return out_of_place, True
        return mod, inplace
    if node.op == "call_function":
        fn = node.target
        if fn in OUT_OF_PLACE:
            return OUT_OF_PLACE[fn], True
        if node.kwargs.get("inplace", False) is True:  # F.relu(x, inplace=True)
            return (lambda *a, **k: fn(*a, **{**k, "inplace": False})), True
        return fn, False
    name = node.target  # call_method
    if name.endswith("_") and not name.startswith("_") and hasattr(torch.Tensor, name[:-1]):
        name, inplace = name[:-1], True
    return (lambda self, *a, **k: getattr(self, name)(*a, **k)), inplace


class ShareStorage(torch.autograd.Function):
    """Identity whose result shares its input's storage without being a view of it,
    so that an in-place op may write into it (autograd refuses one on a leaf or a
    view of a leaf); the gradient passes through [2]."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty(0, dtype=x.dtype, device=x.device).set_(
            x.untyped_storage(), x.storage_offset(), x.size(), x.stride())

    @staticmethod
    def backward(ctx, g):
        return g


def inplace_callable(gm: fx.GraphModule, node: fx.Node) -> Callable:
    """The node's callable as the model runs it, in place [2] (what
    :func:`op_callable` makes out of place)."""
    if node.op == "call_module":
        return gm.get_submodule(node.target)
    if node.op == "call_function":
        return node.target
    name = node.target
    return lambda self, *a, **k: getattr(self, name)(*a, **k)


def _rewire_mutated(node: fx.Node, order: dict, node_layer) -> bool:
    """After in-place ``node`` on ``node.args[0]``, later readers of that variable
    read the modified value, which is ``node``'s: point them at ``node`` [2].  A
    later reader of another view of the same layer would read modified data the
    trace cannot name: refused.  Returns whether the graph changed."""
    src = node.args[0]
    here = order[node]
    later = [u for u in src.users if u is not node and order.get(u, -1) > here]
    for u in later:
        u.replace_input_with(src, node)
    lid = node_layer.get(src.name)
    p = src   # back to the node that produced the layer, then through its views
    while True:
        back = [a for a in p.all_input_nodes if node_layer.get(a.name) == lid]
        if not back:
            break
        p = back[0]
    stack, seen = [p], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack += [u for u in n.users if node_layer.get(u.name) == lid]
    for other in seen:
        if other is src:
            continue
        readers = [u for u in other.users if order.get(u, -1) > here
                   and not (u.op == "call_method" and u.target in ("size", "dim", "numel"))]
        if readers:
            raise SnsimError(f"in-place op {node.name} changes {src.name}, which "
                             f"{readers[0].name} reads afterwards through {other.name}; "
                             "profile needs the in-place result read through the op's "
                             "return value")
    return bool(later)


class _SavedBytes:
    """Collect storages autograd saves while the hook is active [3]."""

    def __init__(self) -> None:
        self.saved: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        sid = _sid(t)
        self.saved[sid] = max(self.saved.get(sid, 0), t.untyped_storage().nbytes())
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def _targets(logits: torch.Tensor) -> torch.Tensor:
    n_classes = logits.shape[-1]
    shape = logits.shape[:-1]
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randint(0, n_classes, tuple(shape), generator=gen).to(logits.device)


def _loss_fn(targets: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Cross entropy of each output against its targets, summed [5]."""
    def loss(*logits: torch.Tensor) -> torch.Tensor:
        total = None
        for x, t in zip(logits, targets):
            ce = F.cross_entropy(x.reshape(-1, x.shape[-1]), t.reshape(-1))
            total = ce if total is None else total + ce
        return total
    return loss


def capture(model: nn.Module, example: torch.Tensor, progress=None) -> Capture:
    """Trace ``model``, run it node by node on ``example`` and describe each layer.

    ``example`` is the whole batch on the device to profile (``meta`` for the
    modeled mode).  ``progress`` (optional) is called with the number of graph
    nodes once, then with each node done.
    """
    gm = symbolic_trace(model)
    nodes = list(gm.graph.nodes)
    if progress is not None:
        progress(len(nodes) + 1)
    return _capture(gm, nodes, example, progress)


def _capture(gm, nodes, example, progress) -> Capture:
    layers: list[CapturedLayer] = []
    env: dict[str, Any] = {}
    node_layer: dict[str, int | None] = {}
    static_ids = {_sid(t) for t in list(gm.parameters()) + list(gm.buffers())}
    memo: dict | None = {} if MEMO and (example.device.type == "meta" or is_fake(example)) \
        else None
    seen_params: dict[int, int] = {}   # id(parameter) -> the layer that counts it [11]
    derived: dict[str, tuple[Callable[[], Any], list]] = {}
    placeholders = 0
    out_node = None
    rewritten = False   # the graph gained unbind nodes [8]: its code is regenerated once
    order = {n: k for k, n in enumerate(nodes)}   # for in-place rewiring [2]
    for node in nodes:
        if progress is not None:
            progress(None)
        if node.op == "placeholder":
            if placeholders:
                raise SnsimError(f"model takes several inputs ({node.name!r} is the second); "
                                 "profile supports models with one input tensor")
            placeholders += 1
            env[node.name] = example
            node_layer[node.name] = 0
            layers.append(CapturedLayer("data", "data", (), nbytes(example), 0, 0, (),
                                        tuple(example.shape), _dtype(example), None, "input",
                                        requires_grad=False))
            continue
        if node.op == "get_attr":
            env[node.name] = fetch_attr(gm, node.target)
            node_layer[node.name] = None
            continue
        if node.op == "output":
            out_node = node.args[0]
            continue
        before = len(layers)
        _run_node(gm, node, env, node_layer, layers, static_ids, seen_params, memo, derived)
        if len(layers) > before and layers[-1].inplace_of is not None:
            rewritten |= _rewire_mutated(node, order, node_layer)
        unbound = _unbind_unpacking(gm, node, env)
        if unbound is not None:
            _run_node(gm, unbound, env, node_layer, layers, static_ids, seen_params, memo,
                      derived)
            rewritten = True
    outs = output_nodes(out_node)
    if not outs or not all(isinstance(env.get(n.name), torch.Tensor) for n in outs):
        got = env.get(getattr(out_node, "name", ""), out_node)
        raise SnsimError("model must return a tensor of logits or a tuple of them (got "
                         f"{type(got).__name__})")
    ids = [node_layer[n.name] for n in outs]
    if any(i is None or i == 0 for i in ids):
        raise SnsimError("model output does not depend on its input")
    if rewritten:
        gm.recompile()
    _set_grad_bytes(nodes, env, node_layer, layers)
    _set_grad_pieces(list(gm.graph.nodes), env, node_layer, layers)
    _set_released_after(nodes, node_layer, layers)
    _append_loss([env[n.name] for n in outs], ids, layers, static_ids)
    if progress is not None:
        progress(None)
    return Capture(layers, gm, node_layer, frozenset(derived),
                   _constant_bytes(gm, env, node_layer, derived))


def _constant_bytes(gm, env, node_layer, derived) -> int:
    """Bytes of the model's buffers (batch-norm running statistics) and of the
    constant tensors computed once (``arange`` positions): resident for the whole
    iteration beside the parameters [12]."""
    params = {_sid(p) for p in gm.parameters()}
    values = list(gm.buffers()) + [v for name, v in env.items()
                                   if node_layer.get(name, 0) is None and name not in derived
                                   and isinstance(v, torch.Tensor)]
    seen: set[int] = set()
    total = 0
    for t in values:
        sid = _sid(t)
        if sid not in params and sid not in seen:
            seen.add(sid)
            total += t.untyped_storage().nbytes()
    return total


def _set_grad_bytes(nodes, env, node_layer, layers) -> None:
    """A tuple-valued layer's ``grad_bytes``: its floating elements that something
    reads [9] (``a, _ = attn(q, k, v)`` leaves the weights without a gradient)."""
    for node in nodes:
        lid = node_layer.get(node.name)
        value = env.get(node.name)
        if lid is None or lid == 0 or not isinstance(value, (tuple, list)) \
                or node.target is operator.getitem:
            continue
        used = _used(node, value)
        layers[lid].grad_bytes = sum(nbytes(t) for t in used if t.is_floating_point())


def _set_grad_pieces(nodes, env, node_layer, layers) -> None:
    """``grad_pieces`` of the layers that read an input through pieces of a
    multi-output view that other layers read too [13]."""
    producer: dict[int, fx.Node] = {}
    for node in nodes:
        lid = node_layer.get(node.name)
        if lid is not None and lid not in producer:
            producer[lid] = node
    # input layer -> {reader layer: the pieces it reads, None for a whole read}
    reads: dict[int, dict[int, set]] = {}
    for i in range(1, len(layers)):
        node = producer.get(i)
        if node is None:
            continue
        for n in dict.fromkeys(node.all_input_nodes):
            j = node_layer.get(n.name)
            if j is None or not isinstance(env.get(n.name), torch.Tensor):
                continue
            reads.setdefault(j, {}).setdefault(i, set()).add(
                _piece_of(n, j, producer[j], env, node_layer))
    for j, readers in reads.items():
        if not layers[j].requires_grad or not isinstance(env.get(producer[j].name), torch.Tensor) \
                or any(layers[i].inplace_of == j for i in readers) \
                or any(len({p[0] for p in got if p is not None}) > 1
                       for got in readers.values()):
            continue   # (a reader of two views)
        by_view: dict[str, dict[int, tuple[int, ...]]] = {}   # in the readers' order
        for i, got in sorted(readers.items()):
            ks = tuple(sorted(p[1] for p in got if p is not None))
            if ks:
                by_view.setdefault(next(p for p in got if p is not None)[0], {})[i] = ks
        by_view = {view: by for view, by in by_view.items() if len(by) > 1}
        if any(j in layers[i].passes_to_view and len(ks) > 1
               for by in by_view.values() for i, ks in by.items()):
            continue   # (which piece it hands its own gradient's storage is not known)
        picked = [k for by in by_view.values() for ks in by.values() for k in ks]
        # the short form [j, bytes] where one view's pieces are each read once
        short = len(by_view) == 1 and len(picked) == len(set(picked))
        for n_view, (view, by) in enumerate(by_view.items()):
            for i, ks in by.items():
                sizes = [nbytes(env[view][k]) for k in ks]
                entry = (j, sum(sizes)) if short else \
                    (j, sum(sizes), n_view) + tuple(x for kb in zip(ks, sizes) for x in kb)
                layers[i].grad_pieces += (entry,)
                layers[i].pieces[j] = (view, ks)
                if None in readers[i]:   # and X_j whole: that gradient goes to G_j
                    layers[i].grad_whole += (j,)
                if j in layers[i].passes_to_view:   # its piece is its own gradient's storage
                    layers[i].grad_shares += (j,)


def _set_released_after(nodes, node_layer, layers) -> None:
    """``released_after`` of the layers whose output the model's code still holds
    in a variable after its last forward reader [14]."""
    after: dict[fx.Node, int] = {}   # node -> the last layer made by then
    latest = 0
    for node in nodes:
        latest = max(latest, node_layer.get(node.name) or 0)
        after[node] = latest
    release: dict[int, int] = {}
    for node in nodes:   # a view holds its layer's storage, as in eager PyTorch
        j = node_layer.get(node.name)
        dropped = node.meta.get("snsim_dropped_after")
        if j and dropped in after:
            release[j] = max(release.get(j, 0), after[dropped])
    last_read: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for j in layer.inputs:
            last_read[j] = i
        if layer.inplace_alias and layer.inplace_of in release:   # its storage now [2]
            release[i] = max(release.get(i, 0), release.pop(layer.inplace_of))
    for j, k in release.items():
        if k > max(j, last_read.get(j, 0)):
            layers[j].released_after = k


def _piece_of(n: fx.Node, j: int, producer: fx.Node, env, node_layer):
    """``(view node name, piece index)`` if ``n`` (layer j or a view of it) is a
    piece of a multi-output view of layer j (or a view of such a piece), else
    None [13]."""
    p = n
    while p is not producer:
        if p.op == "call_function" and p.target is operator.getitem \
                and isinstance(p.args[0], fx.Node) and isinstance(p.args[1], int):
            src = p.args[0]
            value = env.get(src.name)
            if src is not producer and node_layer.get(src.name) == j \
                    and isinstance(value, (tuple, list)):
                return (src.name, p.args[1] % len(value))
        back = [a for a in p.all_input_nodes if node_layer.get(a.name) == j]
        if not back:
            return None
        p = back[0]
    return None


def _used(node: fx.Node, value) -> list[torch.Tensor]:
    """The tensors of ``value`` (``node``'s) that some user of ``node`` reads."""
    if isinstance(value, torch.Tensor):
        return [value] if node.users else []
    out: list[torch.Tensor] = []
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem \
                and isinstance(user.args[1], int):
            out += [t for t in _used(user, value[user.args[1]])
                    if all(t is not o for o in out)]
        else:   # the whole tuple goes somewhere: every element may get a gradient
            return tensors_of(value)
    return out


def _unbind_unpacking(gm: fx.GraphModule, node: fx.Node, env) -> fx.Node | None:
    """If ``node``'s value is a tensor the code unpacked (``q, k, v = t``), make
    the unpacking one ``torch.unbind`` node, as eager PyTorch runs it [8]."""
    n = node.meta.get("snsim_unpack")
    value = env.get(node.name)
    if not n or not isinstance(value, torch.Tensor) or value.dim() == 0 \
            or value.shape[0] != n:
        return None
    items = [u for u in node.users if u.op == "call_function"
             and u.target is operator.getitem and u.meta.get("snsim_unpacked")]
    if not items:
        return None
    with gm.graph.inserting_after(node):
        unbound = gm.graph.call_function(torch.unbind, (node, 0))
    for u in items:
        u.args = (unbound, u.args[1])
    return unbound


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _run_node(gm, node, env, node_layer, layers, static_ids, seen_params, memo,
              derived) -> None:
    # Producer nodes among the args: layers (or their views) and constants.
    producers: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: producers.append(n) or n)
    layer_args = [n for n in dict.fromkeys(producers)
                  if node_layer.get(n.name) is not None and isinstance(env[n.name], torch.Tensor)]
    # getitem on a tuple/list-valued node: alias of that node [1].
    if (node.op == "call_function" and node.target is operator.getitem
            and isinstance(env[node.args[0].name], (tuple, list))):
        env[node.name] = env[node.args[0].name][node.args[1]]
        node_layer[node.name] = node_layer[node.args[0].name]
        return
    fn, inplace = op_callable(gm, node)
    first_arg = node.args[0] if node.args else None
    mutated_node = first_arg if inplace and isinstance(first_arg, fx.Node) \
        and node_layer.get(first_arg.name) is not None \
        and isinstance(env[first_arg.name], torch.Tensor) else None
    const_params = [env[n.name] for n in producers if node_layer.get(n.name, 0) is None
                    and isinstance(env[n.name], nn.Parameter)]
    for n in dict.fromkeys(producers):  # parameters behind derived values [7]
        if n.name in derived:
            const_params += [p for p in derived[n.name][1] if p not in const_params]
    index = {n.name: k for k, n in enumerate(layer_args)}
    args, kwargs = node.args, dict(node.kwargs)

    def value_of(n):
        return derived[n.name][0]() if n.name in derived else env[n.name]

    def call_with(f, *xs):
        sub = fx.node.map_arg((args, kwargs), lambda n: xs[index[n.name]] if n.name in index
                              else value_of(n))
        return f(*sub[0], **sub[1])

    def call(*xs):
        return call_with(fn, *xs)

    if not layer_args:  # depends on no layer: a constant [1], or derived from parameters [7]
        with torch.no_grad():
            env[node.name] = call()
        node_layer[node.name] = None
        if const_params and any(p.requires_grad for p in const_params):
            derived[node.name] = (call, [p for p in const_params if p.requires_grad])
        return
    recorded = [env[n.name].detach() for n in layer_args]
    op = LayerOp(call, recorded, grad_inputs=[layers[node_layer[n.name]].requires_grad
                                              for n in layer_args])
    leaves = op.leaves()
    if mutated_node is not None:
        # [2] the analysis runs the model's in-place kernel (what autograd saves in
        # place differs: LeakyReLU keeps its result, not its input) on a copy of the
        # input, which then holds the output
        k0 = index[mutated_node.name]
        x0 = leaves[k0]
        leaves[k0] = x0.detach().clone().requires_grad_(x0.requires_grad)
        fn_in_place = inplace_callable(gm, node)

        def run(*xs):
            xs = list(xs)
            if xs[k0].requires_grad:
                xs[k0] = ShareStorage.apply(xs[k0])
            return call_with(fn_in_place, *xs)
    else:
        run = None
    op.key = _memo_key(gm, node, index, leaves, env) if memo is not None else None
    hit = memo.get(op.key) if op.key is not None else None
    if hit is not None:  # [6]
        shape, stride, dtype, extra, reads, shares = hit
        out = torch.empty_strided(shape, stride, dtype=dtype, device=leaves[0].device)
    else:
        saved = _SavedBytes()
        try:
            with saved.hooks():
                out = (run or call)(*leaves)
        except Exception as exc:  # a model that fails on this input: the user's to fix
            shapes = ", ".join("x".join(map(str, x.shape)) for x in leaves)
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise SnsimError(f"layer {node.name} failed on inputs of shape {shapes}: "
                             f"{type(exc).__name__}: {msg}") from None
    outs = tensors_of(out)
    leaf_ids = {_sid(x) for x in leaves}
    if mutated_node is not None:   # that input's storage holds the output now [2]
        leaf_ids.discard(_sid(leaves[index[mutated_node.name]]))
    if not outs:  # size(), shape numbers: constants
        env[node.name] = out
        node_layer[node.name] = None
        return
    if all(_sid(t) in leaf_ids for t in outs):  # a view or identity [1]
        src = next(n for n in layer_args for t in outs if _sid(leaves[index[n.name]]) == _sid(t))
        env[node.name] = _detach(out)
        node_layer[node.name] = node_layer[src.name]
        return
    env[node.name] = _detach(out)
    lid = len(layers)
    node_layer[node.name] = lid
    inputs = tuple(dict.fromkeys(node_layer[n.name] for n in layer_args))
    # Parameters: a module's own (first call only) and get_attr ones.
    params = list(gm.get_submodule(node.target).parameters()) if node.op == "call_module" else []
    params += const_params
    op.params = [p for p in params if p.requires_grad]
    new = [p for p in params if id(p) not in seen_params]
    shared: dict[int, int] = {}   # [11] owner layer -> bytes of its parameters used again
    for p in dict.fromkeys(op.params):
        owner = seen_params.get(id(p))
        if owner is not None:
            shared[owner] = shared.get(owner, 0) + nbytes(p)
    seen_params.update((id(p), len(layers)) for p in new)
    out_ids = {_sid(t) for t in outs}
    const_ids = {_sid(t) for t in tensors_of([env[n.name] for n in producers
                                            if node_layer.get(n.name, 0) is None])}
    kind, _ = kind_of(gm, node, len(layer_args) + len(const_params))
    if hit is None:
        extra = sum(b for s, b in saved.saved.items()
                    if s not in leaf_ids | out_ids | static_ids | const_ids)
        reads = bwd_reads(saved.saved, leaf_ids, out_ids)
        shares = _grad_shares(out, leaves, [_one_gradient(gm, node_layer, n, env)
                                            for n in layer_args])
        if op.key is not None and isinstance(out, torch.Tensor):
            memo[op.key] = (tuple(out.shape), out.stride(), out.dtype, extra, reads, shares)
    first = outs[0]
    # Module path for modules (a second call gets the fx node name), node name otherwise.
    name = str(node.target) if node.op == "call_module" else node.name
    if node.op == "call_module" and node.name != node.target.replace(".", "_"):
        name = f"{name}@{node.name}"
    target = (type(gm.get_submodule(node.target)).__name__ if node.op == "call_module"
              else getattr(node.target, "__name__", str(node.target)))
    requires_grad = bool(op.params) or any(op.grad_inputs)
    mutated = node_layer[mutated_node.name] if mutated_node is not None else None
    layers.append(CapturedLayer(
        requires_grad=requires_grad,
        name=name, kind=kind, inputs=inputs, output_bytes=sum(nbytes(t) for t in outs),
        param_bytes=sum(nbytes(p) for p in new), saved_extra_bytes=extra, bwd_reads=reads,
        shape=tuple(first.shape), dtype=_dtype(first), op=op, target=target,
        inplace_of=mutated,
        inplace_alias=mutated is not None and isinstance(out, torch.Tensor)
        and nbytes(out) == layers[mutated].output_bytes,
        grad_shares=_shared_inputs(shares, layer_args, node_layer, env, True),
        passes_to_view=_shared_inputs(shares, layer_args, node_layer, env, False),
        param_shares=tuple(sorted(shared.items()))))


def _grad_shares(out, leaves, single) -> tuple[int, ...]:
    """Positions of the leaves whose gradient autograd returns in the output
    gradient's own storage [10]; ``single``: the leaf's layer is one tensor."""
    if not isinstance(out, torch.Tensor) or not out.requires_grad \
            or not out.is_floating_point() or out.grad_fn is None:
        return ()
    diff = [k for k, x in enumerate(leaves) if x.requires_grad and single[k]]
    if not diff:
        return ()
    g = torch.ones_like(out)
    grads = torch.autograd.grad(out, [leaves[k] for k in diff], g, allow_unused=True)
    return tuple(k for k, gk in zip(diff, grads) if gk is not None and _sid(gk) == _sid(g))


def _shared_inputs(shares, layer_args, node_layer, env, whole: bool) -> tuple[int, ...]:
    """Layer ids of the shared leaves, for layers read through exactly one leaf
    (two leaves of one layer get their gradients summed into a new buffer):
    with ``whole``, those read whole or through a view of the same bytes; else
    those read through a smaller view (a ``chunk`` piece, a slice), whose
    backward makes the layer's gradient anew, so it is not this storage [10]."""
    count: dict[int, int] = {}
    for n in layer_args:
        lid = node_layer[n.name]
        count[lid] = count.get(lid, 0) + 1
    return tuple(dict.fromkeys(node_layer[layer_args[k].name] for k in shares
                               if count[node_layer[layer_args[k].name]] == 1
                               and _reads_whole(node_layer, layer_args[k], env) == whole))


def _reads_whole(node_layer, n: fx.Node, env) -> bool:
    """Is ``n`` its layer's whole tensor, or a view of it with the same bytes (a
    transpose, a reshape)?  A tuple-valued layer's element counts as whole [9]."""
    value = env[_producer_of(node_layer, n).name]
    if not isinstance(value, torch.Tensor):
        return True
    return nbytes(env[n.name]) == nbytes(value)


def _producer_of(node_layer, n: fx.Node) -> fx.Node:
    """The node that produced ``n``'s layer (``n`` itself, or what it is a view of)."""
    lid = node_layer[n.name]
    p = n
    while True:
        src = [a for a in p.all_input_nodes if node_layer.get(a.name) == lid]
        if not src:
            return p
        p = src[0]


def _one_gradient(gm, node_layer, n: fx.Node, env) -> bool:
    """Is ``n`` (a layer or a view of one) all of its layer's gradient: a
    single-tensor layer, or the one element of a tuple that receives one [9]?"""
    p = _producer_of(node_layer, n)
    value = env[p.name]
    if isinstance(value, torch.Tensor):
        return True
    used = [t for t in _used(p, value) if t.is_floating_point()]
    return len(used) == 1 and used[0] is env[n.name]


class _Unkeyable(Exception):
    pass


def _memo_key(gm, node, index, leaves, env) -> tuple | None:
    """What determines a node's result on ``meta`` [6]; None if not sure."""
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if not type(mod).__module__.startswith("torch.nn.modules"):
            return None  # a custom module's config may live outside extra_repr()
        head: tuple = (type(mod), mod.extra_repr(), mod.training,
                       tuple((tuple(p.shape), p.dtype, p.requires_grad) for p in mod.parameters()),
                       tuple((tuple(b.shape), b.dtype) for b in mod.buffers()))
    else:
        head = (node.op, node.target)

    def sig(a):
        if isinstance(a, fx.Node):
            if a.name in index:
                x = leaves[index[a.name]]
                return ("L", index[a.name], tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
            v = env[a.name]
            if isinstance(v, torch.Tensor):
                return ("C", tuple(v.shape), v.stride(), v.dtype, isinstance(v, nn.Parameter))
            if isinstance(v, (int, float, bool, torch.Size)):
                return ("V", repr(v))
            raise _Unkeyable
        if isinstance(a, (list, tuple)):
            return (type(a).__name__,) + tuple(sig(b) for b in a)
        if isinstance(a, dict):
            return ("dict",) + tuple((k, sig(v)) for k, v in a.items())
        if a is None or a is Ellipsis or isinstance(a, (int, float, bool, str, slice, torch.dtype,
                                                        torch.device, torch.memory_format)):
            return ("P", type(a).__name__, repr(a))
        raise _Unkeyable

    try:
        return head + (sig(node.args), sig(dict(node.kwargs)))
    except _Unkeyable:
        return None


def _detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    return value


def output_nodes(out_node) -> list[fx.Node]:
    """The fx nodes a model returns: one, or each of a tuple/list (one level)."""
    if isinstance(out_node, fx.Node):
        return [out_node]
    if isinstance(out_node, (tuple, list)) and all(isinstance(n, fx.Node) for n in out_node):
        return list(out_node)
    return []


def _append_loss(logits, ids, layers, static_ids) -> None:
    """Cross entropy against constant integer targets, one per output [5]."""
    targets = [_targets(x) for x in logits]
    op = LayerOp(_loss_fn(targets), [x.detach() for x in logits])
    leaves = op.leaves()
    saved = _SavedBytes()
    with saved.hooks():
        out = op.fn(*leaves)
    leaf_ids, out_ids = {_sid(x) for x in leaves}, {_sid(out)}
    skip = leaf_ids | out_ids | {_sid(t) for t in targets} | static_ids
    extra = sum(b for s, b in saved.saved.items() if s not in skip)
    layers.append(CapturedLayer("loss", "loss", tuple(dict.fromkeys(ids)), nbytes(out), 0, extra,
                                bwd_reads(saved.saved, leaf_ids, out_ids), tuple(out.shape),
                                _dtype(out), op, "cross_entropy"))

"""A model as one callable per trace layer.

The profiler's capture (``snsim.torchgraph.capture``) maps every torch.fx node
to the trace layer it produces, to the layer it is a view of, or to nothing
(a constant).  :class:`Program` interprets the same graph: layer ``i`` is
computed from tensors of its input layers by running its node, with view
nodes between layers re-applied on the fly (they allocate nothing) and
constants evaluated once.  The last layer is the loss the profiler appends
(cross entropy against fixed integer targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from snsim.errors import SnsimError
from snsim.torchgraph import capture as cap


@dataclass
class LayerFn:
    """How to compute one layer: its fx node (None for data and loss)."""

    id: int
    node: fx.Node | None
    inputs: tuple[int, ...]
    module: nn.Module | None  # for call_module nodes: buffers to protect on recompute
    params: list[torch.Tensor]


class Program:
    """Per-layer callables of ``model`` on inputs shaped like ``example``.

    ``run(i, values)`` computes layer ``i`` given ``values[j]`` for each of
    its input layers ``j``.  In-place layers run the model's in-place kernel,
    on their input or on a copy of it (``run``).
    """

    def __init__(self, model: nn.Module, example: torch.Tensor):
        self.model = model
        captured = cap.capture(model, example)
        # Keep only the mapping: the capture's ops hold every recorded activation.
        self.gm = captured.graph_module
        self.node_layer = captured.node_layer
        self.n = len(captured.layers)
        self._fns: dict[str, Callable] = {}
        self._consts: dict[str, Any] = {}
        self.layers: list[LayerFn] = []
        self._producer: dict[int, fx.Node] = {}
        self._derived = captured.derived  # computed from parameters, with gradients
        nodes = list(self.gm.graph.nodes)
        self._by_name = {n.name: n for n in nodes}
        for node in nodes:
            lid = self.node_layer.get(node.name)
            if node.op == "output":
                self._out_node = node.args[0]
            elif node.name in self._derived:
                self._fns[node.name] = cap.op_callable(self.gm, node)[0]
            elif lid is None:
                # a constant; one read off a layer (``x.size(0)``) is re-evaluated
                # when needed, like a view
                if all(n.name in self._consts for n in node.all_input_nodes):
                    self._consts[node.name] = self._const(node)
            elif lid not in self._producer:
                self._producer[lid] = node
                if node.op != "placeholder":
                    fn, _ = cap.op_callable(self.gm, node)
                    self._fns[node.name] = fn
        # in-place layers run the model's in-place kernel, as capture analysed them
        # (what autograd saves differs in place, note [2]): into their input's
        # storage where the executor says so, else on a copy of that input
        self._in_place: dict[int, Callable] = {}
        # layer -> {input layer: (multi-output view's node name, pieces it reads)}
        # (capture note [13])
        self.pieces: dict[int, dict[int, tuple[str, tuple[int, ...]]]] = {}
        targets = None
        for c in captured.layers:
            i = len(self.layers)
            node = self._producer.get(i) if c.kind not in ("data", "loss") else None
            module = (self.gm.get_submodule(node.target)
                      if node is not None and node.op == "call_module" else None)
            params = list(c.op.params) if c.op is not None else []
            self.layers.append(LayerFn(i, node, c.inputs, module, params))
            if c.inplace_of is not None and node is not None:
                self._in_place[i] = cap.inplace_callable(self.gm, node)
            if c.pieces:
                self.pieces[i] = dict(c.pieces)
            if c.kind == "loss":
                targets = c.op
        if self.layers[-1].node is not None or targets is None:
            raise SnsimError("captured graph has no loss layer")
        fn = targets.fn  # cross entropy with the capture's fixed targets, one per output
        self.loss = lambda out: fn(*cap.tensors_of(out))
        del captured, targets
        self._dynamic = {name for name, lid in self.node_layer.items()
                         if lid is None and name not in self._consts
                         and name not in self._derived
                         and self._by_name[name].op != "output"}
        if self._dynamic:
            self._read_shapes(example)
        self.param_list = [p for p in model.parameters() if p.requires_grad]

    # ------------------------------------------------------------ evaluation
    def _const(self, node: fx.Node) -> Any:
        if node.op == "get_attr":
            return cap.fetch_attr(self.gm, node.target)
        if node.op == "placeholder":
            raise SnsimError("model input is used as a constant")
        fn, _ = cap.op_callable(self.gm, node)
        args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                       lambda n: self._consts[n.name])
        with torch.no_grad():
            return fn(*args, **kwargs)

    def _value(self, node: fx.Node, values: dict[int, Any], seen: dict) -> Any:
        """Value of ``node`` given the tensors of the layers in ``values``.

        ``seen`` memoizes values within one layer's call: eager PyTorch computes
        ``qkv.permute(...)`` once for ``q``, ``k`` and ``v``, so its backward
        assembles their gradients once."""
        if node.name not in seen:
            seen[node.name] = self._value_of(node, values, seen)
        return seen[node.name]

    def _value_of(self, node: fx.Node, values: dict[int, Any], seen: dict) -> Any:
        if node.name in self._consts:
            return self._consts[node.name]
        if node.name in self._derived:  # re-evaluated in each consuming layer, with grad
            args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                           lambda n: self._value(n, values, seen))
            return self._fns[node.name](*args, **kwargs)
        lid = self.node_layer[node.name]
        if lid is not None and self._producer.get(lid) is node:
            return values[lid]
        if lid is None:  # read off a layer (x.shape[0]): the same every step; keep it
            fn = self._fns.get(node.name) or cap.op_callable(self.gm, node)[0]
            args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                           lambda n: self._value(n, values, seen))
            with torch.no_grad():
                value = fn(*args, **kwargs)
            if isinstance(value, torch.Tensor):
                raise SnsimError(f"fx node {node.name} reads tensor data of a layer without "
                                 "being a layer; the executor cannot replay it")
            self._consts[node.name] = value
            return value
        # a view of layer ``lid`` (or getitem of a tuple-valued layer): re-apply it
        fn = self._fns.get(node.name)
        if fn is None:
            fn, _ = cap.op_callable(self.gm, node)
            self._fns[node.name] = fn
        args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                       lambda n: self._value(n, values, seen))
        return fn(*args, **kwargs)

    def _read_shapes(self, example: torch.Tensor) -> None:
        """One forward without gradients, to keep values read off layers (shapes)."""
        values: dict[int, Any] = {0: example}
        with torch.no_grad():
            for i in range(1, self.n - 1):
                values[i] = self.run(i, values)

    def run(self, i: int, values: dict[int, Any], in_place: bool = False,
            seen: dict | None = None) -> Any:
        """Compute layer ``i`` from its input layers' tensors.  An in-place layer runs
        the model's in-place kernel: with ``in_place`` into its first input, else
        into a copy of it (a new tensor, as the trace counts it; capture note [2]).
        ``seen``, if given, receives the value of every fx node the call evaluated
        (views of the inputs among them), by node name."""
        layer = self.layers[i]
        seen = {} if seen is None else seen
        if i == self.n - 1:
            return self.loss([self._value(n, values, seen)
                              for n in cap.output_nodes(self._out_node)])
        node = layer.node
        args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                       lambda n: self._value(n, values, seen))
        fn = self._in_place.get(i)
        if fn is None:
            return self._fns[node.name](*args, **kwargs)
        if not in_place:
            args = (args[0].clone(),) + tuple(args[1:])
        return fn(*args, **kwargs)

    def existing_bytes(self) -> int:
        """Memory the model holds before a step: parameters, buffers, constants.

        Gradient buffers are not included: a measurement allocates them inside
        its window (see ``Executor.prepare``).
        """
        return tensor_bytes(list(self.model.parameters()) + list(self.model.buffers())
                            + [v for v in self._consts.values() if isinstance(v, torch.Tensor)])

    def reference_loss(self, x: torch.Tensor) -> torch.Tensor:
        """The plain model's loss on ``x`` (same targets as the last layer)."""
        out = self.model(x)
        return self.loss(out)




def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (aliases counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
    return total

"""DESIGN layer kinds for fx nodes, and the per-kind backward reads.

See notes [2] and [4] in :mod:`snsim.torchgraph.capture`.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

_MODULE_KINDS: list[tuple[tuple[type, ...], str]] = [
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
      nn.ConvTranspose3d), "conv"),
    ((nn.Linear, nn.Bilinear), "fc"),
    ((nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
      nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
      nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d), "pool"),
    ((nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
      nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh,
      nn.Softplus), "act"),
    ((nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm), "bn"),
    ((nn.LocalResponseNorm,), "lrn"),
    ((nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout), "dropout"),
    ((nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
      nn.RMSNorm), "norm"),
    ((nn.Embedding, nn.EmbeddingBag), "embedding"),
    ((nn.Softmax, nn.LogSoftmax), "softmax"),
    ((nn.MultiheadAttention,), "attention"),
    ((nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss), "loss"),
]
_FN_KINDS: dict[Any, str] = {}
for _kind, _fns in {
    "conv": (F.conv1d, F.conv2d, F.conv3d, torch.conv2d, torch.conv1d),
    "fc": (F.linear,),
    "matmul": (torch.matmul, torch.bmm, torch.mm, operator.matmul, "matmul", "bmm", "mm"),
    "pool": (F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d,
             F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d),
    "act": (F.relu, torch.relu, F.gelu, F.silu, torch.sigmoid, torch.tanh, F.leaky_relu,
            F.elu, F.hardswish, "relu", "sigmoid", "tanh"),
    "bn": (F.batch_norm,),
    "lrn": (F.local_response_norm,),
    "dropout": (F.dropout, torch.dropout),
    "norm": (F.layer_norm, F.group_norm, F.rms_norm),
    "embedding": (F.embedding,),
    "softmax": (F.softmax, torch.softmax, F.log_softmax, "softmax", "log_softmax"),
    "attention": (F.scaled_dot_product_attention,),
    "concat": (torch.cat, torch.concat, torch.concatenate),
    "add": (operator.add, operator.iadd, torch.add, "add", "add_"),
    "loss": (F.cross_entropy, F.nll_loss, F.mse_loss),
}.items():
    for _fn in _fns:
        _FN_KINDS[_fn] = _kind

_MAX_POOL_MODULES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d,
                     nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
_MAX_POOL_FNS = {F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool2d}
# In-place functions and their out-of-place twins [2].
OUT_OF_PLACE = {operator.iadd: operator.add, operator.isub: operator.sub,
                 operator.imul: operator.mul, operator.itruediv: operator.truediv,
                 torch.relu_: torch.relu, F.relu_: F.relu}


def kind_of(gm: fx.GraphModule, node: fx.Node, n_tensor_args: int) -> tuple[str, bool]:
    """(DESIGN kind, is max-pool) of a call node."""
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        kind = getattr(mod, "snsim_kind", None)
        if kind is None:
            kind = next((k for types, k in _MODULE_KINDS if isinstance(mod, types)), "other")
        return kind, isinstance(mod, _MAX_POOL_MODULES)
    target = node.target
    kind = _FN_KINDS.get(target, "other")
    if kind == "add" and n_tensor_args < 2:
        kind = "other"  # tensor + scalar is not a residual join
    return kind, target in _MAX_POOL_FNS


def bwd_reads(saved, leaf_ids, out_ids) -> tuple[str, ...]:
    """What the backward reads, from what autograd saved [4]: ``inputs`` if a saved
    storage is an input's, ``output`` if it is the output's."""
    reads = []
    if any(s in leaf_ids for s in saved):
        reads.append("inputs")
    if any(s in out_ids for s in saved):
        reads.append("output")
    return tuple(reads)

"""Input gradients a layer's backward hands out as views of its output gradient.

``torch.cat``'s backward returns ``grad.narrow(...)`` slices of the gradient
it receives, and ``a + b``'s returns that very gradient for both operands:
no new memory, and the received gradient's storage lives as long as any of
the slices does.  In a plain PyTorch step this keeps a concatenation's
output gradient alive until the last branch has run its backward (on the
two-branch toy model, 1.5% of the whole step's peak in fp32, 7.1% under
bf16 autocast).

:func:`grad_views` runs one layer's backward on leaf copies of its recorded
inputs (the same tensors the capture ran it on, on a real device or on
``meta``) and reports, by input layer id, the inputs whose gradient shares
storage with the gradient given to the layer's output.  The trace records
them as the layer field ``grad_views`` (docs/DESIGN.md section 3, "Gradient
views"); the simulator applies them where the layer is the input's only
contributor.  Only layers without parameters and with a single tensor output
are asked: a weighted layer computes its input gradient, it never slices it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from snsim.torchgraph.capture import CapturedLayer


def storage_id(t: torch.Tensor) -> int:
    """Identity of a tensor's storage; on ``meta`` too (the storage impl pointer)."""
    return t.untyped_storage()._cdata


def grad_views(layer: CapturedLayer, cache: dict | None = None) -> tuple[int, ...]:
    """Input layer ids whose gradient the backward of ``layer`` hands out as a view
    of (or as) its output gradient; () when none or when the layer is not asked.

    ``cache`` maps the capture's memo key (same shapes and op on ``meta``) to
    the answer by input position."""
    op = layer.op
    if op is None or layer.kind in ("data", "loss") or op.params or layer.param_bytes:
        return ()
    if len(op.inputs) != len(layer.inputs):
        # two arguments read one layer (``cat([x, x])``): its gradient is their sum,
        # a new tensor
        return ()
    key = op.key
    if cache is not None and key is not None and key in cache:
        hit = cache[key]
    else:
        hit = _positions(op)
        if cache is not None and key is not None:
            cache[key] = hit
    return tuple(layer.inputs[k] for k in hit)


def _positions(op) -> tuple[int, ...]:
    leaves = op.leaves()
    wrt = [k for k, x in enumerate(leaves) if x.requires_grad]
    if not wrt:
        return ()
    with torch.enable_grad():
        out = op.fn(*leaves)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return ()
    gout = torch.ones_like(out)
    grads: Sequence[torch.Tensor | None] = torch.autograd.grad(
        [out], [leaves[k] for k in wrt], [gout], allow_unused=True)
    mine = storage_id(gout)
    return tuple(k for k, g in zip(wrt, grads) if g is not None and storage_id(g) == mine)

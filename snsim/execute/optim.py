"""The real optimizer of a trace's ``training`` record (torch.optim, default settings).

One place builds it, for the profiler (which measures its state, step time
and temporaries), the executor (which runs it at the schedule's optimizer
step) and the plain-PyTorch baseline.  Settings: ``lr=1e-3``; ``momentum``
is SGD with ``momentum=0.9``; Adam/AdamW their defaults (AdamW's weight
decay 0.01), ``amsgrad`` as recorded; ``foreach`` left to torch (on a CPU
the single-tensor implementation, on CUDA ``foreach``).  "States already
initialized" (docs/DESIGN.md 3a): :func:`initialize` runs one step with zero
gradients, so the state exists before any measured step, as in every step
of training after the first.
"""

from __future__ import annotations

from typing import Sequence

import torch

LR = 1e-3


def make(training, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer | None:
    """The optimizer ``training`` names (None for ``none`` or no record)."""
    if training is None or training.optimizer == "none":
        return None
    params = list(params)
    name = training.optimizer
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR)
    if name == "momentum":
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return cls(params, lr=LR, amsgrad=training.amsgrad)


@torch.no_grad()
def initialize(opt: torch.optim.Optimizer | None) -> None:
    """Create the optimizer's state with one step on zero gradients; the
    parameters (AdamW's weight decay moves them) and gradients are left as
    they were (None stays None)."""
    if opt is None:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    had = [p.grad for p in params]
    values = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, g, v in zip(params, had, values):
        p.grad = g
        p.copy_(v)


def state_bytes(opt: torch.optim.Optimizer | None) -> int:
    """Bytes of the optimizer's state tensors (each storage once)."""
    if opt is None:
        return 0
    seen: dict[int, int] = {}
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.numel():
                s = v.untyped_storage()
                seen[s.data_ptr() or id(v)] = s.nbytes()
    return sum(seen.values())


def param_tensors(opt: torch.optim.Optimizer | None) -> int:
    return 0 if opt is None else sum(len(g["params"]) for g in opt.param_groups)

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

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import torch

LR = 1e-3
# fp16 loss scale: torch's default 2**16 overflows toymodels:residual's fp16 backward
# on its first step (a training loop then skips steps, halving the scale, until it
# fits); validation compares one step's gradients, so it starts where it fits
INIT_SCALE = 2.0 ** 10


class Scaled:
    """An optimizer behind ``torch.amp.GradScaler`` (``--amp fp16``): the loss is
    scaled before backward (:func:`loss_scale`, :func:`scaled`), and ``step()``
    unscales the gradients in place (with its inf check), steps unless one was
    not finite, and updates the scale, as a user's fp16 loop does.  The fp32
    parameters are the master weights: autocast keeps them fp32."""

    def __init__(self, opt: torch.optim.Optimizer, device: torch.device):
        self.opt = opt
        self.scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE)
        self.scaler.scale(torch.zeros((), device=device))   # creates scale and tracker
        self.param_groups, self.state = opt.param_groups, opt.state

    def step(self) -> None:
        self.scaler.unscale_(self.opt)
        self.scaler.step(self.opt)
        self.scaler.update()

    def scaler_bytes(self) -> int:
        """The scaler's own state: its scale and growth tracker (0-d tensors)."""
        return sum(t.numel() * t.element_size() for t in
                   (self.scaler._scale, self.scaler._growth_tracker) if t is not None)


def make(training, params: Sequence[torch.Tensor]):
    """The optimizer ``training`` names (None for ``none`` or no record); under
    ``amp = fp16`` wrapped in a :class:`Scaled` (loss scaling)."""
    if training is None or training.optimizer == "none":
        return None
    params = list(params)
    name = training.optimizer
    if name == "sgd":
        opt = torch.optim.SGD(params, lr=LR)
    elif name == "momentum":
        opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    else:
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        opt = cls(params, lr=LR, amsgrad=training.amsgrad)
    if training.amp == "fp16":
        return Scaled(opt, params[0].device if params else torch.device("cpu"))
    return opt


def loss_scale(opt) -> float:
    """The factor backward starts from: the scaler's scale, else 1."""
    opt = opt.inner if isinstance(opt, Offloaded) else opt
    return float(opt.scaler.get_scale()) if isinstance(opt, Scaled) else 1.0


def scaled(opt, loss: torch.Tensor) -> torch.Tensor:
    """``loss`` as backward should start from it (``scaler.scale(loss)`` under fp16)."""
    opt = opt.inner if isinstance(opt, Offloaded) else opt
    return opt.scaler.scale(loss) if isinstance(opt, Scaled) else loss


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
    """Bytes of the optimizer's state tensors (each storage once), and a loss
    scaler's."""
    if opt is None:
        return 0
    opt = opt.inner if isinstance(opt, Offloaded) else opt
    seen: dict[int, int] = {}
    if isinstance(opt, Scaled):
        seen[-1] = opt.scaler_bytes()
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.numel():
                s = v.untyped_storage()
                seen[s.data_ptr() or id(v)] = s.nbytes()
    return sum(seen.values())


def param_tensors(opt: torch.optim.Optimizer | None) -> int:
    return 0 if opt is None else sum(len(g["params"]) for g in opt.param_groups)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in host memory: pinned beside a GPU; on a CPU a numpy
    buffer, which the torch allocator (whose events the CPU measurement reads)
    does not count, as the executor's offloads are (executor note [4])."""
    t = t.detach()
    if t.device.type == "cuda":
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    try:
        return torch.from_numpy(t.numpy().copy())
    except TypeError:   # no numpy dtype (bfloat16): an ordinary host tensor
        return t.clone()


class Offloaded:
    """The optimizer offloaded ZeRO-Offload style (``training.offload``,
    docs/DESIGN.md 3a): a host copy of every parameter (the master weights),
    the optimizer built on those and its state in host memory; ``step()``
    copies the gradients to the host (device to host), runs the real
    ``torch.optim`` step there, and copies the parameters back (host to
    device), one after the other, as the simulator's offloaded step.  The step
    runs in a host thread of its own: its temporaries are host memory, which
    the CPU measurement (the allocator's events on the compute thread) does
    not see while the compute thread waits, as a GPU's accounting would not."""

    def __init__(self, training, params: Sequence[torch.Tensor]):
        self.params = list(params)
        self.host_params = [host_copy(p) for p in self.params]
        self.host_grads = [host_copy(p) for p in self.params]
        self.inner = make(training, self.host_params)
        initialize(self.inner)
        opt = self.inner.opt if isinstance(self.inner, Scaled) else self.inner
        for state in opt.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = host_copy(v)
        self.param_groups, self.state = opt.param_groups, opt.state
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="snsim-host")

    @torch.no_grad()
    def step(self) -> None:
        for p, hp, hg in zip(self.params, self.host_params, self.host_grads):
            if p.grad is None:   # a parameter without a gradient this step
                hp.grad = None
            else:
                hg.copy_(p.grad)   # device to host
                hp.grad = hg
        self.pool.submit(self.inner.step).result()   # the host step
        for p, hp in zip(self.params, self.host_params):
            p.copy_(hp)            # host to device

    def close(self) -> None:
        self.pool.shutdown()

"""The optimizer step of a profiled model: its state, time and temporaries.

Measured mode runs the real ``torch.optim`` step (snsim.execute.optim) with
its state initialized and every gradient present: ``state_bytes`` is the
state's tensors, ``step_transient_bytes`` the allocator's peak during the
step above what existed before it (the single-tensor Adam on a CPU holds
``sqrt(exp_avg_sq)`` and its quotient of one parameter at a time), and
``step_ms`` the median of timed steps.  Modeled mode (meta device) records
the optimizer and the parameter count only: the state follows the rule
(snsim.training.state_bytes) and the step is priced from bytes moved on the
trace's preset (snsim.graph.Graph.optimizer_ms).
"""

from __future__ import annotations

from typing import Any

import torch

from snsim.execute import optim
from snsim.execute.memory import measure_peak, time_ms
from snsim.training import Training


def training_record(model: torch.nn.Module, dev: torch.device, training: Training,
                    warmup: int, repeats: int) -> dict[str, Any]:
    """The trace's ``training`` object for ``model`` on ``dev``."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = training.to_dict()
    if not training.has_step:
        return out
    out["param_tensors"] = len(params)
    if dev.type == "meta":
        return out
    opt = optim.make(training, params)
    optim.initialize(opt)
    saved = [p.grad for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
        step = opt.step
        step()   # lazy initializations are not the step's
        existing = sum(t.numel() * t.element_size() for t in
                       list(model.parameters()) + list(model.buffers()))
        existing += sum(p.grad.numel() * p.grad.element_size() for p in params)
        existing += optim.state_bytes(opt)
        peak = measure_peak(step, dev, existing)
        ms, _ = time_ms(step, dev, warmup, repeats)
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    out.update(state_bytes=optim.state_bytes(opt), step_ms=round(ms, 6),
               step_transient_bytes=int(peak.window_bytes))
    return out

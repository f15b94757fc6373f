"""Validate one case: profile (or load) a trace, predict, execute, compare.

The prediction is made from the trace alone, before the real run; nothing
measured while executing feeds it.  Errors are signed relative errors,
``(measured - predicted) / measured``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from snsim.errors import SnsimError
from snsim.units import parse_budget


@dataclass(frozen=True)
class Case:
    model: str
    batch: int | None   # None: the example batch the model function returns
    policy: str
    input_shape: tuple[int, ...] | None = None
    budget: str | None = None
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 2
    optimizer: str | None = None   # None: no training record (no optimizer step)
    grads: str | None = None       # None: resident
    amp: str | None = None         # None: off
    # the optimizer's state and step on the host (ZeRO-Offload; a swapping policy's option)
    offload_optimizer: bool = False
    # policy optimal's planning: its deadline (seconds) and one busy process (snsim simulate's
    # --time-limit and --serial); the other policies ignore them
    time_limit: float = 60.0
    serial: bool = False

    @property
    def training(self):
        """The training record profiled for this case (None: none asked)."""
        if self.optimizer is None and self.grads is None and self.amp is None:
            return None
        from snsim.training import Training

        return Training(optimizer=self.optimizer or "sgd", grads=self.grads or "resident",
                        amp=self.amp or "off")


@dataclass
class Outcome:
    """Predicted against measured for one case (the ``--json`` object)."""

    model: str
    batch: int
    policy: str
    budget_bytes: int | None
    feasible: bool
    predicted_peak_bytes: int
    measured_peak_bytes: int
    peak_error: float
    predicted_step_ms: float
    measured_step_ms: float
    time_error: float
    max_grad_abs_diff: float
    device: str
    lower_bound_bytes: int = 0
    compute_ms: float = 0.0
    measured_reserved_bytes: int | None = None
    step_ms_samples: list[float] = field(default_factory=list)
    reason: str | None = None
    worst_grad_param: str | None = None   # the parameter with the largest gradient difference
    # the user's question: liveness's prediction against plain PyTorch autograd's real peak
    # (forward, cross entropy, loss.backward(); parameters and their .grad resident)
    liveness_predicted_peak_bytes: int = 0
    plain_peak_bytes: int = 0
    plain_peak_error: float = 0.0
    optimizer: str | None = None
    grads: str | None = None
    amp: str | None = None
    optimizer_state_bytes: int = 0
    offload_optimizer: bool = False
    # what the planner reported beside its plan (policy optimal: status, source,
    # optimality_gap, bound_ms, solve_s, ...; as snsim simulate --json's policy_stats)
    policy_stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["step_ms_samples"] = [round(x, 4) for x in self.step_ms_samples]
        return d


def _rel(measured: float, predicted: float) -> float:
    return (measured - predicted) / measured if measured else 0.0


class Session:
    """Traces and models built once per (model, batch, shape, device)."""

    def __init__(self, progress: bool = False):
        self.traces: dict = {}
        self.progress = progress
        self.bar = None

    def phase(self, name: str | None) -> None:
        """Show the real run's phase on a progress bar (None: the run is done)."""
        if not self.progress:
            return
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=4, desc="run", unit="phase", leave=False,
                            bar_format="{desc}: {n}/{total} phases {postfix} [{elapsed}]")
        elif name is not None:
            self.bar.update(1)
        if name is None:
            self.bar.close()
            self.bar = None
        else:
            self.bar.set_postfix_str(name)

    def trace(self, case: Case, trace_path: str | None = None):
        from snsim.trace import from_dict, load

        if trace_path is not None:
            return load(trace_path)
        key = (case.model, case.batch, case.input_shape, case.device, case.training)
        if key not in self.traces:
            from snsim.profile import profiler

            doc = profiler.profile(case.model, case.batch, case.input_shape,
                                   device=case.device, repeats=max(case.repeats, 3),
                                   warmup=case.warmup, progress=self.progress,
                                   training=case.training)
            self.traces[key] = from_dict(doc, f"<profile of {case.model}>")
        return self.traces[key]


def build_program(case: Case):
    """(model spec, example batch, Program) for ``case``, seeded as every run is."""
    import torch

    from snsim.torchgraph.program import Program
    from snsim.profile import profiler

    dev = torch.device(case.device)
    torch.manual_seed(0)
    ms = profiler.resolve(case.model, case.input_shape, dev)
    ms.model.train()
    example = profiler.example_input(ms, profiler.batch_size(ms, case.batch), dev)
    return ms, example, Program(ms.model, example)


def predict(graph, policy: str, budget: int | None, options: dict | None = None):
    """(schedule, simulated result) of ``policy`` (a reference policy such as
    ``optimal`` by name too, planned with ``options``); ``best`` is the policy
    the simulator ranks first under the budget (each policy planned once)."""
    from snsim import policies
    from snsim.evaluate import evaluate_many
    from snsim.report import rank

    names = policies.names() if policy == "best" else [policies.get(policy).name]
    runs = {e.policy: (e.schedule, e.result)
            for e in evaluate_many(graph, names, budget, options=options)}
    return runs[rank([r for _, r in runs.values()])[0].policy]


def validate_case(case: Case, session: Session | None = None,
                  trace_path: str | None = None) -> Outcome:
    """Run ``case`` and return predicted against measured."""
    import torch

    from snsim.execute import optim
    from snsim.execute.executor import Executor
    from snsim.execute.memory import measure_peak, time_ms
    from snsim.graph import Graph

    session = session or Session()
    threads = torch.get_num_threads()
    if case.device == "cpu":
        torch.set_num_threads(1)
    try:
        trace = session.trace(case, trace_path)
        if (case.batch is not None and trace.batch != case.batch) or (
                case.input_shape and trace.input_shape
                and tuple(case.input_shape) != trace.input_shape):
            raise SnsimError(
                f"{trace.label} is for batch {trace.batch}, input {list(trace.input_shape)}; "
                f"this run asks batch {case.batch}"
                + (f", input {list(case.input_shape)}" if case.input_shape else "")
                + ": pass the trace's --batch and --input-shape")
        graph = plain_graph = Graph(trace)
        if case.offload_optimizer:   # the policy's option: the same trace, state on the host
            from snsim.training import override

            graph = Graph(trace.with_training(override(trace.training, offload=True)))
        budget = parse_budget(case.budget, graph.lower_bound_bytes)
        schedule, pred = predict(graph, case.policy, budget,
                                 {"time_limit": case.time_limit, "serial": case.serial})
        policy = pred.policy
        live = liveness_prediction(plain_graph)   # a plain loop keeps its optimizer on device
        # ---- real run (nothing below feeds the prediction above) ----
        session.phase("build the model")
        dev = torch.device(case.device)
        ms, example, program = build_program(case)
        # the capture's forward changed only batch-norm running statistics,
        # which train-mode batch norm does not read
        reference = copy.deepcopy(ms.model)
        data_bytes = example.numel() * example.element_size()
        if program.n != graph.n or data_bytes != graph.layers[0].output_bytes:
            raise SnsimError(f"{trace.label} does not describe {case.model} at this input: "
                             f"{graph.n} layers and {graph.layers[0].output_bytes} input bytes "
                             f"in the trace, {program.n} and {data_bytes} in the model; "
                             "profile the same model, batch and input shape")
        batch = example.cpu().numpy().copy() if dev.type == "cpu" else example.cpu().pin_memory()
        ex = Executor(program, graph, schedule, dev)
        session.phase("gradients against autograd")
        try:
            ex.prepare(fresh=True)
            scale = optim.loss_scale(ex.optimizer)   # fp16: the step unscales them
            torch.manual_seed(1)
            ex.step(batch)
            # the gradients the optimizer stepped with: an offloaded one's host copies
            # (unscaled there under fp16; the device's stay as backward made them)
            grads = [hg.clone() for hg in ex.optimizer.host_grads] \
                if isinstance(ex.optimizer, optim.Offloaded) else \
                [p.grad.detach().clone() for p in program.param_list]
            torch.manual_seed(1)
            with ex.autocast():
                ref_loss = program.loss(reference(example))
            (ref_loss * scale if scale != 1.0 else ref_loss).backward()
            names = [n for n, p in ms.model.named_parameters() if p.requires_grad]
            ref = [p.grad if p.grad is None or scale == 1.0 else p.grad / scale
                   for p in reference.parameters() if p.requires_grad]
            diff, worst = grad_difference(names, grads, ref)
            del reference, ref, grads, ref_loss
            existing = program.existing_bytes() + ex.state_bytes()

            def once() -> None:
                ex.prepare(fresh=True)
                ex.step(batch)

            session.phase("peak memory")
            # memory comes back in the simulated order of copy ends (CPU copy
            # threads run at this machine's speed, not the trace's link)
            ex.release_order = pred.offload_ends
            peak = measure_peak(once, dev, existing, release=ex.release)
            ex.release_order = None   # the timed steps run the copies freely
            session.phase(f"step time ({case.warmup} warm-up, {case.repeats} timed)")
            step_ms, samples = time_ms(lambda: ex.step(batch), dev, case.warmup, case.repeats)
        finally:
            ex.close()
        plain = plain_autograd_peak(program, example, dev, graph.training)
    finally:
        session.phase(None)
        torch.set_num_threads(threads)
    return Outcome(
        model=case.model, batch=trace.batch, policy=policy, budget_bytes=budget,
        feasible=pred.feasible, predicted_peak_bytes=pred.peak_bytes,
        measured_peak_bytes=peak.peak_bytes,
        peak_error=_rel(peak.peak_bytes, pred.peak_bytes),
        predicted_step_ms=pred.iteration_ms, measured_step_ms=step_ms,
        time_error=_rel(step_ms, pred.iteration_ms), max_grad_abs_diff=diff,
        device=case.device, lower_bound_bytes=graph.lower_bound_bytes,
        compute_ms=pred.compute_ms, measured_reserved_bytes=peak.reserved_bytes,
        step_ms_samples=samples, reason=pred.reason, worst_grad_param=worst,
        liveness_predicted_peak_bytes=live.peak_bytes, plain_peak_bytes=plain,
        plain_peak_error=_rel(plain, live.peak_bytes), optimizer=case.optimizer,
        grads=case.grads, amp=case.amp, optimizer_state_bytes=trace.optimizer_state_bytes,
        offload_optimizer=case.offload_optimizer, policy_stats=dict(pred.policy_stats))


def liveness_prediction(graph):
    """What ``liveness`` predicts for a plain PyTorch step, with the whole device memory.

    The differences from policy ``liveness``: the input batch ``X_0`` is never
    freed, since the user's training loop holds it for the whole step (or the
    in-place layer that took its storage over); and a tensor the model's own
    code holds in a variable past its last reader stays until the code lets it
    go (``released_after``, capture note [14]), as under ``free_at: release``."""
    from snsim.graph import Graph, X
    from snsim.policies.liveness import liveness_ops
    from snsim.schedule.ops import COMPUTE, RELEASE, Compute, Schedule
    from snsim.sim import simulate

    from snsim.schedule.ledger import in_place_bytes

    huge = 1 << 60
    trace = graph.trace
    if "free_at" not in trace.extra and any("released_after" in la.extra
                                            for la in graph.layers):
        graph = Graph(replace(trace, extra={**trace.extra, "free_at": "release"}))
    ops = liveness_ops(graph)
    # The batch's storage is what the loop holds: where in-place layers write into
    # it (``x.sub_(mean)``, ``relu_``), it is theirs, and the last of that chain is
    # what stays (DESIGN 3, "In-place storage")
    held = X(0)
    while True:
        i = next((i for i, t in graph.in_place_of.items() if t == held), None)
        k = None if i is None else next(k for k, op in enumerate(ops)
                                        if op.action == COMPUTE and op.step == ("F", i))
        if k is None or not in_place_bytes(graph, ops, k, graph.size(X(i))):
            break
        held = X(i)
    ops = [op for op in ops if not (op.action == RELEASE and op.tensor == held)]
    if graph.optimizer_step is not None:   # the user's optimizer.step() ends the step
        ops.append(Compute(*graph.optimizer_step))
    return simulate(graph, Schedule("liveness", ops, huge), huge, record=False)


def plain_autograd_peak(program, example, device, training=None) -> int:
    """Peak bytes of a plain PyTorch step (the model, its loss, ``loss.backward()``), with
    every parameter's ``.grad`` allocated (as ``zero_grad(set_to_none=False)`` leaves it).

    With a ``training`` record, the whole training step, the forward and loss under
    its ``torch.autocast`` (amp) if any: then ``optimizer.step()``
    of the real ``torch.optim`` optimizer, its state initialized before the step;
    with ``set-to-none`` gradients no ``.grad`` exists when the step starts (as
    ``zero_grad()`` leaves them), so backward makes them."""
    import torch

    from snsim.execute import optim
    from snsim.execute.memory import measure_peak

    from snsim.torchgraph import amp

    batch = example.cpu()
    params = program.param_list
    region = amp.of(training)

    opt = optim.make(training, params)
    optim.initialize(opt)
    born = training is not None and training.set_to_none

    def once() -> None:
        # a user's loop: the batch (and the loss) stay alive through optimizer.step()
        if not born:
            for p in params:
                p.grad = torch.zeros_like(p)
        x = batch.to(params[0].device if params else device, copy=True)
        with amp.autocast(region, device):   # forward and loss; backward outside
            loss = program.reference_loss(x)
        optim.scaled(opt, loss).backward()   # scaler.scale(loss) under fp16
        if opt is not None:
            opt.step()

    def release() -> None:
        for p in params:
            p.grad = None

    once()  # lazy initializations are not the step's
    existing = program.existing_bytes() + optim.state_bytes(opt)
    return measure_peak(once, device, existing, release=release).peak_bytes


GRAD_TOLERANCE = 1e-5


def grad_difference(names, grads, ref) -> tuple[float, str | None]:
    """Largest |executor - autograd| over the parameters' gradients, and whose.

    A gradient one side has and the other lacks counts as its own size: a
    gradient lost on the way is never a silent 0.  ``grads`` may be host
    copies (an offloaded optimizer's) of ``ref``'s device gradients.  Non-finite elements (an
    fp16 backward that overflowed its loss scale: the step a ``GradScaler``
    skips) must be the same on both sides, element for element (inf, -inf or
    NaN); the difference is over the finite ones.
    """
    import torch

    worst, name = 0.0, None
    for n, a, b in zip(names, grads, ref):
        if not a.numel():
            continue
        if b is None:
            d = a.abs().max().item()
        else:
            if a.device != b.device:   # an offloaded optimizer's host copies
                a = a.to(b.device)
            fa, fb = torch.isfinite(a), torch.isfinite(b)
            if fa.all() and fb.all():
                d = (a - b).abs().max().item()
            elif not torch.equal(fa, fb) or not torch.equal(
                    torch.nan_to_num(a.masked_fill(fa, 0), nan=1.0),
                    torch.nan_to_num(b.masked_fill(fb, 0), nan=1.0)):
                d = float("inf")   # overflowed on one side only, or differently
            else:
                d = (a[fa] - b[fb]).abs().max().item() if fa.any() else 0.0
        if d != d:  # NaN on one side
            d = float("inf")
        if d > worst:
            worst, name = d, n
    return worst, name

"""``snsim validate``: one case, or a suite from a TOML file.

Imported by ``snsim/cli.py`` when it builds its parser; nothing here imports
torch at module level.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
import json
import sys

from snsim.errors import SnsimError, require_torch
from snsim.training import AMPS, GRADS, OPTIMIZERS
from snsim.units import positive_seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Execute a policy's schedule for real in PyTorch and compare the "
                          "measured peak memory and step time with the simulator's prediction.")
    parser.add_argument("--model", metavar="NAME|package.module:function",
                        help="a zoo model or a function returning an nn.Module, as for "
                             "snsim profile")
    parser.add_argument("--batch", type=int, help="batch size")
    parser.add_argument("--input-shape", metavar="C,H,W",
                        help="per-sample input shape (default: the model's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="cpu or cuda (default: cpu; for a suite, the suite's device)")
    parser.add_argument("--policy", default="superneurons",
                        help="policy name (the reference 'optimal' too), or 'best' (the "
                             "simulator's first under the budget)")
    parser.add_argument("--budget", help="memory budget (12GiB, 512MiB, 1.2xlb, bytes)")
    parser.add_argument("--trace", help="use this trace instead of profiling the model")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed steps, median reported (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps before timing (default: %(default)s)")
    parser.add_argument("--baselines", action="store_true",
                        help="also measure plain autograd, torch.utils.checkpoint (sqrt n) "
                             "and save_on_cpu (GPU only)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="profile with this optimizer and run its real torch.optim step "
                             "(in the executor and in plain PyTorch); default: none recorded")
    parser.add_argument("--grads", choices=GRADS,
                        help="gradient lifetime: resident (default) or set-to-none")
    parser.add_argument("--amp", choices=AMPS,
                        help="profile and run under torch.autocast (bf16, fp16); default off")
    parser.add_argument("--offload-optimizer", action="store_true",
                        help="with a swapping policy: the optimizer's state and step on the "
                             "host (ZeRO-Offload), run so by the executor")
    parser.add_argument("--time-limit", metavar="S", type=positive_seconds, default=60.0,
                        help="policy optimal: the deadline of its planning, seconds (default: "
                             "%(default)g; as for snsim simulate)")
    parser.add_argument("--serial", action="store_true",
                        help="policy optimal: one busy process at a time (as for snsim "
                             "simulate)")
    parser.add_argument("--json", action="store_true", help="print exactly the JSON result")
    parser.add_argument("--suite", metavar="SUITE.toml", help="run a validation suite")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (off anyway when stderr is not a "
                             "terminal)")
    parser.add_argument("--out", metavar="DIR", help="suite report folder "
                        "(default: beside the suite file, report-<suite name>)")


def check_case(case, trace_path: str | None) -> str | None:
    """Refuse, before any work, what a validation run would refuse after it:
    an unknown policy, a malformed budget, and a ``--trace`` that is not a
    measured trace of this kind of device (a modeled trace's times are a
    roofline's, not this machine's).  A trace measured on another processor or
    GPU model is compared; the warning to print with the result is returned."""
    from snsim import policies
    from snsim.profile.command import check_model
    from snsim.units import parse_budget

    check_model(case.model, case.input_shape)
    if case.policy != "best" and case.policy not in policies.names(reference=True):
        raise SnsimError(f"unknown policy {case.policy!r}; choose from: "
                         + ", ".join(policies.names(reference=True)) + ", best")
    if case.policy == "optimal":
        from snsim.policies.optimal.solve import highs

        highs()   # one line, before the model is profiled, if the solver is missing
    if getattr(case, "offload_optimizer", False):
        takes = [n for n in policies.names() if "offload_optimizer" in policies.get(n).options]
        if case.policy not in takes:
            raise SnsimError(f"--offload-optimizer is an option of the swapping policies "
                             f"({', '.join(takes)}), not of {case.policy}")
        if case.optimizer in (None, "none") and trace_path is None:
            raise SnsimError("--offload-optimizer needs an optimizer with a step: add "
                             "--optimizer")
    try:
        parse_budget(case.budget, 0)  # its form; the lower bound is checked with the trace
    except SnsimError as exc:
        raise SnsimError(f"--budget {case.budget!r}: {exc}") from None
    if trace_path is None:
        return None
    from snsim.inputs import load_trace

    trace = load_trace(trace_path)
    src = trace.source
    if src.get("kind") != "measured":
        raise SnsimError(f"--trace {trace_path} is a {src.get('kind', 'unmeasured')} trace "
                         f"(for {trace.device.name}): validate compares with a run measured "
                         "here; profile this machine (snsim profile --device "
                         f"{case.device}) or drop --trace")
    if src.get("device") != case.device:
        raise SnsimError(f"--trace {trace_path} was measured on {src.get('device')}, this run "
                         f"is on {case.device}: pass --device {src.get('device')} or profile "
                         f"on {case.device}")
    here = _device_name(case.device)
    if src.get("device_name") and here and src["device_name"] != here:
        return (f"--trace {trace_path} was measured on {src['device_name']}, this machine "
                f"is {here}: times are compared across processors")
    return None


def _device_name(device: str) -> str | None:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    from snsim.profile.profiler import cpu_name

    return cpu_name()


def run(args: argparse.Namespace) -> int:
    require_torch("snsim validate")
    if args.suite:
        from snsim.validation.suite import run_suite

        return run_suite(args.suite, args.out, device=args.device,
                         progress=not args.no_progress and sys.stderr.isatty())
    from snsim.profile.command import is_function

    missing = [f"--{k}" for k in ("model", "batch") if getattr(args, k) is None
               and not (k == "batch" and args.model and is_function(args.model))]
    if missing:
        raise SnsimError(f"snsim validate needs {', '.join(missing)} (or --suite FILE)")
    if (args.batch is not None and args.batch < 1) or args.repeats < 1 or args.warmup < 0:
        raise SnsimError("--batch and --repeats must be at least 1, --warmup at least 0")
    from snsim.profile.command import parse_shape
    from snsim.validation.run import Case, Session, validate_case

    optimizer, grads = getattr(args, "optimizer", None), getattr(args, "grads", None)
    amp = getattr(args, "amp", None)
    offload = getattr(args, "offload_optimizer", False)
    if args.trace and (optimizer or grads or amp):
        raise SnsimError("--optimizer/--grads/--amp profile the model with that training state; "
                         "with --trace the trace's own training record is used: drop one")
    case = Case(model=args.model, batch=args.batch, policy=args.policy,
                input_shape=parse_shape(args.input_shape), budget=args.budget,
                device=args.device or "cpu", repeats=args.repeats, warmup=args.warmup,
                optimizer=optimizer, grads=grads, amp=amp, offload_optimizer=offload,
                time_limit=args.time_limit, serial=args.serial)
    warning = check_case(case, args.trace)  # before any model is profiled
    session = Session(progress=not args.json and not args.no_progress and sys.stderr.isatty())
    out = validate_case(case, session, args.trace)
    if warning:  # after the run: a refusal of the case comes alone, as one line
        print(f"snsim: warning: {warning}", file=sys.stderr)
    base_rows = []
    if args.baselines:
        from snsim.validation.suite import measure_baselines

        base_rows = measure_baselines(case, out)
    if args.json:
        d = out.to_dict()
        if base_rows:
            d["baselines"] = [asdict(r) for r in base_rows]
        print(json.dumps(d, indent=1))
        return _grad_verdict(out)
    from snsim.units import fmt_bytes

    print(f"{case.model}, batch {out.batch}, {case.device}: policy {out.policy}, budget "
          f"{fmt_bytes(out.budget_bytes) if out.budget_bytes else 'device memory'}"
          + ("" if out.feasible else f"  (simulator: INFEASIBLE: {out.reason})"))
    if out.feasible:
        print(f"  peak memory  predicted {fmt_bytes(out.predicted_peak_bytes):>12}  measured "
              f"{fmt_bytes(out.measured_peak_bytes):>12}  error {out.peak_error:+.1%}")
        print(f"  step time    predicted {out.predicted_step_ms:9.2f} ms  measured "
              f"{out.measured_step_ms:9.2f} ms  error {out.time_error:+.1%}")
    else:  # the simulator stopped where the plan failed: its figures cover part of a step
        print(f"  peak memory  measured {fmt_bytes(out.measured_peak_bytes):>12}  (no prediction "
              "to compare: the simulator stops where the plan fails)")
        print(f"  step time    measured {out.measured_step_ms:9.2f} ms")
    stats = out.policy_stats
    if out.policy == "optimal" and "status" in stats:
        gap = stats.get("optimality_gap")
        print(f"  plan         {stats.get('source', out.policy)}; optimal's status "
              f"{stats['status']}, gap {'-' if gap is None else format(gap, '.2%')} to its "
              f"bound, planned in {stats.get('solve_s', 0):.1f} s")
    print(f"  gradients    max |executor - autograd| = {out.max_grad_abs_diff:.3g}")
    if out.optimizer or out.grads or out.amp:
        print(f"  training     optimizer {out.optimizer or 'sgd'} (state "
              f"{fmt_bytes(out.optimizer_state_bytes)}), gradients {out.grads or 'resident'}, "
              f"amp {out.amp or 'off'}: whole step, optimizer step included"
              + (" (state and step on the host)" if out.offload_optimizer else ""))
    print(f"  plain PyTorch: liveness predicts {fmt_bytes(out.liveness_predicted_peak_bytes):>12}"
          f"  autograd measured {fmt_bytes(out.plain_peak_bytes):>12}  error "
          f"{out.plain_peak_error:+.1%}")
    if base_rows:
        print("  what a user would run instead:")
        for row in base_rows:
            print(f"    {row.method:<20} peak {fmt_bytes(row.measured_peak_bytes):>12}"
                  f"  step {row.measured_step_ms:9.2f} ms")
    return _grad_verdict(out)


def _grad_verdict(out) -> int:
    """Exit 1, naming the parameter, when the executor's gradients are not autograd's."""
    from snsim.validation.run import GRAD_TOLERANCE

    if out.max_grad_abs_diff > GRAD_TOLERANCE:
        print(f"snsim validate: gradients differ from plain autograd: parameter "
              f"{out.worst_grad_param} by {out.max_grad_abs_diff:.3g} (tolerance "
              f"{GRAD_TOLERANCE:g})", file=sys.stderr)
        return 1
    return 0

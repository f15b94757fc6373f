"""``snsim`` command line: simulate, info, schedule, policies, profile, import.

Every user error is one line on stderr (``snsim: error: ...``) and exit 2;
``--json`` output is exactly JSON on stdout.  Files are written whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from snsim.errors import SnsimError
from snsim.units import parse_budget


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"snsim: error: {message} (see '{self.prog} --help')\n")


def _load(path: str, device: str | None = None):
    from snsim.graph import Graph
    from snsim.trace import load

    if device is not None:
        from snsim import devices

        devices.get(device)  # an unknown preset is refused before the trace is read
    trace = load(path)
    if device is not None:
        from snsim.whatif import retarget

        trace, note = retarget(trace, device)
        if note:
            print(f"snsim: note: {note}", file=sys.stderr)
    return Graph(trace)


def _run_policies(graph, policy: str, budget: int | None, record: bool,
                  thrash_limit: float = 2.0):
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import verify
    from snsim.sim import simulate

    from snsim.policies.base import trace_features

    names = policies.names() if policy == "all" else [policies.get(policy).name]
    if policy == "all":  # only the policies this trace can be planned with
        have = trace_features(graph)
        skipped = [n for n in names if policies.get(n).needs - have]
        if skipped:
            print(f"snsim: skipped {', '.join(skipped)}: they need a backward pass, and "
                  f"{graph.trace.label} is forward-only", file=sys.stderr)
        names = [n for n in names if n not in skipped]
    ctx = PlanContext(graph, budget, thrash_limit)
    results = []
    for name in names:
        schedule = policies.plan(name, ctx)
        verify(graph, schedule)
        results.append(simulate(graph, schedule, budget, record=record))
    return results


def cmd_simulate(args) -> int:
    from snsim.fileio import provenance, write_json
    from snsim.report import comparison_table, rank, single_table

    from snsim.fileio import check_writable

    if args.chrome_trace and args.policy == "all":
        raise SnsimError("--chrome-trace needs one policy, not 'all'")
    for out in (args.timeline, args.chrome_trace):
        if out:
            check_writable(out)  # fail before the work, not after it
    graph = _load(args.trace, args.device)
    budget = parse_budget(args.budget, graph.lower_bound_bytes)
    record = bool(args.timeline or args.chrome_trace)
    if not args.thrash_limit > 1.0:
        raise SnsimError(f"--thrash-limit must be above 1.0, got {args.thrash_limit}")
    results = _run_policies(graph, args.policy, budget, record, args.thrash_limit)
    config = {"trace": args.trace, "policy": args.policy, "budget_bytes": budget,
              "device": args.device}
    # provenance (it imports numpy for its version) only for the files that carry it
    prov = provenance(config) if record else None
    if args.timeline:
        from snsim.plots.timeline import plot_timeline

        plot_timeline(results, args.timeline, prov)
    if args.chrome_trace:
        from snsim.sim.chrome import chrome_trace

        write_json(args.chrome_trace, chrome_trace(results[0], prov))
    if args.json:
        out = [r.to_dict() for r in rank(results)] if args.policy == "all" \
            else results[0].to_dict()
        print(json.dumps(out, indent=1))
    elif args.policy == "all":
        print(comparison_table(results))
    else:
        print(single_table(results[0]))
    return 0


def cmd_info(args) -> int:
    from snsim.report import trace_summary

    print(trace_summary(_load(args.trace)))
    return 0


def cmd_schedule(args) -> int:
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import verify

    graph = _load(args.trace)
    budget = parse_budget(args.budget, graph.lower_bound_bytes)
    schedule = policies.plan(policies.get(args.policy).name, PlanContext(graph, budget))
    verify(graph, schedule)
    if schedule.infeasible_reason:
        print(f"# infeasible: {schedule.infeasible_reason}")
    for k, line in enumerate(schedule.lines()):
        print(f"{k:6d}  {line}")
    for key, value in schedule.stats.items():
        print(f"# {key}: {value}")
    return 0


def cmd_policies(args) -> int:
    from snsim import policies

    for name in policies.names():
        print(f"{name:<18} {policies.get(name).summary}")
    return 0


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="record a trace from a PyTorch model (needs torch)")
    try:
        from snsim.profile.command import add_arguments, run
    except ImportError as exc:  # profiler package missing or broken
        reason = str(exc)

        def run(args) -> int:  # noqa: ARG001
            raise SnsimError(f"the profiler is unavailable: {reason}")

        p.add_argument("rest", nargs=argparse.REMAINDER)
    else:
        add_arguments(p)
    p.set_defaults(func=run)


def _add_validate(sub) -> None:
    from snsim.validation.command import add_arguments, run

    p = sub.add_parser("validate", help="run a schedule for real and compare with the "
                       "simulator (needs torch)")
    add_arguments(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    from snsim import __version__

    parser = _Parser(prog="snsim", description="Simulate GPU memory management policies "
                     "for DNN training on a recorded trace (after SuperNeurons, PPoPP 2018).")
    parser.add_argument("--version", action="version", version=f"snsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("simulate", help="plan a policy and replay it in the simulator")
    p.add_argument("trace", help="trace file (snsim.trace/1 JSON)")
    p.add_argument("--policy", default="superneurons",
                   help="policy name, or 'all' to compare every policy (default: %(default)s)")
    p.add_argument("--budget", help="memory budget: 12GiB, 12GB, 512MiB, bytes, or 1.05xlb "
                   "(a multiple of the lower bound); default: the trace device's memory")
    p.add_argument("--json", action="store_true", help="print exactly the JSON result")
    p.add_argument("--device", metavar="PRESET",
                   help="what-if on another device preset (snsim profile --list-device-models): "
                   "its memory and host link; a modeled trace's step times re-priced from its "
                   "kernels, other traces' kept (a note says so)")
    p.add_argument("--thrash-limit", type=float, default=2.0, metavar="X",
                   help="dtr: infeasible once recomputation exceeds (X - 1) x the compute, "
                   "as simrd (default: %(default)s)")
    p.add_argument("--timeline", metavar="FILE.png", help="plot memory over the iteration")
    p.add_argument("--chrome-trace", metavar="FILE.json",
                   help="write compute and copy streams in Chrome trace format (Perfetto)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("info", help="summarize a trace")
    p.add_argument("trace")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("schedule", help="print the explicit schedule a policy plans")
    p.add_argument("trace")
    p.add_argument("--policy", default="superneurons")
    p.add_argument("--budget")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("policies", help="list the registered policies")
    p.set_defaults(func=cmd_policies)

    _add_profile(sub)
    _add_validate(sub)
    from snsim.importers.command import add_arguments as add_import

    add_import(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SnsimError as exc:
        print(f"snsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("snsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

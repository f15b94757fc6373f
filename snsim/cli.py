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
from snsim.units import parse_budget, positive_seconds


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"snsim: error: {printable(message)} (see '{self.prog} --help')\n")


def _load(path: str, device: str | None = None, progress: bool | None = None):
    """The trace at ``path`` as a Graph (retargeted to ``device``); a large file
    (over 1 MB, ~2 s to read and check) shows a bar on a terminal."""
    from snsim.graph import Graph

    from snsim.inputs import load_trace

    if device is not None:
        from snsim import devices

        devices.get(device)  # an unknown preset is refused before the trace is read
    import os

    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress and os.path.isfile(path) and os.path.getsize(path) > 2**20:
        from tqdm import tqdm

        bar = tqdm(total=1, desc=f"read and check {path}", unit="file", leave=False,
                   file=sys.stderr)
    # The trace and its graph (~10^5 objects on a deep trace) live to the end of
    # the command and hold no cycles: no cyclic collection while they are made,
    # then out of the collector's generations (frozen) before it runs again, so
    # it never walks them (a pass over them costs about a tenth of a second).
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        try:
            trace = load_trace(path)
        finally:
            if bar is not None:
                bar.close()
        if device is not None:
            from snsim.whatif import retarget

            trace, note = retarget(trace, device)
            if note:
                print(f"snsim: note: {printable(note)}", file=sys.stderr)
        graph = Graph(trace)
        gc.freeze()
    finally:
        if was:
            gc.enable()
    return graph


def _budget(text: str | None, graph) -> int | None:
    """``--budget`` for ``graph``: a size, a multiple of its lower bound, or of
    the baseline peak an imported op log records."""
    return parse_budget(text, graph.lower_bound_bytes,
                        graph.trace.source.get("baseline_peak_bytes"))


def _run_policies(graph, policy: str, budget: int | None, record: bool,
                  options: dict | None = None, progress: bool = False,
                  thrash_limit: float = 2.0):
    from snsim import policies
    from snsim.evaluate import evaluate
    from snsim.policies.base import PlanContext, trace_features

    names = policies.names() if policy == "all" else [policies.get(policy).name]
    if policy == "all":  # only the policies this trace can be planned with
        have = trace_features(graph)
        skipped = [n for n in names if policies.get(n).needs - have]
        if skipped:
            print(f"snsim: skipped {', '.join(skipped)}: they need a backward pass, and "
                  f"{graph.trace.label} is forward-only", file=sys.stderr)
        names = [n for n in names if n not in skipped]
    ctx = PlanContext(graph, budget, options, thrash_limit=thrash_limit)
    results = []
    if progress and len(names) > 1:
        from tqdm import tqdm

        names = tqdm(names, desc="policies", unit="policy", leave=False, file=sys.stderr)
    # No cyclic collection while the policies run: each one's plan, effects and
    # replay are acyclic and freed by reference counting (the simulator closes
    # its processes), so the collector only walked them; its passes after each
    # plan and each verify (~60,000 new ops apiece on ResNet-2500) cost about
    # 0.15 s of `--policy all`.  What little cyclic garbage a planner leaves (dtr:
    # about 34,000 tuples) waits for the next pass after the loop.
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            results.append(evaluate(graph, name, budget, record=record, context=ctx).result)
    finally:
        if was:
            gc.enable()
    return results


def cmd_simulate(args) -> int:
    from snsim.fileio import provenance, write_json
    from snsim.report import comparison_table, rank, single_table

    from snsim.fileio import check_writable

    from snsim.inputs import check_outputs, plot_format

    if args.chrome_trace and args.policy == "all":
        raise SnsimError("--chrome-trace needs one policy, not 'all'")
    if args.policy != "all":
        from snsim import policies

        policies.get(args.policy)  # an unknown policy is refused before the trace is read
    if args.offload_optimizer:
        _check_offload(args.policy)
    if not args.thrash_limit > 1.0:   # before the trace is read
        raise SnsimError(f"--thrash-limit must be above 1.0, got {args.thrash_limit}")
    check_outputs([("trace", args.trace)],
                  [("--timeline", args.timeline), ("--chrome-trace", args.chrome_trace)])
    if args.timeline:
        plot_format(args.timeline)
    for out in (args.timeline, args.chrome_trace):
        if out:
            check_writable(out)  # fail before the work, not after it
    show = not args.no_progress and sys.stderr.isatty()
    graph = _with_training(_load(args.trace, args.device, progress=show), args)
    budget = _budget(args.budget, graph)
    record = bool(args.timeline or args.chrome_trace)
    results = _run_policies(graph, args.policy, budget, record,
                            {"time_limit": args.time_limit, "serial": args.serial},
                            progress=show,
                            thrash_limit=args.thrash_limit)
    config = {"trace": args.trace, "policy": args.policy, "budget_bytes": budget,
              "device": args.device}
    # provenance (it imports numpy for its version) only for the files that carry it
    prov = provenance(config) if record else None
    if args.timeline:
        from snsim.plots.timeline import plot_timeline

        plot_timeline(results, args.timeline, prov)
    if args.chrome_trace:
        from snsim.sim.chrome import chrome_trace

        write_json(args.chrome_trace, chrome_trace(results[0], prov,
                                                   [layer.name for layer in graph.layers]))
    if args.json:
        out = [r.to_dict() for r in rank(results)] if args.policy == "all" \
            else results[0].to_dict()
        print(json.dumps(out, indent=1))
    elif args.policy == "all":
        print(printable_lines(comparison_table(results)))
    else:
        print(printable_lines(single_table(results[0])))
    return 0


def _check_offload(policy: str) -> None:
    """``--offload-optimizer`` is an option of the swapping policies only."""
    from snsim import policies

    takes = [n for n in policies.names() if "offload_optimizer" in policies.get(n).options]
    if policy == "all" or "offload_optimizer" not in policies.get(policy).options:
        raise SnsimError(f"--offload-optimizer is an option of the swapping policies "
                         f"({', '.join(takes)}), not of {policy}")


def _with_training(graph, args):
    """``graph`` with simulate's ``--optimizer``/``--grads``/``--offload-optimizer``
    applied to its trace."""
    optimizer, grads = getattr(args, "optimizer", None), getattr(args, "grads", None)
    offload = getattr(args, "offload_optimizer", False)
    if optimizer is None and grads is None and not offload:
        return graph
    from snsim.graph import Graph
    from snsim.training import override

    trace = graph.trace
    t = override(trace.training, optimizer, grads, offload)
    if offload and not t.has_step:
        raise SnsimError(f"--offload-optimizer: {trace.label} records no optimizer with a "
                         "step; add --optimizer")
    return Graph(trace.with_training(t))


def cmd_info(args) -> int:
    from snsim.breakdown import breakdown_lines
    from snsim.report import trace_summary

    graph = _with_training(_load(args.trace), args)
    print(printable_lines(trace_summary(graph)))
    print(printable_lines(breakdown_lines(graph)))
    return 0


SCHEDULE_KEY = ("# key: compute Fi / Bi / Ri = forward, backward, recomputed forward of layer i; "
                "Xi = its output, Gi = its gradient, Si = its saved extras; "
                "free, offload (to host), prefetch (to device), wait (for a copy); "
                "algo=k: the step's k-th workspace algorithm; "
                "compute On = the optimizer step, after the last backward (a trace with "
                "a training record)")


def cmd_schedule(args) -> int:
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import verify

    if args.policy not in policies.names():  # 'all' is simulate's, not schedule's
        raise SnsimError(f"schedule needs one policy, got {args.policy!r}; choose from: "
                         + ", ".join(policies.names()))
    graph = _load(args.trace)
    budget = _budget(args.budget, graph)
    schedule = policies.plan(policies.get(args.policy).name, PlanContext(graph, budget))
    verify(graph, schedule)
    print(SCHEDULE_KEY)
    if schedule.infeasible_reason:
        print(f"# infeasible: {printable(schedule.infeasible_reason)}")
    for k, line in enumerate(schedule.lines()):
        print(f"{k:6d}  {line}")
    for key, value in schedule.stats.items():
        print(printable(f"# {key}: {value}"))
    return 0


def cmd_policies(args) -> int:
    from snsim import policies

    for name in policies.names(reference=True):
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


def _add_search(sub) -> None:
    from snsim.search.command import add_arguments, run

    p = sub.add_parser("search", help="capacity search: deepest ResNet or largest batch a "
                       "policy fits")
    add_arguments(p)
    p.set_defaults(func=run)


def _add_experiment(sub) -> None:
    from snsim.experiments.command import add_arguments, run

    p = sub.add_parser("experiment", help="run a paper-style experiment (CSV, PNG, PDF)")
    add_arguments(p)
    p.set_defaults(func=run)


def _add_training(p) -> None:
    from snsim.training import GRADS, OPTIMIZERS

    p.add_argument("--optimizer", choices=OPTIMIZERS,
                   help="override the trace's optimizer (its state is static memory; the "
                   "iteration ends with its step); default: the trace's (none recorded: no "
                   "optimizer step, as sgd without a training record)")
    p.add_argument("--grads", choices=GRADS,
                   help="parameter gradients resident throughout, or set-to-none: born in "
                   "backward, kept to the optimizer step; default: the trace's (resident)")


# commands whose parsers cli.py builds itself; the others' come from their modules
CORE_COMMANDS = ("simulate", "info", "schedule", "policies")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``snsim`` parser; for one of :data:`CORE_COMMANDS` (the command a
    command line names), without the other commands, whose modules it would
    import only to add their options."""
    from snsim import __version__

    parser = _Parser(prog="snsim", description="Simulate GPU memory management policies "
                     "for DNN training on a recorded trace (after SuperNeurons, PPoPP 2018).")
    parser.add_argument("--version", action="version", version=f"snsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("simulate", help="plan a policy and replay it in the simulator")
    p.add_argument("trace", help="trace file (snsim.trace/1 JSON)")
    p.add_argument("--policy", default="superneurons",
                   help="policy name, or 'all' to compare every policy (default: %(default)s)")
    p.add_argument("--budget", help="memory budget: 12GiB, 12GB, 512MiB, bytes, 1.05xlb "
                   "(a multiple of the lower bound) or, on an imported op log, 0.5xbaseline "
                   "(of its unlimited peak); default: the trace device's memory")
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
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (it is off anyway when stderr is not a "
                   "terminal)")
    p.add_argument("--time-limit", metavar="S", type=positive_seconds, default=60.0,
                   help="solver time limit of policy optimal, seconds (default: %(default)g)")
    p.add_argument("--serial", action="store_true",
                   help="policy optimal: one busy process at a time (no child process "
                   "bounding its class on a second core beside the heuristics' work), for a "
                   "machine shared with other work")
    _add_training(p)
    p.add_argument("--offload-optimizer", action="store_true",
                   help="ZeRO-Offload: the optimizer state lives on the host and the step runs "
                   "there (gradients copied down, parameters back); swapping policies only")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("info", help="summarize a trace")
    p.add_argument("trace", help="trace file (snsim.trace/1 JSON)")
    _add_training(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("schedule", help="print the explicit schedule a policy plans")
    p.add_argument("trace", help="trace file (snsim.trace/1 JSON)")
    p.add_argument("--policy", default="superneurons",
                   help="one policy name (see 'snsim policies'; default: %(default)s)")
    p.add_argument("--budget", help="memory budget, as for simulate (default: the trace "
                   "device's memory)")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("policies", help="list the registered policies")
    p.set_defaults(func=cmd_policies)

    if command in CORE_COMMANDS:
        return parser
    _add_profile(sub)
    _add_validate(sub)
    from snsim.importers.command import add_arguments as add_import

    add_import(sub)
    _add_search(sub)
    _add_experiment(sub)
    return parser


def printable(text: str) -> str:
    """``text`` with control characters (from names in a user's file) escaped,
    so an error stays one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


def printable_lines(text: str) -> str:
    """:func:`printable` line by line (tables keep their lines)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command, where the line starts with it (no top-level option before it)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SnsimError as exc:
        print(f"snsim: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("snsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

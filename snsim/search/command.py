"""``snsim search max-depth | max-batch``: the capacity searches on the command line."""

from __future__ import annotations

import argparse
import json
import sys

from snsim.errors import SnsimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Largest network a policy fits in the budget: the deepest ResNet "
                          "(family [6, 32, n, 6], depth 3n + 134, searched in n) or the "
                          "largest batch of a zoo model; the exact largest (bracket from the "
                          "lower bound, the peaks' line, the recomputation's margin, bisection), "
                          "probes cached.")
    parser.add_argument("what", choices=("max-depth", "max-batch"),
                        help="max-depth: deepest ResNet; max-batch: largest batch of --model")
    parser.add_argument("--policy", default="superneurons", help="policy (default: %(default)s)")
    parser.add_argument("--device-model", default="k40c", metavar="PRESET",
                        help="device preset the traces are modeled on (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=16,
                        help="max-depth: batch size (default: %(default)s)")
    parser.add_argument("--model", help="max-batch: zoo model name (ResNets need no torch)")
    parser.add_argument("--budget", help="memory budget, e.g. 12GiB (default: the preset's "
                        "memory)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--cache", metavar="DIR",
                        help="probe cache: planned probes are kept here and not planned "
                        "again (default: $SNSIM_CACHE, else ~/.cache/snsim; an experiment's "
                        "is OUT/cache)")
    parser.add_argument("--no-cache", action="store_true", help="plan every probe, keep none")
    parser.add_argument("--workers", type=int, default=default_workers(), metavar="N",
                        help="processes probing the sizes the search may ask for next "
                        "while it waits (default: the CPUs, at most %d: %%(default)s); "
                        "the probes and the answer are the same with any N" % MAX_WORKERS)


MAX_WORKERS = 4   # each probe of a deep network holds its own graph and plan


def default_workers() -> int:
    import os

    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def check(args):
    """Every argument checked before work: (budget bytes or None)."""
    from snsim import devices, policies
    from snsim.units import parse_size

    policies.get(args.policy)
    devices.get(args.device_model)
    if args.workers < 1:
        raise SnsimError(f"--workers must be at least 1, got {args.workers}")
    if args.what == "max-depth" and args.batch < 1:
        raise SnsimError(f"--batch must be at least 1, got {args.batch}")
    if args.what == "max-batch":
        if not args.model:
            raise SnsimError("max-batch needs --model NAME")
        from snsim.search.models import check_model

        check_model(args.model)
    if args.budget is None:
        return None
    if args.budget.strip().lower().endswith("xlb"):
        raise SnsimError("a search's budget is a size (e.g. 12GiB): each probe has its own "
                         "lower bound")
    return parse_size(args.budget)


def run(args) -> int:
    from snsim import policies
    from snsim.search import models
    from snsim.search.cache import ProbeCache, default_dir
    from snsim.search.capacity import search

    budget = check(args)
    cache = None if args.no_cache else ProbeCache(args.cache or default_dir()).check()
    name = policies.get(args.policy).name
    bar = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        tqdm.monitor_interval = 0   # no monitor thread: the search forks its workers
        bar = tqdm(desc=f"{args.what} {name}", unit="probe", leave=False, file=sys.stderr)

    def on_probe(p):
        if bar is not None:
            bar.set_postfix_str(f"{p.size}: {'fits' if p.feasible else 'fails'}")
            bar.update()
    try:
        if args.what == "max-depth":
            family = models.depth_family(args.batch, args.device_model)
        else:
            family = models.batch_family(args.model, args.device_model)
        res = search(name, family, budget, on_probe, cache=cache, workers=args.workers)
    finally:
        if bar is not None:
            bar.close()
    d = res.to_dict()
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    from snsim.units import fmt_bytes

    size = "depth" if args.what == "max-depth" else "batch"
    if d[size] is None:
        print(f"{name}: fits no {size} >= the first probe; "
              f"{d['first_failing']['reason']}")
        return 0
    print(f"{name}: largest {size} {d[size]} (peak {fmt_bytes(d['peak_bytes'])}, "
          f"{d['iteration_ms']:.1f} ms/iteration, {d['samples_per_s']:.1f} samples/s); "
          f"{size} {d['first_failing'][size]} fails: {d['first_failing']['reason']} "
          f"({d['probes']} probes, {d['planned']} planned)")
    return 0

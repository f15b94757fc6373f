"""``snsim experiment NAME | --list``: run one paper-style experiment."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from snsim.errors import SnsimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run a paper-style experiment: a tidy CSV, a PNG, a PDF and the "
                          "resolved configuration in --out.")
    parser.add_argument("name", nargs="?", help="experiment name (see --list), or 'all' "
                        "(the paper's figures, one after another in this process)")
    parser.add_argument("--list", action="store_true", help="list the experiments")
    parser.add_argument("--out", default="experiments-out", metavar="DIR",
                        help="output folder, created if missing (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a reduced version (fewer networks, sizes, policies)")
    parser.add_argument("--workers", type=int, default=2,
                        help="local worker processes (default: %(default)s)")
    parser.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                        help="run the points on this Dask distributed scheduler")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--parquet", action="store_true",
                        help="also write each table as NAME.parquet (needs pyarrow: "
                        "pip install 'snsim[parquet]'); the CSV is always written")


def run(args) -> int:
    from snsim.experiments import EXPERIMENTS, names, paper_names
    from snsim.experiments.base import Options, save

    if args.list:
        for e in EXPERIMENTS.values():
            print(f"{e.name:<16} {e.summary}")
        return 0
    if not args.name:
        raise SnsimError("experiment needs a NAME or --list; choose from: " + ", ".join(names()))
    if args.name != "all" and args.name not in EXPERIMENTS:
        raise SnsimError(f"unknown experiment {args.name!r}; choose from: " + ", ".join(names()))
    if args.workers < 1:
        raise SnsimError(f"--workers must be at least 1, got {args.workers}")
    for name in paper_names() if args.name == "all" else [args.name]:
        EXPERIMENTS[name].check()   # a missing extra: one line, before --out is made
    if args.scheduler is not None and not args.scheduler.startswith(("tcp://", "tls://")):
        raise SnsimError(f"--scheduler takes tcp://HOST:PORT, not {args.scheduler!r}")
    if args.parquet:
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise SnsimError("--parquet needs pyarrow: pip install 'snsim[parquet]' "
                             "(the CSV needs nothing)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SnsimError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SnsimError(f"cannot make --out {out}: {exc.strerror or exc}") from None
    from snsim.fileio import check_writable

    check_writable(out / "experiment.csv")
    opts = Options(out, args.quick, args.workers, args.scheduler,
                   not args.no_progress and sys.stderr.isatty(), parquet=args.parquet)
    start = time.perf_counter()
    for name in paper_names() if args.name == "all" else [args.name]:
        t0 = time.perf_counter()
        outcome = EXPERIMENTS[name].load()(opts)
        paths = save(name, outcome, opts)
        if outcome.summary:
            print(outcome.summary)
        print(f"{name}: {len(outcome.table)} rows in {time.perf_counter() - t0:.1f} s; "
              f"wrote {', '.join(str(p) for p in paths)}", flush=True)
    if args.name == "all":
        print(f"all experiments: {time.perf_counter() - start:.1f} s")
    return 0

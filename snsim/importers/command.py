"""``snsim import dtr-log LOG --out TRACE.json``: an op log as a trace;
``snsim import torch-snapshot SNAPSHOT.pickle``: measured peaks.

LOG is one ``.log`` file, a folder of them or a zip (the DTR authors'
``logs.zip``); with several logs ``--out`` is a folder and each trace is
named after its log.  Every file is written whole, with the importer's
configuration and versions in ``source.import``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snsim.errors import SnsimError


def add_arguments(sub) -> None:
    p = sub.add_parser("import", help="turn another tool's record into a snsim trace")
    kinds = p.add_subparsers(dest="importer", required=True, parser_class=type(p),
                             help="what to import: dtr-log or torch-snapshot")
    q = kinds.add_parser("dtr-log", help="DTR op logs (simrd's input): forward-only traces")
    q.add_argument("log", help="a .log file, a folder of them, or a zip holding them")
    q.add_argument("--out", required=True,
                   help="trace file to write (a folder when LOG holds several logs)")
    q.add_argument("--free-at", choices=("release", "last_use"), default="release",
                   help="free a tensor when the program releases it (as simrd) or at its "
                   "last use (default: %(default)s)")
    q.set_defaults(func=run_dtr_log)
    q = kinds.add_parser("torch-snapshot", help="a PyTorch CUDA memory snapshot "
                         "(torch.cuda.memory._dump_snapshot): measured allocated and reserved")
    q.add_argument("snapshot", help="the snapshot pickle")
    q.add_argument("--out", help="write the summary as JSON (whole, with provenance)")
    q.set_defaults(func=run_torch_snapshot)


def _targets(logs: list, out: str) -> list[Path]:
    if len(logs) == 1 and not Path(out).is_dir():
        return [Path(out)]
    folder = Path(out)
    if not folder.is_dir():
        raise SnsimError(f"--out {out}: {len(logs)} logs need an existing folder")
    from snsim.importers.dtr_log import model_name

    return [folder / f"{model_name(label)}.json" for label, _ in logs]


def run_dtr_log(args: argparse.Namespace) -> int:
    from snsim.fileio import check_writable, provenance
    from snsim.importers.dtr_log import parse, read_text, to_document
    from snsim.trace.io import from_dict, save

    logs = read_text(args.log)
    targets = _targets(logs, args.out)
    for t in targets:
        check_writable(t)
    docs = []
    for label, lines in logs:   # every log parsed and checked before anything is written
        doc = to_document(parse(lines, label), label, args.free_at)
        doc["source"]["import"] = provenance({"importer": "dtr-log", "log": label,
                                              "free_at": args.free_at})
        docs.append(from_dict(doc, label))
    for trace, target in zip(docs, targets):
        save(trace, target)
        src = trace.source
        print(f"{target}: {src['op_log']['ops']} ops, constants "
              f"{trace.extra['constant_bytes']} B, baseline peak "
              f"{src['baseline_peak_bytes']} B", file=sys.stderr)
    return 0


def run_torch_snapshot(args: argparse.Namespace) -> int:
    from snsim.importers.torch_snapshot import run

    return run(args)

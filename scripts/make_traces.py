"""Regenerate the shipped profiled traces in ``traces/`` (issue 3).

* ``cpu_*``: measured on this machine's CPU (one thread, 10 repeats, 3
  warm-ups) at small batch and image sizes, so each run takes seconds.
* ``k40c_*``: modeled for the paper's 12 GB K40c (meta device + roofline) at
  the paper's batch sizes: AlexNet 128; VGG-16, ResNet-50/101/152 and
  Inception-v4 at 16 and 32; ResNet-2500 at 16 and 32.

Every trace carries its provenance in ``source``.  (Shaped traces for
benchmarks and tests at sizes nothing here can run come from ``snsim.synth``.)

Usage: ``python scripts/make_traces.py [--only SUBSTRING] [--out-dir traces]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from snsim.profile import profiler

# (file stem, model, batch, input shape or None, mode) -- mode "cpu" or a preset
TRACES: list[tuple[str, str, int, tuple[int, ...] | None, str]] = [
    ("cpu_resnet18_b8_64", "resnet18", 8, (3, 64, 64), "cpu"),
    ("cpu_alexnet_b16_128", "alexnet", 16, (3, 128, 128), "cpu"),
    ("cpu_vgg16_b4_64", "vgg16", 4, (3, 64, 64), "cpu"),
    ("cpu_gpt_small_b4", "gpt:layers=2,heads=4,width=128,vocab=1000", 4, (64,), "cpu"),
    ("k40c_alexnet_b128", "alexnet", 128, None, "k40c"),
    *[(f"k40c_{m}_b{b}", m, b, None, "k40c")
      for m in ("vgg16", "resnet50", "resnet101", "resnet152", "inception_v4")
      for b in (16, 32)],
    ("k40c_resnet2500_b16", "resnet-2500", 16, None, "k40c"),
    ("k40c_resnet2500_b32", "resnet-2500", 32, None, "k40c"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="regenerate only traces whose name contains this")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent.parent / "traces"))
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for stem, model, batch, shape, mode in TRACES:
        if args.only and args.only not in stem:
            continue
        t0 = time.perf_counter()
        measured = mode == "cpu"
        doc = profiler.profile(model, batch, shape, device="cpu" if measured else None,
                               device_model=None if measured else mode, repeats=10, warmup=3)
        path = Path(args.out_dir) / f"{stem}.json"
        profiler.write(doc, path)
        print(f"{path}: {len(doc['layers'])} layers, {path.stat().st_size / 2**20:.2f} MiB, "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

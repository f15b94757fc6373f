"""Profiler benchmark (issue 3): prints figures, asserts nothing.

1. Modeled ResNet-2500 ([6, 32, 788, 6] bottlenecks, 3x227x227) at batch 32 on
   the k40c preset: wall time of trace generation (target <= 60 s).
2. Measured CPU profile of resnet18 at batch 8, 3x64x64 (one thread, 10
   repeats, 3 warm-ups): overhead = sum of the trace's per-layer fwd+bwd
   pass medians / median plain training step - 1 (target <= 10% in magnitude:
   the per-layer times must add up to what training costs), the same for the
   executor's per-step times the trace keeps as fwd_ms/bwd_ms, and the
   profiler's own wall time in plain steps.

Run: ``python benchmarks/bench_profile.py [--skip-2500]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from snsim.profile import profiler


def bench_resnet2500(batch: int = 32) -> None:
    t0 = time.perf_counter()
    doc = profiler.profile("resnet-2500", batch, device_model="k40c")
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r2500.json")
        profiler.write(doc, path)
        size = os.path.getsize(path)
    t2 = time.perf_counter()
    acts = sum(layer["output_bytes"] for layer in doc["layers"])
    print(f"modeled resnet-2500 batch {batch} (k40c): {len(doc['layers'])} layers, "
          f"profile {t1 - t0:.1f} s + validate/write {t2 - t1:.1f} s = {t2 - t0:.1f} s "
          f"(target <= 60 s); file {size / 2**20:.2f} MiB; activations {acts / 2**30:.1f} GiB; "
          f"modeled iteration {sum(la['fwd_ms'] + la['bwd_ms'] for la in doc['layers']):.0f} ms")


def bench_resnet18(batch: int = 8, image: int = 64, repeats: int = 10, warmup: int = 3) -> None:
    t0 = time.perf_counter()
    doc = profiler.profile("resnet18", batch, (3, image, image), device="cpu",
                           repeats=repeats, warmup=warmup)
    wall = time.perf_counter() - t0
    src = doc["source"]
    step, total = src["step_ms"], src["layers_total_ms"]
    print(f"measured resnet18 batch {batch} 3x{image}x{image} (cpu, 1 thread, repeats {repeats}, "
          f"warmup {warmup}): plain training step median {step:.2f} ms "
          f"(p10 {src['step_ms_p10']:.2f}, p90 {src['step_ms_p90']:.2f}); "
          f"sum of per-layer fwd+bwd medians {total:.2f} ms; "
          f"overhead {100 * (total / step - 1):+.1f}% (target <= 10%)")
    ex_total = src.get("executor_layers_total_ms")
    if ex_total:
        print(f"  the trace's fwd_ms/bwd_ms are the executor's per-step medians: sum "
              f"{ex_total:.2f} ms, {100 * (ex_total / step - 1):+.1f}% vs the plain step "
              "(the executor's per-layer autograd calls and hooks)")
    print(f"  profiler wall time {wall:.2f} s = {wall * 1e3 / step:.0f} plain steps "
          f"(capture, {warmup + repeats} timed passes over the layers each followed by a "
          f"plain step, link test, then transient memory and {warmup + repeats} executor "
          "steps)")
    print("  link: " + json.dumps({k: src["link"][k] for k in ("kind", "h2d_bytes_per_s")}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-2500", action="store_true")
    args = ap.parse_args()
    bench_resnet18()
    if not args.skip_2500:
        bench_resnet2500()


if __name__ == "__main__":
    main()

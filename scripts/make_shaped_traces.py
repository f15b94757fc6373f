#!/usr/bin/env python3
"""Write the shaped traces shipped in traces/ (shaped_*.json).

They are built by ``snsim.synth`` from layer shapes (exact bytes) and a
roofline time model of a nominal K40c (times are modeled, not measured);
each file's ``source`` says so.  Profiled traces (``snsim profile``) sit
beside them.  Run from the repository root:

    python scripts/make_shaped_traces.py
"""

from pathlib import Path

from snsim import synth
from snsim.trace import save

OUT = Path(__file__).resolve().parent.parent / "traces"

TRACES = {
    "shaped_cnn_chain.json": lambda: synth.cnn_chain(batch=64, image=64),
    "shaped_resnet50.json": lambda: synth.resnet((3, 4, 6, 3), batch=32, image=227),
    "shaped_inception.json": lambda: synth.inception_net(batch=64, image=64, modules=3),
}

if __name__ == "__main__":
    for name, make in TRACES.items():
        save(make(), OUT / name)
        print(f"wrote {OUT / name}")

"""``snsim simulate TRACE --device KEY``: the same trace on another device preset.

The device's memory (the default budget) and host link always change.  Step
times change only where the trace says how they were made:

* a modeled trace whose layers carry their kernels' ``[flops, bytes]``
  (``fwd_kernels``/``bwd_kernels``, written by ``snsim profile
  --device-model``) is re-priced kernel by kernel with the same roofline
  (:func:`snsim.devices.step_ms`), so re-targeting to the trace's own preset
  gives its times back exactly;
* any other trace keeps its times, and :func:`retarget` says so in its note
  (a measured trace's times are that machine's; re-profile to move them).
"""

from __future__ import annotations

import dataclasses

from snsim import devices
from snsim.trace.model import Device, Trace


def retarget(trace: Trace, key: str) -> tuple[Trace, str | None]:
    """``trace`` on preset ``key``, and a note when its times could not move."""
    preset = devices.get(key)
    device = Device(name=f"{preset.name} (preset {preset.key}, what-if)",
                    memory_bytes=preset.memory_bytes, h2d_Bps=preset.h2d_Bps,
                    d2h_Bps=preset.d2h_Bps)
    source = dict(trace.source)
    kind = source.get("kind")
    priced = kind == "modeled" and all(
        "fwd_kernels" in layer.extra or (layer.fwd_ms == 0 and layer.bwd_ms == 0)
        for layer in trace.layers)
    note = None
    layers = trace.layers
    if priced:
        layers = tuple(_repriced(layer, preset) for layer in trace.layers)
        source["what_if"] = (f"memory, host link and step times re-priced for preset "
                             f"{preset.key} from each kernel's flops and bytes")
    else:
        why = ("measured on " + str(source.get("device_name") or source.get("device") or "its machine")
               if kind == "measured" else "modeled without per-kernel costs")
        note = (f"{trace.label}: step times kept (the trace was {why}); only memory and the "
                f"host link are {preset.key}'s")
        source["what_if"] = f"memory and host link of preset {preset.key}; step times kept"
    return dataclasses.replace(trace, device=device, layers=layers, source=source), note


def _repriced(layer, preset):
    """A layer's steps re-priced; workspace entries keep their ratios to the layer."""
    if "fwd_kernels" not in layer.extra:
        return layer
    # rounded as the profiler writes them, so the trace's own preset gives its times back
    fwd = round(devices.step_ms(layer.extra["fwd_kernels"], preset), 6)
    bwd = round(devices.step_ms(layer.extra.get("bwd_kernels", ()), preset), 6) \
        if layer.bwd_ms else 0.0
    old_f, old_b = layer.fwd_ms, layer.bwd_ms
    ws = tuple(dataclasses.replace(
        w, fwd_ms=round(w.fwd_ms * (fwd / old_f), 6) if old_f else fwd,
        bwd_ms=round(w.bwd_ms * (bwd / old_b), 6) if old_b else bwd) for w in layer.workspace)
    return dataclasses.replace(layer, fwd_ms=fwd, bwd_ms=bwd, workspace=ws)

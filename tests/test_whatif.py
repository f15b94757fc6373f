"""``simulate --device``: another preset's memory and link; modeled times re-priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from snsim import devices
from snsim.cli import main
from snsim.trace import load
from snsim.whatif import retarget

TRACES = Path(__file__).resolve().parent.parent / "traces"


def test_own_preset_gives_the_trace_back():
    t = load(str(TRACES / "k40c_resnet50_b32.json"))
    same, note = retarget(t, "k40c")
    assert note is None
    assert [(a.fwd_ms, a.bwd_ms, a.workspace) for a in same.layers] == \
        [(a.fwd_ms, a.bwd_ms, a.workspace) for a in t.layers]
    assert same.device.memory_bytes == t.device.memory_bytes
    assert same.device.h2d_Bps == t.device.h2d_Bps


def test_faster_device_reprices_every_kernel():
    t = load(str(TRACES / "k40c_vgg16_b32.json"))
    h, note = retarget(t, "h100")
    p = devices.get("h100")
    assert note is None and h.device.memory_bytes == p.memory_bytes
    assert h.device.h2d_Bps == p.h2d_Bps
    conv = next(i for i, layer in enumerate(t.layers) if layer.kind == "conv")
    want = round(devices.step_ms(t.layers[conv].extra["fwd_kernels"], p), 6)
    assert h.layers[conv].fwd_ms == want < t.layers[conv].fwd_ms
    assert sum(x.fwd_ms for x in h.layers) < sum(x.fwd_ms for x in t.layers) / 5
    # sizes never change with the device
    assert [x.output_bytes for x in h.layers] == [x.output_bytes for x in t.layers]


def test_measured_trace_keeps_its_times_and_says_so(capsys):
    t = load(str(TRACES / "cpu_resnet18_b8_64.json"))
    h, note = retarget(t, "a100")
    assert [x.fwd_ms for x in h.layers] == [x.fwd_ms for x in t.layers]
    assert "step times kept" in note and "measured" in note
    assert main(["simulate", str(TRACES / "cpu_resnet18_b8_64.json"), "--policy", "liveness",
                 "--device", "a100", "--json"]) == 0
    out = capsys.readouterr()
    assert '"capacity_bytes": 85899345920' in out.out and "snsim: note:" in out.err


def test_unknown_preset_is_one_line(capsys):
    assert main(["simulate", str(TRACES / "k40c_vgg16_b32.json"), "--device", "k80"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown device model 'k80'" in err

"""``snsim import torch-snapshot``: a snapshot made here in PyTorch's documented
format (``torch.cuda.memory._dump_snapshot``: a pickled dict), hand-computed peaks.

Recording starts with a 100 B request (a 512 B block) allocated in one 4096 B
segment; then an 8192 B segment is reserved, 300 B and 500 B requested (two more
512 B blocks: 1536 B allocated, 900 B requested, the peaks), the 300 B freed
(requested, then completed), the segment released.  Dumped state: the 4096 B
segment with its two live blocks.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest

from snsim.cli import main
from snsim.errors import SnsimError
from snsim.importers import torch_snapshot


def frame(name):
    return [{"filename": "train.py", "line": 7, "name": name}]


SNAP = {
    "segments": [{"device": 0, "address": 0, "total_size": 4096, "stream": 0,
                  "segment_type": "small",
                  "blocks": [{"address": 0, "size": 512, "requested_size": 100,
                              "state": "active_allocated", "frames": []},
                             {"address": 512, "size": 512, "requested_size": 500,
                              "state": "active_allocated", "frames": frame("fc")},
                             {"address": 1024, "size": 3072, "state": "inactive"}]}],
    "device_traces": [[
        {"action": "segment_alloc", "addr": 5000, "size": 8192, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 5000, "size": 300, "stream": 0, "frames": frame("conv")},
        {"action": "alloc", "addr": 512, "size": 500, "stream": 0, "frames": frame("fc")},
        {"action": "free_requested", "addr": 5000, "size": 300, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 5000, "size": 300, "stream": 0, "frames": []},
        {"action": "segment_free", "addr": 5000, "size": 8192, "stream": 0, "frames": []},
    ]],
}


def test_peaks_from_events_and_state():
    d = torch_snapshot.summarize(SNAP)[0]
    # events carry requested sizes; the allocator counts 512 B blocks
    assert d["allocated"] == {"peak_bytes": 1536, "final_bytes": 1024, "before_bytes": 512}
    assert d["requested"] == {"peak_bytes": 900, "final_bytes": 600, "before_bytes": 100}
    assert d["reserved"] == {"peak_bytes": 12288, "final_bytes": 4096, "before_bytes": 4096}
    assert d["peak_frames"] == ["train.py:7 fc"] and d["events"] == 6


def test_cli_writes_the_summary(tmp_path, capsys):
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(SNAP))
    out = tmp_path / "s.json"
    assert main(["import", "torch-snapshot", str(p), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["devices"]["0"]["allocated"]["peak_bytes"] == 1536
    assert doc["provenance"]["config"]["importer"] == "torch-snapshot"
    assert '"peak_bytes": 1536' in capsys.readouterr().out


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("data, msg", [
    (pickle.dumps(Evil()), "holds no objects"),
    (pickle.dumps([1, 2]), "expected a dict"),
    (b"not a pickle", "not a memory snapshot pickle"),
    (pickle.dumps({"segments": [{"blocks": []}], "device_traces": []}), "lacks a size"),
])
def test_bad_snapshots_are_one_line_errors(tmp_path, data, msg):
    p = tmp_path / "bad.pickle"
    p.write_bytes(data)
    with pytest.raises(SnsimError, match=msg):
        torch_snapshot.summarize(torch_snapshot.load(p), str(p))


def test_a_real_cuda_snapshot_matches_the_allocators_own_counters(tmp_path):
    """On a GPU: a real training step recorded by PyTorch; the importer's
    allocated and reserved peaks equal ``torch.cuda``'s own counters."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                              torch.nn.Linear(4096, 1024)).to(dev)
    x = torch.randn(256, 1024, device=dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        net(x).square().sum().backward()
        torch.cuda.synchronize()
        path = tmp_path / "step.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    got = torch_snapshot.summarize(torch_snapshot.load(path))[torch.cuda.current_device()]
    assert got["allocated"]["peak_bytes"] == stats["allocated_bytes.all.peak"]
    assert got["allocated"]["final_bytes"] == stats["allocated_bytes.all.current"]
    assert got["reserved"]["peak_bytes"] == stats["reserved_bytes.all.peak"]
    assert main(["import", "torch-snapshot", str(path), "--out", str(tmp_path / "s.json")]) == 0

"""``snsim import torch-snapshot``: a snapshot made here in PyTorch's documented
format (``torch.cuda.memory._dump_snapshot``: a pickled dict), hand-computed peaks.

Recording starts with 100 B allocated in one 1000 B segment; then a 2000 B
segment is reserved, 300 B and 500 B allocated (allocated 900, the peak), the
300 B freed (requested, then completed), the segment released.  Dumped state:
the 1000 B segment with its 100 B block and the 500 B block.
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
    "segments": [{"device": 0, "address": 0, "total_size": 1000, "stream": 0,
                  "segment_type": "large",
                  "blocks": [{"address": 0, "size": 100, "requested_size": 100,
                              "state": "active_allocated", "frames": []},
                             {"address": 100, "size": 500, "requested_size": 500,
                              "state": "active_allocated", "frames": frame("fc")},
                             {"address": 600, "size": 400, "state": "inactive"}]}],
    "device_traces": [[
        {"action": "segment_alloc", "addr": 5000, "size": 2000, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 5000, "size": 300, "stream": 0, "frames": frame("conv")},
        {"action": "alloc", "addr": 100, "size": 500, "stream": 0, "frames": frame("fc")},
        {"action": "free_requested", "addr": 5000, "size": 300, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 5000, "size": 300, "stream": 0, "frames": []},
        {"action": "segment_free", "addr": 5000, "size": 2000, "stream": 0, "frames": []},
    ]],
}


def test_peaks_from_events_and_state():
    d = torch_snapshot.summarize(SNAP)[0]
    assert d["allocated"] == {"peak_bytes": 900, "final_bytes": 600, "before_bytes": 100}
    assert d["reserved"] == {"peak_bytes": 3000, "final_bytes": 1000, "before_bytes": 1000}
    assert d["peak_frames"] == ["train.py:7 fc"] and d["events"] == 6


def test_cli_writes_the_summary(tmp_path, capsys):
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(SNAP))
    out = tmp_path / "s.json"
    assert main(["import", "torch-snapshot", str(p), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["devices"]["0"]["allocated"]["peak_bytes"] == 900
    assert doc["provenance"]["config"]["importer"] == "torch-snapshot"
    assert '"peak_bytes": 900' in capsys.readouterr().out


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

"""PyTorch CUDA memory snapshots as a measured ground truth.

``torch.cuda.memory._record_memory_history()`` then
``torch.cuda.memory._dump_snapshot(path)`` writes a pickle of one dict:

- ``segments``: the caching allocator's state when dumped; per segment
  ``total_size`` (reserved) and ``blocks`` with ``size`` and ``state``
  (``active_allocated`` is allocated);
- ``device_traces``: per device, the recorded events in order, each with
  ``action`` (``alloc``, ``free_requested``, ``free_completed``,
  ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
  ``snapshot``, ``oom``), ``addr``, ``size`` and ``frames``.

:func:`summarize` replays the events: allocated bytes rise at ``alloc``
and fall at ``free_completed`` (the block is back in the allocator).  An
event's ``size`` is what was requested; the allocator hands out and counts
blocks of at least 512 B in 512 B steps (``round_size``), so ``allocated``
counts each request so rounded (equal to ``torch.cuda.max_memory_allocated``
unless a large block was handed out unsplit, rare) and ``requested`` the
sizes as recorded;
reserved bytes rise at ``segment_alloc``/``segment_map`` and fall at
``segment_free``/``segment_unmap``.  Memory allocated before recording
began is recovered from the dumped state (the final level less the
recorded net change), so peaks are absolute.  The peak allocation's
frames name where it happened.

The pickle is read with an unpickler that builds only plain containers
(a snapshot holds nothing else), so a file cannot run code when loaded.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from snsim.errors import SnsimError

BLOCK = 512   # the CUDA caching allocator's kMinBlockSize


def block_size(size: int) -> int:
    """The block the caching allocator hands out for a request (``round_size``)."""
    return BLOCK if size < BLOCK else -(-size // BLOCK) * BLOCK


_ALLOC_UP, _ALLOC_DOWN = {"alloc"}, {"free_completed"}
_RES_UP, _RES_DOWN = {"segment_alloc", "segment_map"}, {"segment_free", "segment_unmap"}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"a memory snapshot holds no objects ({module}.{name})")


def load(path: str | Path) -> dict:
    """The snapshot dict; :class:`SnsimError` (one line) on anything else."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SnsimError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        snap = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:   # any unpickling failure is a bad file
        raise SnsimError(f"{path}: not a memory snapshot pickle: {exc}") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list) \
            or not isinstance(snap.get("device_traces"), list):
        raise SnsimError(f"{path}: not a memory snapshot: expected a dict with "
                         "'segments' and 'device_traces' lists")
    return snap


def _frames(ev: dict) -> list[str]:
    return [f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"
            for f in ev.get("frames", [])[:5] if isinstance(f, dict)]


def summarize(snap: dict, label: str = "<snapshot>") -> dict:
    """Per device: allocated and reserved peak and final bytes, and the frames of
    the allocation that reached the allocated peak."""
    final: dict[int, dict[str, int]] = {}
    for seg in snap["segments"]:
        try:
            dev = int(seg.get("device", 0))
            d = final.setdefault(dev, {"allocated": 0, "reserved": 0, "requested": 0})
            d["reserved"] += int(seg["total_size"])
            live = [b for b in seg.get("blocks", []) if b.get("state") == "active_allocated"]
            d["allocated"] += sum(int(b["size"]) for b in live)
            d["requested"] += sum(int(b.get("requested_size", b["size"])) for b in live)
        except (KeyError, TypeError, ValueError) as exc:
            raise SnsimError(f"{label}: a segment lacks a size: {exc}") from None
    out = {}
    for dev, events in enumerate(snap["device_traces"]):
        if not isinstance(events, list):
            raise SnsimError(f"{label}: device_traces[{dev}] is not a list of events")
        alloc = res = asked = 0
        a_peak = r_peak = q_peak = 0
        at_peak: list[str] = []
        for k, ev in enumerate(events):
            try:
                action, size = ev["action"], int(ev.get("size", 0))
            except (KeyError, TypeError, ValueError):
                raise SnsimError(f"{label}: device {dev} event {k} has no action "
                                 "or size") from None
            if action in _ALLOC_UP:
                alloc += block_size(size)
                asked += size
                q_peak = max(q_peak, asked)
                if alloc > a_peak:
                    a_peak, at_peak = alloc, _frames(ev)
            elif action in _ALLOC_DOWN:
                alloc -= block_size(size)
                asked -= size
            elif action in _RES_UP:
                res += size
                r_peak = max(r_peak, res)
            elif action in _RES_DOWN:
                res -= size
        end = final.get(dev, {"allocated": 0, "reserved": 0, "requested": 0})
        base_a, base_r = end["allocated"] - alloc, end["reserved"] - res
        base_q = end["requested"] - asked
        out[dev] = {"events": len(events),
                    "allocated": {"peak_bytes": base_a + a_peak, "final_bytes": end["allocated"],
                                  "before_bytes": base_a},
                    "requested": {"peak_bytes": base_q + q_peak, "final_bytes": end["requested"],
                                  "before_bytes": base_q},
                    "reserved": {"peak_bytes": max(base_r + r_peak, end["reserved"]),
                                 "final_bytes": end["reserved"], "before_bytes": base_r},
                    "peak_frames": at_peak}
    return out


def run(args: Any) -> int:
    """``snsim import torch-snapshot SNAPSHOT.pickle [--out FILE.json]``."""
    import json

    from snsim.fileio import check_writable, provenance, write_json

    if args.out:
        check_writable(args.out)
    summary = summarize(load(args.snapshot), args.snapshot)
    doc = {"format": "torch-memory-snapshot", "file": args.snapshot,
           "devices": {str(k): v for k, v in summary.items()},
           "provenance": provenance({"importer": "torch-snapshot", "snapshot": args.snapshot})}
    if args.out:
        write_json(args.out, doc)
    print(json.dumps(doc["devices"], indent=1))
    return 0

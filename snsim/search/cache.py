"""The probe cache of the capacity searches: each planned probe on disk, once.

A probe's key is the SHA-256 of what decides its answer: the probe trace's
identity (:class:`snsim.search.models.Family` gives it per size: the
generator's inputs, or the content of the profiles it extrapolates), the
policy, the budget in bytes, and the source of the snsim package itself (a
changed planner, simulator or generator is a new key, never a stale answer).
Records are written whole (temp + rename, :func:`snsim.fileio.write_json`) as
``DIR/probes/<key>.json``; a missing, partial or foreign file is a miss.  Lower
bounds, which depend on the trace alone, are kept the same way as
``DIR/bounds/<key>.json``, so a repeated search builds no graph for them.

The folder is the experiments' points cache (``--out/cache``) or, for
``snsim search``, ``--cache DIR`` (default: ``$SNSIM_CACHE``, else
``$XDG_CACHE_HOME/snsim``, else ``~/.cache/snsim``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

FORMAT = "snsim.search-probe/1"


@functools.lru_cache(maxsize=1)
def code_sha256() -> str:
    """SHA-256 of every ``.py`` file of the snsim package (paths and bytes)."""
    import snsim

    root = Path(snsim.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def default_dir() -> Path:
    env = os.environ.get("SNSIM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "snsim"


class ProbeCache:
    """Probe results and lower bounds under ``directory``; counts hits and writes."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.hits = 0
        self.writes = 0

    def check(self) -> "ProbeCache":
        """Make the folder (and its two subfolders) or refuse in one line, before work."""
        from snsim.errors import SnsimError
        from snsim.fileio import check_writable

        if self.dir.exists() and not self.dir.is_dir():
            raise SnsimError(f"--cache {self.dir} is a file, not a folder")
        try:
            for sub in ("probes", "bounds"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SnsimError(f"cannot make the cache {self.dir}: {exc.strerror or exc}") \
                from None
        check_writable(self.dir / "probes" / "probe.json")
        return self

    @staticmethod
    def key(kind: str, fields: dict[str, Any]) -> str:
        blob = json.dumps({"format": FORMAT, "kind": kind, "code_sha256": code_sha256(),
                           **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _path(self, kind: str, fields: dict[str, Any]) -> Path:
        folder = "bounds" if kind == "bound" else "probes"
        return self.dir / folder / f"{self.key(kind, fields)}.json"

    def get(self, kind: str, fields: dict[str, Any]) -> dict[str, Any] | None:
        try:
            doc = json.loads(self._path(kind, fields).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT \
                or doc.get("fields") != json.loads(json.dumps(fields)):
            return None
        self.hits += 1
        return doc.get("record")

    def put(self, kind: str, fields: dict[str, Any], record: dict[str, Any]) -> None:
        from snsim.fileio import provenance, write_json

        path = self._path(kind, fields)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"format": FORMAT, "kind": kind, "fields": fields,
                          "code_sha256": code_sha256(), "record": record,
                          "provenance": provenance({"cache": "search probe"})})
        self.writes += 1

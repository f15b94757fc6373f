"""Whole-file writes with provenance.

Every file snsim writes goes through :func:`write_atomic`: the bytes go to a
temporary file in the target folder, which is then renamed over the target,
so a crash never leaves a partial file.  :func:`provenance` is the record of
configuration and versions that each output carries.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from snsim.errors import SnsimError


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What produced an output: snsim and library versions, command, config."""
    import numpy
    import simpy

    from snsim import __version__

    versions = {"snsim": __version__, "python": platform.python_version(),
                "numpy": numpy.__version__, "simpy": simpy.__version__}
    torch = sys.modules.get("torch")  # record torch only if already in use
    if torch is not None:
        versions["torch"] = getattr(torch, "__version__", "?")
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(sys.argv),
        "versions": versions,
        "config": config or {},
    }


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    folder = check_writable(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix or ".tmp",
                                   dir=folder)
    except OSError as exc:
        raise SnsimError(f"cannot write {target}: {exc.strerror or exc}") from None
    tmp_path = Path(tmp)
    try:  # from here on an interrupt (Ctrl-C) removes the temporary file too
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; give a normal file's mode
        yield tmp_path
        try:
            os.replace(tmp_path, target)
        except OSError as exc:
            raise SnsimError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def check_writable(path: str | os.PathLike) -> Path:
    """The folder ``path`` would be written in; :class:`SnsimError` if it cannot be.

    Commands call it before long work, so a bad ``--out`` fails at once.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise SnsimError(f"cannot write {target}: folder {folder} does not exist")
    if target.is_dir():
        raise SnsimError(f"cannot write {target}: it is a folder")
    try:  # the only sure test: create (and remove) a file there
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise SnsimError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        os.close(fd)
    finally:  # an interrupt here leaves no probe behind
        os.unlink(probe)
    return folder


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    with atomic_path(path) as tmp:
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(tmp, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
            f.write(data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def write_with(path: str | os.PathLike, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and rename the result over ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)

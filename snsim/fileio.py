"""Whole-file writes with provenance.

Every file snsim writes goes through :func:`write_atomic`: the bytes go to a
temporary file in the target folder, which is then renamed over the target,
so a crash never leaves a partial file.  :func:`provenance` is the record of
configuration and versions that each output carries.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from snsim.errors import SnsimError


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What produced an output: snsim and library versions, command, config."""
    import datetime as _dt   # here, not at import: only the files that carry it
    import platform

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
    made: list[Path] = []
    try:
        tmp_path = _create_new(target, folder, target.suffix or ".tmp", made)
        yield tmp_path
        try:
            os.replace(tmp_path, target)
        except OSError as exc:
            raise SnsimError(f"cannot write {target}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(made)
        raise


def _create_new(target: Path, folder: Path, suffix: str, made: list[Path]) -> Path:
    """A new empty file ``.NAME.RANDOM{suffix}`` in ``folder`` (a normal file's mode:
    0666 less the umask).  Its name is appended to ``made`` before the file exists,
    so a caller's cleanup finds it whenever an interrupt (Ctrl-C) lands: mkstemp
    returned the name only after creating the file, and a KeyboardInterrupt in
    between left it behind."""
    for _ in range(100):
        name = folder / f".{target.name}.{os.urandom(6).hex()}{suffix}"
        made.append(name)
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return name
        except FileExistsError:
            made.pop()   # not ours
        except OSError as exc:
            made.pop()
            raise SnsimError(f"cannot write {target}: {exc.strerror or exc}") from None
    raise SnsimError(f"cannot write {target}: no free temporary name in {folder}")


def _remove(paths: list[Path]) -> None:
    """Remove the files :func:`_create_new` named (those it never made are absent)."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


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
    made: list[Path] = []
    try:  # the only sure test: create (and remove) a file there
        _create_new(target, folder, ".probe", made)
    finally:  # an interrupt leaves no probe behind
        _remove(made)
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

"""Run work in a forked child process that is killed at a deadline (note 2 of
:mod:`snsim.policies.optimal`).

HiGHS checks its time limit only where it calls its interrupt callbacks
(simplex, IPM, branch and bound); its presolve and the root's first steps
call none, and on ResNet-101 b16 (801k rows) they ran 20-45 s past the
limit.  A child process can be stopped anywhere: :func:`supervise` forks,
the child runs ``work(channel)`` and reports through ``channel`` what it has
as it goes (an incumbent, a bound), and the parent reads those reports until
the child's final one or the deadline, then kills and reaps the child.
:func:`start` returns at once instead, and the parent collects the reports
later (:class:`Running`): work done beside the parent's own.

``os.fork`` rather than :mod:`multiprocessing`: the experiments plan inside
daemonic worker processes, which ``multiprocessing.Process`` refuses to start
from, and a fork inherits the model already handed to HiGHS (nothing to
serialise).  The child ignores SIGINT (a Ctrl-C stops the parent, whose
``finally`` kills the child), dies with its parent (``PR_SET_PDEATHSIG``
where Linux has it; elsewhere :meth:`Channel.orphaned` is polled), writes
nothing to file descriptor 1 (``--json`` prints one JSON object) and leaves
by ``os._exit`` (no ``atexit`` handler, ``finally`` or stdio buffer of the
parent's runs twice).  Where ``os.fork`` is missing (:func:`available`),
callers run the work in-process.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

HEADER = struct.Struct("<Q")   # each report: its pickled length, then the pickle
PR_SET_PDEATHSIG = 1           # <linux/prctl.h>


class ForkFailed(RuntimeError):
    """``os.fork`` failed (no memory, too many processes): nothing was started."""


def available() -> bool:
    """Whether :func:`supervise` can run here (a POSIX ``os.fork``)."""
    return hasattr(os, "fork") and os.name == "posix"


class Channel:
    """The child's end: :meth:`send` a report to the parent."""

    def __init__(self, fd: int, parent: int):
        self.fd = fd
        self.parent = parent

    def send(self, kind: str, payload) -> None:
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]

    def orphaned(self) -> bool:
        """The parent is gone (the child was re-parented)."""
        return os.getppid() != self.parent


@dataclass
class Outcome:
    """What the parent got: each kind's last report, the final one (``done``:
    the child finished, ``final`` its work's return value), ``error`` (the
    child's exception, as text) and the child's pid (reaped)."""
    last: dict = field(default_factory=dict)
    done: bool = False
    final: object = None
    error: str | None = None
    pid: int = 0


def die_with_parent(parent: int) -> None:
    """The kernel kills this process when its parent ends (Linux); already
    orphaned, it leaves now."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):   # no prctl: Channel.orphaned is polled
        pass
    if os.getppid() != parent:
        os._exit(1)


def child_main(work, write_fd: int, parent: int) -> None:
    """The child's whole life; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(parent)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)   # nothing the solver prints reaches the parent's stdout
        os.close(null)
        channel = Channel(write_fd, parent)
        try:
            result = work(channel)
        except Exception as e:   # the parent raises it
            channel.send("error", f"{type(e).__name__}: {e}")
        else:
            channel.send("done", result)
        code = 0
    except BaseException:   # noqa: BLE001 (a broken pipe: the parent is gone)
        pass
    finally:
        os._exit(code)


def supervise(work, deadline: float) -> Outcome:
    """Run ``work(channel)`` in a forked child until it returns or
    ``time.perf_counter()`` reaches ``deadline``; the child is killed (SIGKILL)
    and reaped before this returns, whatever happens (an exception, Ctrl-C).
    :class:`ForkFailed` when no child could be started."""
    return start(work).collect(deadline)


class Running:
    """A child started by :func:`start`, working while the parent goes on:
    :meth:`collect` its reports (then it is killed and reaped), or
    :meth:`cancel` it (from a ``finally``, so that an exception or a Ctrl-C
    in the parent meanwhile kills it too)."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd
        self.started = time.perf_counter()
        self.closed = False

    def collect(self, deadline: float) -> Outcome:
        """The child's reports until its final one or ``deadline``; it is
        killed and reaped before this returns."""
        out = Outcome(pid=self.pid)
        try:
            read_reports(self.fd, deadline, out)
        finally:
            self.cancel()
        return out

    def cancel(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)
            stop(self.pid)


def start(work) -> Running:
    """Fork a child that runs ``work(channel)`` (:func:`child_main`) and
    return at once; the parent reads its reports with
    :meth:`Running.collect`.  A child writes its reports into a pipe, which
    holds 64 KB: one that reports more than that before the parent reads
    waits for it.  :class:`ForkFailed` when no child could be started."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    held = hold_ctrl_c()
    try:
        pid = os.fork()
    except OSError as e:
        held()
        os.close(read_fd)
        os.close(write_fd)
        raise ForkFailed(str(e)) from e
    if pid == 0:
        os.close(read_fd)
        child_main(work, write_fd, parent)
    running = Running(pid, read_fd)
    try:
        os.close(write_fd)
        held()   # a Ctrl-C during the fork is raised here, where the child is killed
    except BaseException:
        running.cancel()
        raise
    return running


def hold_ctrl_c():
    """Hold SIGINT back until the returned function is called, which puts the
    handler back and, if SIGINT came meanwhile, calls it (the default one
    raises ``KeyboardInterrupt``).  A Ctrl-C that lands while ``os.fork`` runs
    its at-fork hooks (``logging``'s lock release) would otherwise be raised
    inside them, where Python prints and drops it, and the child would live
    on.  Only the main thread may set handlers: elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    came = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: came.append(frame))

    def release() -> None:
        signal.signal(signal.SIGINT, before)
        if came and callable(before):
            before(signal.SIGINT, came[0])
    return release


def read_reports(fd: int, deadline: float, out: Outcome) -> None:
    buf = bytearray()
    while not (out.done or out.error is not None):
        left = deadline - time.perf_counter()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return   # the deadline
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return   # the child ended without a final report
        buf += chunk
        while len(buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(buf)
            if len(buf) < HEADER.size + n:
                break
            kind, payload = pickle.loads(bytes(buf[HEADER.size:HEADER.size + n]))
            del buf[:HEADER.size + n]
            if kind == "done":
                out.done, out.final = True, payload
            elif kind == "error":
                out.error = payload
            else:
                out.last[kind] = payload


def stop(pid: int) -> None:
    """Kill and reap the child (it may have ended already)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return

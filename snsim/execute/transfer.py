"""The executor's memory ops: free, offload and prefetch on the copy engines (note
[4] of :mod:`snsim.execute.executor`).

:class:`CopyEngines` is the part of :class:`~snsim.execute.executor.Executor`
that moves tensors: it works on the executor's store (``store``, ``extras``,
``host``, ``events``, ``holding``, ``skeletons``), made by ``Executor.step``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from snsim.errors import ScheduleError
from snsim.execute.store import SLOT, Elem, Saved, flat, rebuild, remap


class CopyEngines:
    """One copy engine per direction: CUDA streams, or one thread each on CPU [4]."""

    def open_engines(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.release_order: dict[int, int] | None = None   # see reap
        self.k_now = 0   # the op under way
        if self.cuda:
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)
        else:  # one thread per copy engine, as the simulator models them
            self.d2h_pool = ThreadPoolExecutor(1, thread_name_prefix="snsim-d2h")
            self.h2d_pool = ThreadPoolExecutor(1, thread_name_prefix="snsim-h2d")

    def close_engines(self) -> None:
        if not self.cuda:
            self.h2d_pool.shutdown()
            self.d2h_pool.shutdown()

    def reap(self, final: bool = False) -> None:
        """Drop the device tensors of copy jobs that have ended, on this thread [4].

        With ``release_order`` (the simulator's ``offload_ends``) a job's tensors
        are dropped when the step reaches the op before which the simulated copy
        had ended, waiting for the real copy there if it is late, and not before
        even if it ended early: memory is then given back in the order the
        prediction assumes, whatever the speed of this machine's copy threads
        (a measurement of memory, not of time; ``final``: the step's end).
        """
        if self.holding:
            still = []
            for fut, jobs, at in self.holding:
                if at is None:
                    done = fut.done()
                else:
                    done = final or self.k_now >= at
                    if done:
                        fut.result()
                if done:
                    jobs.clear()
                else:
                    still.append((fut, jobs, at))
            self.holding = still

    def tensors_of(self, t) -> list:
        """What holds tensor ``t``: its store key, the elements of a tuple-valued
        ``X_i``/``G_i`` [6], or the saved records of ``S_i``."""
        if t[0] == "S":
            return self.extras.get(t[1], [])
        value = self.store[t]
        if isinstance(value, torch.Tensor):
            return [t]
        self.skeletons[t] = remap(value, lambda x: SLOT)
        return [Elem(t, k) for k in range(len(flat(value)))]

    def free(self, t) -> None:
        if t[0] == "S":
            for rec in self.extras.pop(t[1], []):
                rec.t = None
            return
        del self.store[t]  # the ledger has checked that it is resident

    def get_item(self, item) -> torch.Tensor:
        if isinstance(item, Elem):
            return flat(self.store[item.key])[item.k]
        return item.t if isinstance(item, Saved) else self.store[item]

    def set_item(self, item, value: torch.Tensor) -> None:
        if isinstance(item, Saved):
            item.t = value
        elif isinstance(item, Elem):
            old = self.store.get(item.key, self.skeletons[item.key])
            parts = flat(old)
            parts[item.k] = value
            self.store[item.key] = rebuild(old, iter(parts))
        else:
            self.store[item] = value

    def offload(self, t) -> None:
        items = self.tensors_of(t)
        if self.cuda:
            self.d2h.wait_stream(torch.cuda.current_stream(self.device))
        copies, jobs = [], []
        if t[0] == "S":
            # saved tensors keyed by storage (a tensor saved twice, or views of
            # one buffer, is one allocation): one copy per storage, the records
            # made views of it again on the way back [2]
            bases, where = [], {}
            for item in items:
                dev = self.get_item(item)
                st = dev.untyped_storage()
                k = where.get(st.data_ptr())
                if k is None:
                    k = where[st.data_ptr()] = len(bases)
                    raw = torch.empty(0, dtype=torch.uint8, device=dev.device).set_(st)
                    bases.append(self.copy_out(raw, jobs))
                copies.append((k, dev.dtype, dev.size(), dev.stride(), dev.storage_offset()))
            copies = Storages(bases, copies)
        else:
            for item in items:
                dev = self.get_item(item)
                copies.append((self.copy_out(dev, jobs), dev.size(), dev.stride()))
        self.host[t] = (items, copies)
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.d2h)
            self.events[t] = ev
        else:
            # The job holds the device tensors until the copy ends, so a Free
            # issued meanwhile releases memory only then (a free under way).
            self.events[t] = self.d2h_pool.submit(copy_all, jobs, None)
            at = self.release_order.get(self.k_now) if self.release_order else None
            self.holding.append((self.events[t], jobs, at))

    def copy_out(self, dev: torch.Tensor, jobs: list):
        """A host buffer for ``dev``, its copy issued on the device-to-host
        engine (CUDA) or added to ``jobs`` (CPU)."""
        if self.cuda:
            hostbuf = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
            with torch.cuda.stream(self.d2h):
                hostbuf.copy_(dev, non_blocking=True)
            dev.record_stream(self.d2h)  # its memory is reused only after the copy
            return hostbuf
        # numpy memory: not counted by the torch allocator, like host memory
        hostbuf = np.empty(tuple(dev.shape), dtype=dev.detach().numpy().dtype)
        jobs.append((hostbuf, dev.detach().numpy()))
        return hostbuf

    def copy_in(self, hostbuf, size, stride, jobs: list) -> torch.Tensor:
        """A new device tensor for ``hostbuf``, its copy issued on the
        host-to-device engine (CUDA) or added to ``jobs`` (CPU)."""
        new = torch.empty_strided(size, stride, dtype=self.host_dtype(hostbuf),
                                  device=self.device)
        if self.cuda:
            with torch.cuda.stream(self.h2d):
                new.copy_(hostbuf, non_blocking=True)
            new.record_stream(self.h2d)
        else:
            jobs.append((new.numpy(), hostbuf))
        return new

    def prefetch(self, t) -> None:
        items, copies = self.host[t]
        if t[0] == "S":   # its records hold the device copy again: the next free clears them
            now = self.extras_of.get(t[1], items)
            if len(now) != len(items):
                raise ScheduleError(f"{t}: its recomputation saved {len(now)} tensors, "
                                    f"its offloaded forward {len(items)}")
            if any(a is not b for a, b in zip(now, items)):
                # layer t[1] was recomputed since the offload: the node backward
                # runs reads the new records, which hold the same values [2]
                items = list(now)
                self.host[t] = (items, copies)
            self.extras[t[1]] = list(items)
        if self.cuda:
            self.h2d.wait_stream(torch.cuda.current_stream(self.device))
            offload = self.events.get(t)
            if offload is not None:  # the host copy must be complete before it comes back
                self.h2d.wait_event(offload)
        jobs = []
        if isinstance(copies, Storages):
            raws = [self.copy_in(hostbuf, hostbuf.shape, (1,), jobs) for hostbuf in copies.bases]
            for item, (k, dtype, size, stride, offset) in zip(items, copies.views):
                view = torch.empty(0, dtype=dtype, device=self.device)
                self.set_item(item, view.set_(raws[k].untyped_storage(), offset, size, stride))
        else:
            for item, (hostbuf, size, stride) in zip(items, copies):
                self.set_item(item, self.copy_in(hostbuf, size, stride, jobs))
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.h2d)
            self.events[t] = ev
        else:
            self.events[t] = self.h2d_pool.submit(copy_all, jobs, self.events.get(t))
            # the job's view of the new device tensor is dropped here too, not by
            # the copy thread: the pool's work item outlives the future's result
            # for a moment, and a free on that thread is never reported [4]
            self.holding.append((self.events[t], jobs, None))

    @staticmethod
    def host_dtype(hostbuf) -> torch.dtype:
        if isinstance(hostbuf, torch.Tensor):
            return hostbuf.dtype
        return torch.from_numpy(np.empty(0, dtype=hostbuf.dtype)).dtype

    def wait_copy(self, t) -> None:
        ev = self.events[t]  # the ledger has checked that a copy is in flight
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(ev)
        else:
            ev.result()
            self.reap()


class Storages:
    """The host copy of saved tensors: one buffer per device storage
    (``bases``, raw bytes) and, per record, (its buffer, dtype, size, stride,
    storage offset)."""

    __slots__ = ("bases", "views")

    def __init__(self, bases: list, views: list):
        self.bases, self.views = bases, views


def copy_all(jobs, after) -> None:
    """Copy ``(dst, src)`` numpy pairs in a copy-engine thread (numpy drops the GIL)."""
    if after is not None:
        after.result()  # a prefetch waits for the offload that made its host copy
    for dst, src in jobs:
        np.copyto(dst, src)
    # the jobs keep the device tensors: the compute thread drops them (reap) [4]

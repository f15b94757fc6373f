"""The capacity search's workers: forked processes that probe sizes for a search
(:mod:`snsim.search.capacity`) while it waits.  They are forked, not spawned,
because they inherit the search: its family's graph builders are closures.
Each probe writes the probe cache itself (whole files, temp + rename)."""

from __future__ import annotations

from typing import Any

_WORKER = None   # the searcher a forked worker probes for (capacity._Searcher)


def _measure_in_worker(x: int) -> tuple[int, tuple[tuple[int, int], Any]]:
    p = _WORKER.measure(x)
    return x, (_WORKER.bound(x), p)


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent stops the search


class Pool:
    """``workers`` forked processes, started at the first step that needs them (they
    inherit the searcher: its family's graph builders are closures) and ended
    with the search.  Without fork (Windows) the probes run one by one."""

    def __init__(self, workers: int):
        import multiprocessing

        self.workers = workers
        if "fork" not in multiprocessing.get_all_start_methods():
            self.workers = 1
        self.pool = None
        self.searcher = None

    def map(self, searcher: Any, xs: list[int]) -> list[tuple[int, tuple[tuple[int, int], Any]]]:
        """``searcher.measure(x)`` for each x, at once: (x, (its bound, its probe))."""
        global _WORKER
        if self.pool is None or self.searcher is not searcher:
            import multiprocessing

            self.close()
            _WORKER = searcher
            self.pool = multiprocessing.get_context("fork").Pool(
                self.workers, initializer=_ignore_sigint)
            self.searcher = searcher
        return self.pool.map(_measure_in_worker, xs, chunksize=1)

    def close(self) -> None:
        global _WORKER
        if self.pool is not None:
            self.pool.terminate()   # idle or interrupted: nothing to wait for
            self.pool.join()
            self.pool = None
        _WORKER = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

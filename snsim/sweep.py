"""Sweeps: a table of (trace, policy, budget) points, each evaluated once.

A point is a :class:`Point`: where its trace comes from (:class:`TraceSpec`:
a trace file, a torch-free modeled ResNet, or a zoo model at a batch), the
policy, the budget (bytes, or a multiple of the trace's lower bound) and an
optional host-link bandwidth.  Its cache key is the SHA-256 of its
configuration, of its trace's content (the file's bytes, or the generated
document) and of snsim's own source, so a changed trace, or a changed planner
or simulator, is a new point.  Each finished point is written
to ``CACHE/<key>.json`` whole (temp + rename) as soon as it returns: a sweep
interrupted (Ctrl-C, a killed worker) and run again redoes no finished point
and never reads a partial one.  An infeasible point, or one a policy refuses
(:class:`~snsim.errors.SnsimError`), is a result row with its ``reason``.

Points run in this process (``workers=1``), in local processes
(``workers=N``), or on an existing Dask distributed cluster
(``scheduler="tcp://host:port"``, the optional extra ``snsim[dask]``).  The
result is a tidy pandas table, one row per point with its full configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from snsim.errors import SnsimError

FORMAT = "snsim.sweep-point/1"
# policy statistics a row carries as columns where the policy reports them (the
# reference policy ``optimal``: DESIGN 6a); other statistics stay out of the table
SOLVER_KEYS = ("status", "source", "optimality_gap", "schedule_gap", "bound_ms",
               "schedule_bound_ms", "compute_bound_ms", "solve_s")


@dataclass(frozen=True)
class TraceSpec:
    """Where a point's trace comes from: ``kind`` is ``file`` (``path``), ``resnet``
    (``stages``, ``batch``, ``device_model``: :mod:`snsim.search.resnet`) or
    ``model`` (zoo ``model`` at ``batch`` on ``device_model``:
    :func:`snsim.search.models.batch_doc`)."""

    kind: str
    path: str | None = None
    model: str | None = None
    stages: tuple[int, ...] | None = None
    batch: int | None = None
    device_model: str | None = None
    # a copy of the generated document on disk (a sweep writes one for traces that
    # need torch, so workers read it instead of profiling); not part of the point
    copy_path: str | None = field(default=None, compare=False)

    def __post_init__(self):
        need = {"file": ("path",), "resnet": ("stages", "batch", "device_model"),
                "model": ("model", "batch", "device_model")}.get(self.kind)
        if need is None:
            raise SnsimError(f"unknown trace kind {self.kind!r}: file, resnet or model")
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise SnsimError(f"a {self.kind} trace needs {', '.join(missing)}")

    def label(self) -> str:
        if self.kind == "file":
            return str(self.path)
        name = self.model or f"resnet-{3 * sum(self.stages) + 2}"
        return f"{name}_b{self.batch}_{self.device_model}"

    def document(self) -> dict[str, Any]:
        """The trace document (generated kinds)."""
        if self.copy_path is not None:
            return json.loads(Path(self.copy_path).read_text(encoding="utf-8"))
        if self.kind == "resnet":
            from snsim.search.resnet import resnet_doc

            return resnet_doc(self.stages, self.batch, self.device_model, model=self.model)
        from snsim.search.models import batch_doc

        return batch_doc(self.model, self.batch, self.device_model)


@dataclass(frozen=True)
class Point:
    trace: TraceSpec
    policy: str
    budget_bytes: int | None = None    # None: the device's memory (unless budget_factor)
    budget_factor: float | None = None  # budget = factor x the trace's lower bound
    link_Bps: float | None = None      # host link bandwidth, both directions (what-if)
    # planner options as sorted (name, value) pairs (``optimal``'s ``time_limit``)
    options: tuple[tuple[str, Any], ...] = ()

    def config(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["trace"]["stages"] = list(self.trace.stages) if self.trace.stages else None
        del d["trace"]["copy_path"]
        d["options"] = dict(self.options)
        return d


@dataclass(frozen=True)
class SweepResult:
    table: Any          # pandas.DataFrame, one row per point, in the points' order
    computed: int       # points evaluated by this run
    cached: int         # points read back from the cache


# ------------------------------------------------------------------- content
@functools.lru_cache(maxsize=64)
def trace_sha256(spec: TraceSpec) -> str:
    if spec.kind == "file":
        try:
            data = Path(spec.path).read_bytes()
        except OSError as exc:
            raise SnsimError(f"cannot read trace {spec.path}: {exc.strerror or exc}") from None
    else:
        data = json.dumps(spec.document(), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def point_key(point: Point) -> str:
    """The point's cache key: its configuration, its trace's content and the
    source of the snsim package (a changed planner or simulator is a new key, as
    in the capacity searches' probe cache), never a stale row."""
    from snsim.search.cache import code_sha256

    blob = json.dumps({"format": FORMAT, "config": point.config(),
                       "trace_sha256": trace_sha256(point.trace),
                       "code_sha256": code_sha256()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# ------------------------------------------------------------------ evaluate
@functools.lru_cache(maxsize=4)  # a worker keeps the last few graphs (points share traces)
def _graph(spec: TraceSpec, link_Bps: float | None):
    from snsim.graph import Graph
    from snsim.trace.io import from_dict

    if spec.kind == "file":
        from snsim.inputs import load_trace

        trace = load_trace(spec.path)
    else:
        trace = from_dict(spec.document(), spec.label())
    if link_Bps is not None:
        dev = dataclasses.replace(trace.device, h2d_Bps=link_Bps, d2h_Bps=link_Bps)
        trace = dataclasses.replace(trace, device=dev)
    return Graph(trace)


def evaluate_point(point: Point) -> dict[str, Any]:
    """One point's row: its configuration, then :meth:`Evaluation.row`."""
    from snsim.evaluate import evaluate

    graph = _graph(point.trace, point.link_Bps)
    budget = point.budget_bytes
    if point.budget_factor is not None:
        budget = int(point.budget_factor * graph.lower_bound_bytes)
    row = {"trace_kind": point.trace.kind, "trace_label": point.trace.label(),
           "device_model": point.trace.device_model, "stages": _stages(point.trace),
           "budget_factor": point.budget_factor, "link_Bps": point.link_Bps,
           "layers": graph.n}
    try:
        e = evaluate(graph, point.policy, budget, options=dict(point.options) or None)
        row.update(e.row())
        # a reference policy's solver figures (``optimal``): its status, gaps and bounds
        row.update({k: e.schedule.stats[k] for k in SOLVER_KEYS if k in e.schedule.stats})
    except SnsimError as exc:  # the policy refuses this trace: a result with its reason
        row.update({"policy": point.policy, "budget_bytes": budget, "feasible": False,
                    "reason": str(exc), "model": graph.trace.model,
                    "batch": graph.trace.batch,
                    "lower_bound_bytes": graph.lower_bound_bytes})
    return row


def _stages(spec: TraceSpec) -> str | None:
    return "-".join(map(str, spec.stages)) if spec.stages else None


# ---------------------------------------------------------------------- run
def _cached(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("row") if doc.get("format") == FORMAT else None


def run_sweep(points: Sequence[Point], cache_dir: str | Path, *, workers: int = 1,
              scheduler: str | None = None, progress: bool | None = None,
              on_point: Callable[[int, dict], None] | None = None) -> SweepResult:
    """Evaluate every point not already in ``cache_dir``; the table of all of them.

    ``on_point(index, row)`` is called in this process as each computed point has
    been written (tests interrupt a sweep from it)."""
    import pandas as pd

    from snsim.fileio import provenance, write_json
    from snsim.search.cache import code_sha256

    if workers < 1:
        raise SnsimError(f"--workers must be at least 1, got {workers}")
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    keys = [point_key(p) for p in points]
    rows: dict[int, dict] = {}
    for i, key in enumerate(keys):
        row = _cached(cache / f"{key}.json")
        if row is not None:
            rows[i] = row
    todo = [i for i in range(len(points)) if i not in rows]
    cached = len(rows)
    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), initial=cached, desc="sweep", unit="point",
                   file=sys.stderr, leave=False)
    prov = provenance({"points": len(points), "workers": workers, "scheduler": scheduler})

    def done(i: int, row: dict) -> None:
        write_json(cache / f"{keys[i]}.json", {"format": FORMAT, "key": keys[i],
                                               "config": points[i].config(),
                                               "trace_sha256": trace_sha256(points[i].trace),
                                               "code_sha256": code_sha256(),
                                               "row": row, "provenance": prov})
        rows[i] = row
        if bar is not None:
            bar.update()
        if on_point is not None:
            on_point(i, row)

    try:
        _dispatch([(i, _portable(points[i], cache)) for i in todo], done, workers, scheduler)
    finally:
        if bar is not None:
            bar.close()
    table = pd.DataFrame([rows[i] for i in range(len(points))])
    return SweepResult(table, len(todo), cached)


def _portable(point: Point, cache: Path) -> Point:
    """``point`` with its trace readable by any worker without torch: a generated
    document that needs the profiler is written once into ``cache/traces``."""
    from snsim.search.models import needs_profile

    spec = point.trace
    if spec.kind != "model" or not needs_profile(spec.model) or spec.copy_path:
        return point
    from snsim.fileio import write_json

    path = cache / "traces" / f"{spec.label()}-{trace_sha256(spec)[:16]}.json"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        write_json(path, spec.document())
    return dataclasses.replace(point, trace=dataclasses.replace(spec, copy_path=str(path)))


def _dispatch(items: list[tuple[int, Point]], done, workers: int,
              scheduler: str | None) -> None:
    map_tasks(evaluate_point, items, done, workers, scheduler)


def map_tasks(fn: Callable, items: list[tuple[Any, Any]], done: Callable[[Any, Any], None],
              workers: int = 1, scheduler: str | None = None) -> None:
    """``done(tag, fn(arg))`` for each ``(tag, arg)``, as results arrive: in this
    process, on ``workers`` local processes, or on the Dask cluster at
    ``scheduler``.  ``fn`` must be a module-level function (it is pickled)."""
    if not items:
        return
    if scheduler is not None:
        _on_dask(fn, items, done, scheduler)
    elif workers == 1 or len(items) == 1:
        for tag, arg in items:
            done(tag, fn(arg))
    else:
        _on_processes(fn, items, done, workers)


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (a worker killed by it
    mid-task can leave the pool hung); a worker finishes its point and exits."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _on_processes(fn, items, done, workers: int) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # forkserver: workers start clean (no copied threads or locks)
    ctx = multiprocessing.get_context("forkserver")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=ctx,
                               initializer=_ignore_sigint)
    finished = False
    try:
        futures = {pool.submit(fn, arg): tag for tag, arg in items}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())
        finished = True
    finally:  # on Ctrl-C: finished results are delivered; drop the rest
        pool.shutdown(wait=finished, cancel_futures=True)


def _on_dask(fn, items, done, scheduler: str) -> None:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise SnsimError("--scheduler needs dask.distributed: pip install "
                         "'snsim[dask]'") from None
    try:
        client = Client(scheduler, timeout=5)
    except (OSError, TimeoutError) as exc:
        raise SnsimError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    try:
        futures = [client.submit(fn, arg, pure=False) for _, arg in items]
        index = {f.key: tag for f, (tag, _) in zip(futures, items)}
        for fut in as_completed(futures):
            done(index[fut.key], fut.result())
    finally:
        client.close()


def grid(traces: Iterable[TraceSpec], policies: Iterable[str], **fields: Iterable) -> list[Point]:
    """Every combination of ``traces`` x ``policies`` x each field's values."""
    import itertools

    names = list(fields)
    out = []
    for spec, policy in itertools.product(list(traces), list(policies)):
        for values in itertools.product(*(list(fields[n]) for n in names)):
            out.append(Point(spec, policy, **dict(zip(names, values))))
    return out

"""Solve a :class:`~.formulation.Milp` with HiGHS (``highspy``, the optional
extra ``snsim[optimal]``), imported only when a plan is asked for."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from snsim.errors import PolicyError
from snsim.policies.optimal import child
from snsim.policies.optimal.milp import Milp

ISOLATE_NONZEROS = 500_000   # models this large are solved in a killable child (note 2)
GRACE_S = 0.5                # HiGHS's own limit ends this long before the kill


@dataclass(frozen=True)
class Solution:
    status: str                    # "optimal", "time-limit", "infeasible", ...
    values: list[float] | None     # column values of the best solution found
    objective: float               # its objective (inf if none)
    bound: float                   # the solver's lower bound on the objective
    solve_s: float
    start_taken: int | None = None   # which start (0: ``start``, then ``starts``) was taken


def highs():
    try:
        import highspy
    except ImportError:
        raise PolicyError("policy optimal needs the MILP solver highspy: "
                          "pip install 'snsim[optimal]' (or pip install highspy)") from None
    return highspy


_BANNER_SHOWN = False


def quiet_highs(hp):
    """A ``Highs`` object, made without the banner HiGHS prints to the process's
    standard output (C level, fd 1) when the first one is made: ``--json``
    prints exactly one JSON object.  Later ones print nothing once their
    ``output_flag`` is off."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        return hp.Highs()
    import os
    import sys

    _BANNER_SHOWN = True
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):   # no fd 1 to point elsewhere: the banner shows
        return hp.Highs()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        return hp.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def solve(milp: Milp, time_limit: float, threads: int = 1, cutoff: float | None = None,
          start: tuple[list[int], list[float]] | None = None,
          starts: list[tuple[list[int], list[float]]] = (), first: bool = False,
          isolate: bool | None = None) -> Solution:
    """Minimise ``milp`` within ``time_limit`` seconds; ``cutoff``: only
    solutions better than this objective are of interest (prunes the search);
    ``start``: (columns, values) of integer columns of a known solution;
    ``starts``: more of them, tried in order after ``start`` until one
    completes to a feasible point (:func:`complete`); ``first``: only whether
    the model has a solution (the search stops at the first; a start that
    completes is one: status ``feasible``, without a search).

    ``isolate`` (default: models of at least ``ISOLATE_NONZEROS`` nonzeros,
    where :func:`child.available`): handing the model to HiGHS, the starts
    and the search run in a child process killed at the limit
    (:func:`isolated`), so the limit is a deadline; otherwise (or when the
    fork fails) HiGHS's own limit, which its presolve does not check."""
    entry = time.perf_counter()   # the limit covers handing the model over too
    hp = highs()
    tries = ([start] if start is not None else []) + list(starts)
    if isolate is None:
        isolate = (child.available()
                   and milp.nonzeros >= ISOLATE_NONZEROS)
    if isolate:
        try:
            return isolated(lambda ends, channel: search(
                loaded(hp, milp, threads, cutoff, first), hp, milp, tries, first, ends,
                channel), entry + time_limit)
        except child.ForkFailed:
            pass   # no process to spare: HiGHS's own limit, as without os.fork
    return search(loaded(hp, milp, threads, cutoff, first), hp, milp, tries, first,
                  entry + time_limit)


def loaded(hp, milp: Milp, threads: int, cutoff: float | None, first: bool):
    """A quiet ``Highs`` with the options set and ``milp`` passed."""
    h = quiet_highs(hp)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("random_seed", 0)
    if cutoff is not None and math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    if first:
        h.setOptionValue("mip_max_improving_sols", 1)
    lp = hp.HighsLp()
    lp.num_col_ = len(milp.lb)
    lp.num_row_ = len(milp.rows)
    lp.col_cost_ = milp.cost
    lp.col_lower_ = milp.lb
    lp.col_upper_ = milp.ub
    lp.row_lower_ = [r[2] for r in milp.rows]
    lp.row_upper_ = [r[3] for r in milp.rows]
    a = lp.a_matrix_
    a.format_ = hp.MatrixFormat.kRowwise
    row_start, index, value = [0], [], []
    for idx, val, _, _ in milp.rows:
        index.extend(idx)
        value.extend(val)
        row_start.append(len(index))
    a.start_, a.index_, a.value_ = row_start, index, value
    a.num_col_, a.num_row_ = lp.num_col_, lp.num_row_
    lp.a_matrix_ = a
    lp.integrality_ = [hp.HighsVarType.kInteger if b else hp.HighsVarType.kContinuous
                       for b in milp.integer]
    h.passModel(lp)
    return h


def search(h, hp, milp: Milp, tries: list, first: bool, ends: float,
           channel: child.Channel | None = None) -> Solution:
    """The starts tried (:func:`complete`), then HiGHS run with its time limit
    ending at ``ends`` (``time.perf_counter()``); with ``channel`` (in a child
    process) each start taken, improving solution and new dual bound is
    reported as it comes (:func:`report`)."""
    t0 = time.perf_counter()
    h.setOptionValue("time_limit", max(0.1, ends - t0))
    taken = None
    for i, st in enumerate(tries):
        if st and st[0] and complete(h, hp, milp, st):
            taken = i
            break
    if first and taken is not None:
        info = h.getInfo()
        return Solution("feasible", list(h.getSolution().col_value),
                        info.objective_function_value, 0.0, time.perf_counter() - t0, taken)
    if tries:
        h.setOptionValue("time_limit", max(0.1, ends - time.perf_counter()))
    if channel is not None:
        channel.send("start", taken)
        report(h, channel)
    h.run()
    solve_s = time.perf_counter() - t0
    ms = h.getModelStatus()
    info = h.getInfo()
    S = hp.HighsModelStatus
    status = {S.kOptimal: "optimal", S.kInfeasible: "infeasible",
              S.kTimeLimit: "time-limit"}.get(ms, h.modelStatusToString(ms).lower())
    has = info.primal_solution_status == 2   # feasible point
    values = list(h.getSolution().col_value) if has else None
    obj = info.objective_function_value if has else math.inf
    bound = info.mip_dual_bound
    if status == "optimal" and has:
        bound = min(bound, obj) if math.isfinite(bound) else obj
    return Solution(status, values, obj, bound if math.isfinite(bound) else 0.0, solve_s,
                    taken)


def report(h, channel: child.Channel) -> None:
    """Send the parent each improving solution (objective, column values as
    float64 bytes) and each new finite dual bound of the search on ``h``; the
    child leaves when the parent is gone."""
    import numpy as np

    sent = [math.nan]

    def guarded(fn):
        def cb(e):
            try:
                fn(e.data_out)
            except BaseException:   # noqa: BLE001 (the parent is gone: nothing to report to)
                os._exit(1)
        return cb

    def improving(out):
        values = np.asarray(out.mip_solution, dtype=np.float64)
        channel.send("incumbent", (float(out.objective_function_value), values.tobytes()))

    def interrupt(out):
        b = out.mip_dual_bound
        if math.isfinite(b) and b != sent[0]:
            sent[0] = b
            channel.send("bound", float(b))
        elif channel.orphaned():
            os._exit(1)

    h.cbMipImprovingSolution.subscribe(guarded(improving))
    h.cbMipInterrupt.subscribe(guarded(interrupt))


def isolated(work, deadline: float) -> Solution:
    """``work(ends, channel)`` (a :func:`search`) in a child process
    (:func:`child.supervise`), killed at ``deadline``; HiGHS's own limit
    ``ends`` ``GRACE_S`` before it, so that a search that stops by itself
    hands over its own result.  Killed: status ``time-limit``, the last
    improving solution reported (or none) and the last dual bound (or 0)."""
    import numpy as np

    t0 = time.perf_counter()
    ends = deadline - min(GRACE_S, 0.1 * max(0.0, deadline - t0))
    out = child.supervise(lambda channel: work(ends, channel), deadline)
    if out.error is not None:
        raise PolicyError(f"policy optimal: the solver's process failed: {out.error}")
    if out.done:
        return out.final
    values, obj = None, math.inf
    if "incumbent" in out.last:
        obj, raw = out.last["incumbent"]
        values = np.frombuffer(raw, dtype=np.float64).tolist()
    status = "time-limit" if time.perf_counter() >= deadline else "solver-died"
    return Solution(status, values, obj, out.last.get("bound", 0.0),
                    time.perf_counter() - t0, out.last.get("start"))


def complete(h, hp, milp: Milp, start: tuple[list[int], list[float]]) -> bool:
    """Give ``h`` the start: integer columns fixed to ``start`` (0 where it says
    nothing), the continuous ones from an LP, then the bounds restored; False
    (and nothing given) when that LP is infeasible."""
    import numpy as np

    fixed = dict(zip(*start))
    cols = np.array([k for k, b in enumerate(milp.integer) if b], dtype=np.int32)
    vals = np.array([float(fixed.get(int(k), 0.0)) for k in cols])
    h.changeColsBounds(len(cols), cols, vals, vals)
    h.run()
    ok = h.getInfo().primal_solution_status == 2
    sol = h.getSolution() if ok else None
    h.changeColsBounds(len(cols), cols, np.array([milp.lb[k] for k in cols]),
                       np.array([milp.ub[k] for k in cols]))
    if ok:
        h.setSolution(sol)
    return ok


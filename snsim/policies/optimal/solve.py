"""Solve a :class:`~.formulation.Milp` with HiGHS (``highspy``, the optional
extra ``snsim[optimal]``), imported only when a plan is asked for."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from snsim.errors import PolicyError
from snsim.policies.optimal.milp import Milp


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
          starts: list[tuple[list[int], list[float]]] = (), first: bool = False) -> Solution:
    """Minimise ``milp`` within ``time_limit`` seconds; ``cutoff``: only
    solutions better than this objective are of interest (prunes the search);
    ``start``: (columns, values) of integer columns of a known solution;
    ``starts``: more of them, tried in order after ``start`` until one
    completes to a feasible point (:func:`complete`); ``first``: only whether
    the model has a solution (the search stops at the first; a start that
    completes is one: status ``feasible``, without a search)."""
    entry = time.perf_counter()   # the limit covers handing the model over too
    hp = highs()
    h = quiet_highs(hp)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
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
    t0 = time.perf_counter()
    h.setOptionValue("time_limit", max(0.1, time_limit - (t0 - entry)))
    tries = ([start] if start is not None else []) + list(starts)
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
        h.setOptionValue("time_limit", max(0.1, time_limit - (time.perf_counter() - entry)))
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


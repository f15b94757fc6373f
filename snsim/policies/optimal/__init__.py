"""``optimal``: the best schedule of a MILP over keep / recompute / offload /
prefetch decisions (Checkmate's matrices plus the two copy engines), solved
with HiGHS, as a reference the heuristics are measured against.

* :mod:`.formulation`: the model and the schedule class it can express;
* :mod:`.solve`: HiGHS (``highspy``, imported lazily: one line if missing);
* :mod:`.decode`: the solution as ops, and the model's predicted peak;
* :mod:`.start`: a heuristic's plan read as the model's binaries (the warm
  start: the first heuristic plan, fastest first, that is in the class and
  satisfies every row is HiGHS's first incumbent; ``stats["milp_start"]``);
* :mod:`snsim.policies.polish`: the best plan's recomputations dropped, undone, trimmed or
  swapped where that is faster (``source`` ``<name>+polish``,
  ``stats["polished"]``);
* :mod:`.variants`: ``superneurons`` under its other knob settings, polished,
  fastest first, within ``VARIANT_S``; the fastest kept when it beats that
  (``stats["variant"]``, ``source`` ``superneurons+polish``).

With a heuristic plan, the MILP is searched only for faster plans
(:func:`capped`: its time caps the makespan; status ``cutoff`` when the
class has none).  A capped model of ``SUFFIX_NONZEROS`` or more (the
ResNets, Inception-v4: HiGHS does not solve its root LP within the limit)
is bounded by its stage windows' rows instead, their least times added up
(:mod:`.suffix`, status ``split-bound``, or ``cutoff`` where they leave no
plan that fast).

The plan returned is never worse than the heuristics: the best feasible plan
of ``superneurons``, ``dtr``, ``utp``, ``cost-aware`` and ``liveness`` (by
:func:`replay.estimate_ms`, the simulator's rules) is kept when the MILP's
incumbent is not faster.  ``stats``: ``status`` (the solver's), ``source``
(``milp`` or the heuristic's name), ``predicted_ms`` / ``predicted_peak_bytes``
(the model's, for the MILP's plan), ``bound_ms`` (the solver's lower bound,
valid for the formulation's schedule class, not for every schedule),
``optimality_gap`` ((time - bound) / time, never below 0; None without a
MILP), ``compute_bound_ms`` / ``compute_gap`` (a bound every schedule obeys:
each route step at its fastest algorithm), ``schedule_bound_ms`` /
``schedule_gap`` (the largest of that, the moment bound of :mod:`.bound`
and the window bound of :mod:`.window`, also valid for every schedule;
``moment_bound_ms``, ``moment_step``, ``moment_s``, ``window_bound_ms``,
``window_steps``, ``window_s``), ``solve_s`` (all planning).  ``bound_ms`` is
the larger of ``schedule_bound_ms`` and the solver's bound.

Scale (note 1).  The flat model has one keep binary per activation and stage
it may live across, ~n^2 for n layers.  Above ``FLAT_LIMIT`` columns a
prefetch may only be issued in the ``WINDOW`` stages before a use; above
``MAX_COLUMNS`` no MILP is built and the best heuristic is returned with the
trivial bound (every route step at its fastest algorithm): its gap is then a
bound on what any schedule could gain.

The time limit (note 2) is a deadline for the whole plan, not only the
solver's: the heuristics, variants, polish, tail splice (:mod:`.tail`)
and the moment and window bounds take their shares of it (``*_SHARE``;
time the MILP leaves unused goes to the window bound again), the MILP's
search ends ``RESERVE_S`` (at most ``RESERVE_SHARE`` of the limit) before
it, leaving that to decode and polish the MILP's plan, and the polish gets
only what is left.  HiGHS checks its own limit only where it calls its
interrupt callbacks, not in its presolve (ResNet-101 b16 at 1.5x: 20-45 s
past it), so a large model's search runs in a child process killed at its deadline (:mod:`.child`,
:func:`.solve.isolated`): status ``time-limit``, the last incumbent and dual
bound it reported.  A model whose build (``BUILD_S_PER_COLUMN`` per
:func:`columns_estimate` column, a high guess) would not leave
``MIN_SOLVE_S`` (at most ``MIN_SOLVE_SHARE`` of the limit) for its search
is not built (status ``not-built: no time left ...``).
What is not cut short: the heuristics' own planning and a build slower
than guessed.

Beside the heuristics (note 3, :mod:`.beside`).  Where ``os.fork`` exists,
a child process builds the model capped at the fastest heuristic plan's
time as soon as the heuristics have planned, and, where it has
``SUFFIX_NONZEROS`` or more, bounds it by its stage windows until the
MILP's deadline, on a second core while this process polishes, splices
and works out the bounds every schedule obeys (where the windows leave
no plan within that time, the child asks in its last ``PROBE_SHARE`` of
the limit whether the class has a plan at all, as :func:`settle` does);
this process takes its result where it would have built the model (a
smaller model is searched here as before).  On one
core the two share it, and the deadline holds all the same.  The option
``serial`` (``snsim simulate --serial``) keeps to one busy process: the
model is then built and bounded here, after the heuristics' work.
"""

from __future__ import annotations

import math
import time

from snsim.errors import PolicyError
from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import replay
from snsim.policies.base import PlanContext
from snsim.policies.finishing import finish
from snsim.policies.optimal import beside, child
from snsim.policies.optimal.bound import moment_bound
from snsim.policies.optimal.window import TAILS, window_bound
from snsim.policies.optimal.decode import decode
from snsim.policies.optimal.formulation import build, warm_start
from snsim.policies.polish import polish
from snsim.policies.optimal.solve import Solution, highs, solve
from snsim.policies.optimal.start import plan_start
from snsim.policies.optimal.suffix import split_bound, suffix_bound
from snsim.policies.optimal.tail import best_tail
from snsim.policies.optimal.variants import best_variant
from snsim.schedule.ops import Schedule

TIME_LIMIT_S = 60.0
HEURISTICS = ("superneurons", "dtr", "utp", "cost-aware", "liveness")
FLAT_LIMIT = 60_000
WINDOW = 8
MAX_COLUMNS = 400_000
MOMENT_S = 10.0        # at most this long on the moment bound (bound.py) ...
MOMENT_SHARE = 0.1    # ... and at most this share of the time limit
MOMENT_EXACT = 3       # moments solved as MILPs after the LP screening
WINDOW_BOUND_S = 10.0  # at most this long on the window bound (window.py) ...
WINDOW_BOUND_SHARE = 0.1   # ... and at most this share of the time limit
TAIL_S = 20.0          # at most this long re-planning the best plan's tail (tail.py) ...
TAIL_SHARE = 0.2       # ... and at most this share of the time limit
LEFTOVER_MIN_S = 5.0   # time left this long after the MILP goes to the longer window ...
LEFTOVER_GAP = 0.01    # ... where the plan is more than this far above the bound
POLISH_S = 5.0         # at most this long polishing a plan (snsim/policies/polish.py) ...
POLISH_SHARE = 0.1     # ... and at most this share of the time limit, per plan polished
VARIANT_S = 10.0       # at most this long on superneurons' variants (variants.py) ...
VARIANT_SHARE = 0.25   # ... and at most this share of the time limit
RESERVE_S = 1.0        # the MILP's search ends this long before the time limit ...
RESERVE_SHARE = 0.05   # ... (at most this share of it), to decode and polish its plan
BUILD_S_PER_COLUMN = 80e-6   # a high guess of the build time (ResNet-101 b16: 2.4-5.7 s, 72k;
                             # Inception-v4 b16: 12 s, 170k)
MIN_SOLVE_S = 1.0      # a model is built only with this long left for its search ...
MIN_SOLVE_SHARE = 0.1  # ... (at most this share of the time limit)
SUFFIX_NONZEROS = 500_000   # a capped model this large is bounded by its last stages (.suffix)
SUFFIX_EMPTY_SHARE = 0.25   # of the time left, to ask whether the class has any plan ...
EMPTY_TRIES = ((40, True),)   # ... from its last stages' LP relaxation
BESIDE = True   # a large model's split bound worked out beside the heuristics (note 3) ...
PROBE_SHARE = 0.15   # ... its last part (twice the build guess, at most this share of the
                     # limit) to ask whether the class has a plan, where the windows leave none
                     # within the cutoff


def compute_bound_ms(g: Graph) -> float:
    """No schedule is faster than every route step at its fastest algorithm, and the
    optimizer step every plan ends with (its time is fixed)."""
    return sum(min(g.step_ms(s, a) for a in range(max(1, len(g.layers[s[1]].workspace))))
               for s in g.route) + g.optimizer_ms


def columns_estimate(g: Graph) -> int:
    """Roughly the flat model's keep columns: each activation across its live stages."""
    last = g.last_use
    return sum(max(0, last.get(("X", i), i) - i) for i in range(g.n))


def best_heuristic(ctx: PlanContext):
    """(ms, name, schedule) of the fastest feasible heuristic plan, or None."""
    found = heuristic_plans(ctx)
    return found[0] if found else None


def heuristic_plans(ctx: PlanContext) -> list:
    """[(ms, name, schedule)] of the feasible heuristic plans, fastest first."""
    from snsim.policies import plan

    g, cap = ctx.graph, ctx.capacity_bytes
    found = []
    for name in HEURISTICS:
        if name == "dtr" and g.n > 5000:
            continue   # tens of seconds of planning on 10^4 layers
        s = plan(name, PlanContext(g, ctx.budget_bytes))
        if s.infeasible_reason is not None:
            continue
        if replay.planned_peak(g, s.ops, cap)[1] is not None:
            continue
        ms = replay.estimate_ms(g, s.ops, cap)
        if ms < math.inf:
            found.append((ms, name, s))
    return sorted(found, key=lambda x: x[0])


def two_phase(g: Graph, cap: int, window: int | None, seconds: float, plans: list = (),
              stats: dict | None = None, cutoff: float | None = None, need_s: float = 0.0):
    """Solve the full model started from the first of the heuristics' ``plans``
    ([(ms, name, schedule)]) that is a solution of it (:mod:`.start`);
    failing that, the model without same-stage prefetches first (smaller,
    fast), then the full model from its solution; the result and the
    formulation it is a solution of.  With ``cutoff`` (ms, the fastest
    heuristic plan's time): see :func:`capped`.  ``need_s``: about how long
    a build and the least search take; a second model is built only with
    that long left (note 2)."""
    if cutoff is not None and math.isfinite(cutoff):
        return capped(g, cap, window, seconds, plans, stats, cutoff, need_s)
    t0 = time.perf_counter()
    left = lambda: max(0.1, seconds - (time.perf_counter() - t0))  # noqa: E731
    full = build(g, cap, window)
    mapped = [(name, plan_start(full, s.ops)) for _, name, s in plans]
    mapped = [(name, st) for name, st in mapped if st is not None]
    if mapped:
        sol = solve(full.milp, left(), starts=[st for _, st in mapped])
        if sol.start_taken is not None:
            if stats is not None:
                stats["milp_start"] = mapped[sol.start_taken][0]
            return sol, full
        if seconds - (time.perf_counter() - t0) < max(1.0, need_s):
            return sol, full   # no time left for the second route
    small = build(g, cap, window, sync=False)
    first = solve(small.milp, 0.4 * left())
    start = None if first.values is None else warm_start(small, first.values, full)
    second = solve(full.milp, left(), start=start)
    if second.values is None and first.values is not None:
        # the start was not taken: keep the first phase's plan, with the full model's bound
        return (Solution(second.status, first.values, first.objective,
                         min(second.bound, first.objective), second.solve_s), small)
    if (first.values is not None and second.values is not None
            and first.objective < second.objective):
        return (Solution(second.status, first.values, first.objective, second.bound,
                         second.solve_s), small)
    return second, full


def capped(g: Graph, cap: int, window: int | None, seconds: float, plans: list,
           stats: dict | None, cutoff: float, need_s: float = 0.0):
    """The full model searched only for plans at most ``cutoff`` ms (a heuristic
    plan already runs there): the makespan's upper bound, which shrinks every
    big-M of the time rows (:mod:`.timing`) and so raises the LP bound the
    search starts from (VGG-16 b32 at 1.05x: 1.0053 -> 1.0088 x compute in
    60 s).  Its dual bound ``b`` proves that no plan of the class is faster
    than ``min(b, cutoff)`` (a plan of the class faster than that would be a
    solution of the capped model below its bound), so the bound returned is
    that.  The capped model infeasible: no plan of the class is faster than
    the cutoff (status ``cutoff``, bound ``cutoff``) when the class has a plan
    at all (a heuristic's read as binaries, or one found by the uncapped
    model in the time left); otherwise ``infeasible`` as before (an empty
    class bounds nothing; so it is when less than ``need_s`` is
    left to build and search the uncapped model: status ``time-limit``).
    A model of ``SUFFIX_NONZEROS`` or more is not searched: the rows of each
    window of its stages bound that window's time, and the windows' bounds
    add up (:func:`.suffix.split_bound`: status ``split-bound``, or the above
    where they leave no plan within the cutoff), and an uncapped model's
    last stages' LP without a solution shows the class empty
    (``infeasible``)."""
    t0 = time.perf_counter()
    left = lambda: max(0.1, seconds - (time.perf_counter() - t0))  # noqa: E731
    route = cutoff - g.optimizer_ms   # the model prices the route
    form = build(g, cap, window, cutoff=route)
    if form.milp.nonzeros >= SUFFIX_NONZEROS:
        # too large to solve its root LP in time: its stage windows bound it (.suffix)
        bound, none = split_bound(form, left(), stats)
        sol = Solution("infeasible" if none else "split-bound", None, math.inf,
                       0.0 if none else bound, time.perf_counter() - t0)
    else:
        mapped = [(name, plan_start(form, s.ops)) for _, name, s in plans]
        mapped = [(name, st) for name, st in mapped if st is not None]
        sol = solve(form.milp, left(), starts=[st for _, st in mapped])
        if sol.start_taken is not None and stats is not None:
            stats["milp_start"] = mapped[sol.start_taken][0]
    return settle(g, cap, window, left(), plans, route, need_s, sol, form)


def settle(g: Graph, cap: int, window: int | None, seconds: float, plans: list,
           route: float, need_s: float, sol: Solution, form):
    """(solution, formulation) of :func:`capped` from the capped model's
    ``sol`` (``form`` its model, or None where it was solved elsewhere):
    its bound no higher than ``route`` (the cutoff, ms of the route); where
    it has no solution, whether the class has any plan (the uncapped model,
    within ``seconds``): ``cutoff`` if so, ``infeasible`` if not."""
    t0 = time.perf_counter()
    left = lambda: max(0.1, seconds - (time.perf_counter() - t0))  # noqa: E731
    if sol.status != "infeasible":
        return Solution(sol.status, sol.values, sol.objective, min(sol.bound, route),
                        sol.solve_s, sol.start_taken), form
    if seconds - (time.perf_counter() - t0) < need_s:
        return Solution("time-limit", None, math.inf, 0.0, sol.solve_s), form
    full = build(g, cap, window)
    if full.milp.nonzeros >= SUFFIX_NONZEROS and suffix_bound(
            full, SUFFIX_EMPTY_SHARE * left(), tries=EMPTY_TRIES)[1]:
        # the class's last stages alone have no plan: the class is empty
        return Solution("infeasible", None, math.inf, 0.0, time.perf_counter() - t0), full
    starts = [st for st in (plan_start(full, s.ops) for _, _, s in plans) if st is not None]
    probe = solve(full.milp, left(), starts=starts, first=True)
    if probe.start_taken is None and probe.values is None:
        # no plan of the class known: it may be empty, and then it bounds nothing
        return Solution(probe.status, None, math.inf, 0.0, sol.solve_s + probe.solve_s), full
    return Solution("cutoff", None, math.inf, route, sol.solve_s + probe.solve_s), form


@register("optimal", "MILP optimum of keep/recompute/offload/prefetch (HiGHS; a reference)",
          order=90, needs=("backward",), reference=True)
def plan_optimal(ctx: PlanContext) -> Schedule:
    highs()   # one line, before any work, if the solver is missing
    g, cap = ctx.graph, ctx.capacity_bytes
    opts = dict(ctx.options or {})
    time_limit = float(opts.get("time_limit", TIME_LIMIT_S))
    if not time_limit > 0:
        raise PolicyError(f"policy optimal: time limit must be > 0 seconds, not {time_limit}")
    serial = bool(opts.get("serial", False))   # no child beside the heuristics (note 3)
    t0 = time.perf_counter()
    ends = t0 + time_limit   # the deadline of the whole plan (note 2)
    trivial = compute_bound_ms(g)
    stats: dict = {"compute_bound_ms": round(trivial, 6)}
    if cap < g.lower_bound_bytes:
        from snsim.policies.liveness import liveness_ops
        return Schedule("optimal", liveness_ops(g), ctx.budget_bytes,
                        {**stats, "status": "infeasible"},
                        f"the budget ({cap} bytes) is below the lower bound "
                        f"({g.lower_bound_bytes} bytes): no schedule fits")
    plans = heuristic_plans(ctx)
    cols = columns_estimate(g)
    window = None if cols <= FLAT_LIMIT else WINDOW
    reserve = min(RESERVE_S, RESERVE_SHARE * time_limit)   # to decode and polish (note 2)
    need = BUILD_S_PER_COLUMN * cols + min(MIN_SOLVE_S, MIN_SOLVE_SHARE * time_limit)
    bg = None
    if (BESIDE and not serial and plans and child.available() and cols <= MAX_COLUMNS
            and plans[0][0] > trivial * (1 + 1e-12)):
        # the class's split bound, beside the heuristics' work (.beside, note 3)
        first = plans[0][0] - g.optimizer_ms   # the model prices the route

        def then(sol: Solution, seconds: float, route: float) -> Solution:
            return settle(g, cap, window, seconds, plans, route, need, sol, None)[0]
        try:
            bg = beside.start(g, cap, window, first, SUFFIX_NONZEROS, ends - reserve,
                              min(2 * need, PROBE_SHARE * time_limit), then)
        except child.ForkFailed:
            bg = None
    try:
        return plan_rest(ctx, plans, stats, trivial, t0, time_limit, reserve, window, cols,
                         need, bg)
    finally:
        if bg is not None:
            bg.cancel()


def plan_rest(ctx: PlanContext, plans: list, stats: dict, trivial: float, t0: float,
              time_limit: float, reserve: float, window: int | None, cols: int,
              need: float, bg) -> Schedule:
    """:func:`plan_optimal` after the heuristics planned (``trivial``: the
    compute bound; ``need``: a guess of a model's build and least search
    time; ``bg``: the child working out the split bound, or None)."""
    g, cap = ctx.graph, ctx.capacity_bytes
    ends = t0 + time_limit
    polish_s = min(POLISH_S, POLISH_SHARE * time_limit)
    if plans:
        ms, name, s = plans[0]
        ms, ops, undone = polish(g, cap, s.ops, ms, polish_s)
        got = None
        if ms > trivial * (1 + 1e-12):
            got = best_variant(g, cap, ms, min(VARIANT_S, VARIANT_SHARE * time_limit),
                               polish_s, s.ops)
        if got is not None:
            ms, stats["variant"], ops, undone = got
            name = "superneurons"
        if undone:
            stats["polished"] = undone
        tail = None
        if ms > trivial * (1 + 1e-12):
            tail = best_tail(g, cap, ops, ms, min(TAIL_S, TAIL_SHARE * time_limit))
        if tail is not None:
            ms, ops, stats["tail_steps"] = tail
        if undone or got is not None or tail is not None:
            label = f"{name}+polish" if undone or got is not None else name
            label += "+tail" if tail is not None else ""
            plans.insert(0, (ms, label, Schedule(name, ops, ctx.budget_bytes)))
            if bg is not None:
                bg.tighten(ms - g.optimizer_ms)
    heur = plans[0] if plans else None
    sol = milp_ops = None
    every = trivial   # a bound every schedule obeys (the compute bound, or a moment's)
    if heur is None or heur[0] > trivial * (1 + 1e-12):
        mb = moment_bound(g, cap, min(MOMENT_S, MOMENT_SHARE * time_limit),
                          MOMENT_EXACT, stats)
        wb = window_bound(g, cap, min(WINDOW_BOUND_S, WINDOW_BOUND_SHARE * time_limit),
                          stats)
        every = max([trivial] + [b for b in (mb, wb) if math.isfinite(b)])
    stats["schedule_bound_ms"] = round(every, 6)
    if heur is not None and heur[0] <= trivial * (1 + 1e-12):
        stats["status"] = "optimal: a heuristic plan runs at the compute bound"
    elif heur is not None and heur[0] <= every * (1 + 1e-9):
        which = "moment" if stats.get("moment_bound_ms", 0) >= every - 1e-6 else "window"
        stats["status"] = f"optimal: a heuristic plan runs at the {which} bound"
    elif cols > MAX_COLUMNS:
        stats["status"] = "not-built: model too large (note 1)"
    elif (split := beside.collect(bg, ends - reserve) if bg is not None else None) is not None \
            and not split.small:
        # bounded beside the heuristics (note 3): no model here
        if window is not None:
            stats["prefetch_window"] = window
        stats.update(split.stats)
        # a cutoff proved (the class has plans, none within the cutoff the
        # child read) holds for the returned plan's time, no slower; a sum
        # of the windows above that time is no proof (the class may be empty)
        bound = (min(split.bound, heur[0] - g.optimizer_ms) if split.status == "cutoff"
                 else split.bound)
        sol = Solution(split.status, None, math.inf, bound, time.perf_counter() - t0)
        stats["milp_columns"], stats["milp_rows"] = split.columns, split.rows
        stats["status"] = sol.status
    elif ends - reserve - time.perf_counter() < need:
        stats["status"] = "not-built: no time left to build the model (note 2)"
    else:
        if window is not None:
            stats["prefetch_window"] = window
        sol, form = two_phase(g, cap, window, ends - reserve - time.perf_counter(), plans,
                              stats, cutoff=heur[0] if heur is not None else None,
                              need_s=need)
        stats["milp_columns"] = len(form.milp.lb)
        stats["milp_rows"] = len(form.milp.rows)
        stats["status"] = sol.status
        if sol.values is not None:
            milp_ops, peak = decode(form, sol.values)
            # the model prices the route; the optimizer step's fixed time follows it
            stats["predicted_ms"] = round(sol.objective + g.optimizer_ms, 6)
            stats["predicted_peak_bytes"] = peak
    if sol is None:
        bound = every if heur is not None else None
    else:
        # an infeasible class proves nothing about other schedules: the moment bound stays
        bound = (max(every, sol.bound + g.optimizer_ms) if sol.status != "infeasible"
                 else every)
    choice = None
    if milp_ops is not None:
        ms = replay.estimate_ms(g, milp_ops, cap)
        choice = (ms, "milp", milp_ops)
        ms, ops, undone = polish(g, cap, milp_ops, ms,
                                 min(polish_s, max(0.0, ends - time.perf_counter())))
        if undone:
            stats["polished"] = undone
            choice = (ms, "milp+polish", ops)
    if heur is not None and (choice is None or heur[0] < choice[0] - 1e-9):
        choice = (heur[0], heur[1], heur[2].ops)
    left = ends - time.perf_counter() - reserve
    if (choice is not None and "window_bound_ms" in stats and left >= LEFTOVER_MIN_S
            and choice[0] > every * (1 + LEFTOVER_GAP)):
        # the MILP ended early or was not built (an infeasible class, a cutoff,
        # a model too large): the time left goes to the longer window, whose
        # bound grows with its search time (a cutoff proves nothing beyond the
        # class: the bound every schedule obeys is still worth raising)
        more: dict = {}
        wb = window_bound(g, cap, left, more, tails=(max(TAILS),))
        stats["window_s"] = round(stats["window_s"] + more["window_s"], 3)
        if wb > every:
            every = wb
            stats["window_bound_ms"], stats["window_steps"] = more["window_bound_ms"], max(TAILS)
            stats["schedule_bound_ms"] = round(every, 6)
            bound = every if bound is None else max(bound, every)
    stats["solve_s"] = round(time.perf_counter() - t0, 3)
    if choice is None:
        from snsim.policies.liveness import liveness_ops
        why = ("no schedule of the formulation's class fits the budget (the MILP is infeasible)"
               if sol is not None and sol.status == "infeasible"
               else f"no plan found within {time_limit:g} s fits the budget")
        return Schedule("optimal", liveness_ops(g), ctx.budget_bytes, stats, why)
    ms, source, ops = choice
    stats["source"] = source
    stats["compute_gap"] = round((ms - trivial) / ms, 6) if ms > 0 else 0.0
    stats["schedule_gap"] = round(max(0.0, (ms - every) / ms), 6) if ms > 0 else 0.0
    bound = every if bound is not None and ms < bound - 1e-9 else bound   # beaten: not a bound
    stats["bound_ms"] = None if bound is None else round(bound, 6)
    stats["optimality_gap"] = (None if bound is None else
                               round(max(0.0, (ms - bound) / ms), 6) if ms > 0 else 0.0)
    if source != "milp":
        stats.pop("predicted_ms", None)
        stats.pop("predicted_peak_bytes", None)
    return finish("optimal", g, ops, ctx.budget_bytes, stats)

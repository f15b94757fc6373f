"""The class's split bound worked out beside the heuristics, in a child
process (issue 15, eighth pass).

``optimal`` spends most of its limit in one process on the heuristics'
plans (the polish, superneurons' variants, the tail splice) and on the
bounds every schedule obeys; a large model's split bound
(:func:`.suffix.split_bound`) got what was left (ResNet-50 b32 at 1.25x: 24
of 60 s).  Its windows' MILPs gain with time (there, 1.118 x compute in
24 s, 1.137 in 132 s), and they need none of the heuristics' work but a
cutoff.  So the capped model is built and bounded in a forked child from
the start, capped at the fastest heuristic plan's time before any polish,
on a second core, while the parent goes on; the parent collects the
result (or the last sum the child reported) when it would have started
the search itself.  The cutoff is looser than the final plan's, so the
windows bound every plan of the class no slower than that first plan,
which includes every plan no slower than the one returned; the parent
tightens the cutoff the child reads (shared memory) as it finds faster
plans, so that the windows' sum above the returned plan's time proves
what the serial search would.  Where the windows leave no plan within
the cutoff, the child asks (``then``, the
caller's :func:`snsim.policies.optimal.settle`) whether the class has any
plan at all, in the last ``probe_s`` of its time.

A model below ``large`` nonzeros is not bounded here: the child reports
its size and ends, and the parent searches it whole as before.
"""

from __future__ import annotations

import math
import mmap
import struct
import time
from dataclasses import dataclass, field

from snsim.errors import PolicyError
from snsim.graph import Graph
from snsim.policies.optimal import child
from snsim.policies.optimal.formulation import build
from snsim.policies.optimal.solve import Solution
from snsim.policies.optimal.suffix import split_bound

GRACE_S = 0.5   # the child's own work ends this long before its deadline
CUTOFF = struct.Struct("<d")   # the cutoff the parent may tighten, ms of the route


@dataclass
class Split:
    """What the child found: ``small`` (the model is below ``large``
    nonzeros: not bounded), else ``status`` (``split-bound``; ``cutoff``,
    ``infeasible`` or ``time-limit`` from ``then`` where the windows left no
    plan within the cutoff) and ``bound`` (ms of the route: no plan of the
    class within the cutoff is faster; 0 where that says nothing);
    ``done`` whether the child finished (else it was killed at the
    deadline: status ``time-limit``, ``bound`` the last sum it reported);
    the capped model's size; ``stats`` of :func:`split_bound`."""
    small: bool
    status: str = "split-bound"
    bound: float = 0.0
    done: bool = True
    columns: int = 0
    rows: int = 0
    stats: dict = field(default_factory=dict)


class Beside:
    """The running child (:func:`start`) and the cutoff it reads: the parent
    :meth:`tighten` s it when it finds a faster plan, so that the windows'
    sum above it proves that no plan of the class is as fast."""

    def __init__(self, cutoff: float):
        self.shared = mmap.mmap(-1, CUTOFF.size)   # anonymous, shared across the fork
        self.tighten(cutoff)
        self.running: child.Running | None = None

    def tighten(self, cutoff: float) -> None:
        self.shared[:CUTOFF.size] = CUTOFF.pack(cutoff)

    def cutoff(self) -> float:
        return CUTOFF.unpack(self.shared[:CUTOFF.size])[0]

    def cancel(self) -> None:
        if self.running is not None:
            self.running.cancel()


def start(g: Graph, cap: int, window: int | None, cutoff: float, large: int,
          deadline: float, probe_s: float, then) -> Beside:
    """Fork the child: the model of ``g`` under ``cap`` bytes capped at
    ``cutoff`` ms of the route, bounded by its stage windows until
    ``probe_s`` before ``deadline`` (``time.perf_counter()``) where it has
    ``large`` nonzeros or more; where the windows leave no plan within the
    cutoff (or the one :meth:`Beside.tighten` set since),
    ``then(solution, seconds, route)`` (a :class:`Solution` with status
    ``infeasible``, that cutoff) says what that means within the time left.
    :class:`child.ForkFailed` when it cannot be started."""
    bs = Beside(cutoff)

    def work(channel: child.Channel) -> dict:
        form = build(g, cap, window, cutoff=cutoff)
        m = form.milp
        size = {"columns": len(m.lb), "rows": len(m.rows)}
        channel.send("size", size)
        if m.nonzeros < large:
            return {"small": True, **size}
        stats: dict = {}
        ends = deadline - min(GRACE_S, 0.1 * max(0.0, deadline - time.perf_counter()))
        t0 = time.perf_counter()
        bound, none = split_bound(form, ends - probe_s - t0, stats,
                                  progress=lambda b: channel.send("bound", float(b)),
                                  limit=bs.cutoff)
        sol = Solution("split-bound", None, math.inf, bound, time.perf_counter() - t0)
        if none:
            sol = then(Solution("infeasible", None, math.inf, 0.0, sol.solve_s),
                       ends - time.perf_counter(), min(cutoff, bs.cutoff()))
        return {"small": False, "status": sol.status, "bound": sol.bound, "stats": stats,
                **size}
    bs.running = child.start(work)
    return bs


def collect(bs: Beside, deadline: float) -> Split | None:
    """The child's result by ``deadline`` (it is killed then); None where it
    reported nothing at all (not even the model's size)."""
    running = bs.running
    out = running.collect(deadline)
    if out.error is not None:
        raise PolicyError(f"policy optimal: the bound's process failed: {out.error}")
    if out.done:
        return Split(**out.final)
    if "size" not in out.last:
        return None
    took = round(time.perf_counter() - running.started, 3)
    return Split(small=False, status="time-limit", bound=out.last.get("bound", 0.0),
                 done=False, stats={"suffix_s": took}, **out.last["size"])

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
which includes every plan no slower than the one returned.

A model below ``large`` nonzeros is not bounded here: the child reports
its size and ends, and the parent searches it whole as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from snsim.errors import PolicyError
from snsim.graph import Graph
from snsim.policies.optimal import child
from snsim.policies.optimal.formulation import build
from snsim.policies.optimal.suffix import split_bound

GRACE_S = 0.5   # the child's own work ends this long before its deadline


@dataclass
class Split:
    """What the child found: ``small`` (the model is below ``large``
    nonzeros: not bounded), else ``bound`` (ms of the route, a lower bound
    on every plan of the class within the cutoff; 0 where nothing was
    reported) and ``none`` (no plan of the class is within the cutoff);
    ``done`` whether the child finished (else it was killed at the
    deadline, and ``bound`` is the last sum it reported); the model's size;
    ``stats`` of :func:`split_bound`."""
    small: bool
    bound: float = 0.0
    none: bool = False
    done: bool = True
    columns: int = 0
    rows: int = 0
    stats: dict = field(default_factory=dict)


def start(g: Graph, cap: int, window: int | None, cutoff: float, large: int,
          deadline: float) -> child.Running:
    """Fork the child: the model of ``g`` under ``cap`` bytes capped at
    ``cutoff`` ms of the route, bounded by its stage windows until about
    ``deadline`` (``time.perf_counter()``) where it has ``large`` nonzeros
    or more.  :class:`child.ForkFailed` when it cannot be started."""
    def work(channel: child.Channel) -> dict:
        form = build(g, cap, window, cutoff=cutoff)
        m = form.milp
        size = {"columns": len(m.lb), "rows": len(m.rows)}
        channel.send("size", size)
        if m.nonzeros < large:
            return {"small": True, **size}
        stats: dict = {}
        ends = deadline - min(GRACE_S, 0.1 * max(0.0, deadline - time.perf_counter()))
        bound, none = split_bound(form, ends - time.perf_counter(), stats,
                                  progress=lambda b: channel.send("bound", float(b)))
        return {"small": False, "bound": bound, "none": none, "stats": stats, **size}
    return child.start(work)


def collect(running: child.Running, deadline: float) -> Split | None:
    """The child's result by ``deadline`` (it is killed then); None where it
    reported nothing at all (not even the model's size)."""
    out = running.collect(deadline)
    if out.error is not None:
        raise PolicyError(f"policy optimal: the bound's process failed: {out.error}")
    if out.done:
        return Split(**out.final)
    if "size" not in out.last:
        return None
    took = round(time.perf_counter() - running.started, 3)
    return Split(small=False, bound=out.last.get("bound", 0.0), done=False,
                 stats={"suffix_s": took}, **out.last["size"])

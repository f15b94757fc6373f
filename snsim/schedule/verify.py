"""Check that a schedule can run: the rules both executors rely on.

A schedule is rejected (:class:`ScheduleError`, naming the op index) when it

* leaves out, repeats or reorders a route step (``F``/``B``),
* computes a step whose needed tensors are not resident, or are being
  prefetched and not yet waited for,
* uses a tensor after freeing it, or recomputes an output that is resident,
* recomputes the data layer (the input is kept, or copied back from the host),
* frees, offloads or waits for a tensor it does not hold,
* prefetches a tensor that has no host copy, or whose host copy is older than
  a backward step's write into it (a gradient added to in place), or that is
  already on the device,
* runs an optimizer step the trace does not have, or computes anything after
  the optimizer step (it ends the iteration; DESIGN 3a).
"""

from __future__ import annotations

from snsim.graph import Graph
from snsim.schedule.ledger import effects
from snsim.schedule.ops import Schedule


def verify(graph: Graph, schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule; else return None.

    The rules are the ledger's (:func:`snsim.schedule.ledger.walk`); the
    walk's effects are kept on the schedule for the simulator.
    """
    effects(graph, schedule)

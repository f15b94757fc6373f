"""Regression for the engine fix the swap policies needed (committed with it).

A tensor freed while its offload is still copying can be prefetched back
before the copy ends; the old copy's memory is released when the copy ends,
and the new copy stays resident until its own free.
"""

from snsim import synth
from snsim.graph import Graph
from snsim.policies.liveness import liveness_ops
from snsim.schedule import verify
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait
from snsim.sim import simulate


def test_prefetch_while_deferred_free_pending():
    g = Graph(synth.cnn_chain())
    ops = liveness_ops(g)
    t = ("X", 1)   # conv1 output, read again in backward
    k = ops.index(Compute("F", 1)) + 1
    ops[k:k] = [Offload(t), Free(t), Prefetch(t), Wait(t)]
    s = Schedule("test", ops)
    verify(g, s)
    r = simulate(g, s)
    base = simulate(g, Schedule("liveness", liveness_ops(g)))
    assert r.feasible
    size = g.size(t)
    # Both copies coexist until the offload ends, then the old one goes.
    assert r.peak_bytes >= base.peak_bytes
    assert r.d2h_bytes == size and r.h2d_bytes == size
    assert r.timeline[-1].level_bytes == g.trace.static_bytes

"""Polish moves on a plan's swaps (:mod:`snsim.policies.polish` moves its
recomputations): each takes one ``Prefetch`` and returns the plan changed
there, or None where the plan does not have the shape the move needs.  A
helper of the policies, not a policy (the registry skips it).  As for every
move of the polish, the ledger's walk, the capacity and the estimate decide
whether a change is kept (:func:`polish.greedy`); the moves only propose.

* :func:`earlier`: the prefetch issued a few computes sooner (never before
  the free that let it go).  A prefetch issued right before its wait stalls
  for its whole copy (ResNet-50 b32 at 1.25x the lower bound, superneurons'
  plan: ``wait G26``, ``wait X26``, ``wait G16``, 8.4 ms each, 106 MB at
  12.6 GB/s); issued sooner it holds its memory sooner.
* :func:`offload_first`: the tensor's offload issued first among the
  offloads issued with it (the device-to-host engine copies in issue
  order, and a prefetch waits for its tensor's offload): the same plan's
  ``offload G26; offload G34`` after ``B35``, where ``G34`` comes back
  first.
* :func:`recompute`: the prefetch dropped and its wait replaced by the
  recomputation of the layer that made the tensor, the offload dropped too
  when no other prefetch needs the host copy; the layer's inputs must be
  resident there, or are kept from their last free to the recomputation.
* :func:`recompute_chain`: the same where the layer's inputs are gone by
  then: those remade first, back to inputs that are there (a segment
  remade a second time instead of copying its output back).
* :func:`keep`: the swap undone: the tensor kept from its free to the wait
  (the free, prefetch and wait removed; the offload too when no other
  prefetch needs it), where the budget holds it.
"""

from __future__ import annotations

from snsim.graph import Graph
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait

BACKS = (1, 2, 4, 8, 16, 32)   # how many computes sooner a prefetch is tried


def variants(g: Graph, ops: list[Op], p: int, backs: tuple[int, ...] = BACKS):
    """The plans the polish tries for the prefetch at ``p``: kept, recomputed,
    its offload first, then issued ``backs`` computes sooner."""
    yield keep(g, ops, p)
    yield recompute(g, ops, p)
    yield recompute_chain(g, ops, p)
    yield offload_first(ops, p)
    last = None
    for back in backs:
        q = sooner(ops, p, back)
        if q is None or q == last:
            break
        last = q
        yield moved(ops, p, q)


def waits(ops: list[Op]) -> dict[int, int]:
    """Per prefetch's index, the index of the wait that follows it (one walk
    back; a prefetch with no wait after it is left out)."""
    nxt: dict = {}
    out: dict = {}
    for k in range(len(ops) - 1, -1, -1):
        o = ops[k]
        tp = type(o)
        if tp is Wait:
            nxt[o.tensor] = k
        elif tp is Prefetch and o.tensor in nxt:
            out[k] = nxt[o.tensor]
    return out


def wait_of(ops: list[Op], p: int) -> int | None:
    """Index of the wait that follows the prefetch at ``p`` (None if none)."""
    t = ops[p].tensor
    for k in range(p + 1, len(ops)):
        o = ops[k]
        if type(o) is Wait and o.tensor == t:
            return k
    return None


def last_touch(ops: list[Op], p: int) -> int:
    """Index of the last op before ``p`` on the prefetch's tensor (its free), -1 if none."""
    t = ops[p].tensor
    k = p - 1
    while k >= 0 and getattr(ops[k], "tensor", None) != t:
        k -= 1
    return k


def sooner(ops: list[Op], p: int, back: int) -> int | None:
    """Where the prefetch at ``p`` goes when issued ``back`` computes sooner:
    right before that compute, or right after its tensor's last free if that
    comes later; None when it cannot move at all."""
    f = last_touch(ops, p)
    q, seen = p, 0
    while seen < back and q > f + 1:
        q -= 1
        seen += type(ops[q]) is Compute
    if seen < back or type(ops[q]) is not Compute:
        q = max(q, f + 1)
    if q >= p or not any(type(ops[k]) is Compute for k in range(q, p)):
        return None   # nothing runs in between: no earlier in time
    return q


def moved(ops: list[Op], p: int, q: int) -> list[Op]:
    """``ops`` with the op at ``p`` moved to index ``q < p``."""
    return ops[:q] + [ops[p]] + ops[q:p] + ops[p + 1:]


def earlier(ops: list[Op], p: int, back: int) -> list[Op] | None:
    """``ops`` with the prefetch at ``p`` issued ``back`` computes sooner (at
    most right after its tensor's free); None when it cannot move."""
    q = sooner(ops, p, back)
    return None if q is None else moved(ops, p, q)


def offload_first(ops: list[Op], p: int) -> list[Op] | None:
    """``ops`` with the last offload of the prefetch's tensor before ``p``
    issued first of the offloads that come with it (no compute between
    them); None when it is first already or there is none."""
    t = ops[p].tensor
    o = p - 1
    while o >= 0 and not (type(ops[o]) is Offload and ops[o].tensor == t):
        o -= 1
    if o < 0:
        return None
    s = o
    while s > 0 and type(ops[s - 1]) is not Compute:
        s -= 1
    while s < o and type(ops[s]) is not Offload:
        s += 1
    if s == o:
        return None
    return moved(ops, o, s)


def no_other_prefetch(ops: list[Op], p: int) -> bool:
    """True when the prefetch at ``p`` is the only one of its tensor."""
    t = ops[p].tensor
    return not any(type(o) is Prefetch and o.tensor == t
                   for k, o in enumerate(ops) if k != p)


def without_offload(ops: list[Op], out: set, p: int) -> None:
    """Add to ``out`` the offloads of the prefetch's tensor when the prefetch
    at ``p`` is the only one that reads the host copy."""
    if no_other_prefetch(ops, p):
        t = ops[p].tensor
        out.update(k for k, o in enumerate(ops) if type(o) is Offload and o.tensor == t)


def keep(g: Graph, ops: list[Op], p: int) -> list[Op] | None:
    """``ops`` with the swap at ``p`` undone: the tensor's free before it, the
    prefetch and its wait removed (and the offload if nothing else prefetches
    the tensor); None when its last op before ``p`` is not a free or it has
    no wait."""
    f, w = last_touch(ops, p), wait_of(ops, p)
    if f < 0 or type(ops[f]) is not Free or w is None:
        return None
    out = {f, p, w}
    without_offload(ops, out, p)
    return [o for k, o in enumerate(ops) if k not in out]


def recompute(g: Graph, ops: list[Op], p: int) -> list[Op] | None:
    """``ops`` with the prefetch at ``p`` dropped and its wait replaced by a
    recomputation of the layer that made the tensor (the offload dropped if
    nothing else prefetches it; a saved extra the recomputation also makes
    and the plan does not hold there freed right after it).  An input of the
    layer freed since it was last used, and not touched again until the
    wait, is kept to the recomputation instead (its free moved right after
    it).  None when the tensor is not a forward output the layer alone makes,
    has no wait, or the layer is the data layer; the ledger's walk refuses a
    plan whose inputs are not resident."""
    t = ops[p].tensor
    w = wait_of(ops, p)
    if t[0] != "X" or w is None or g.layers[t[1]].kind == "data":
        return None
    step = ("R", t[1])
    made = g.allocs_map.get(step)
    if made is None or t not in made:
        return None
    drop = {p}
    moves = []
    for u in g.needs_map[step]:
        k = last_made_or_touched(g, ops, w, u)
        if k < 0:
            return None
        if type(ops[k]) is Free:   # kept to the recomputation instead
            drop.add(k)
            moves.append(Free(u))
    extra = [u for u in made if u != t and not on_device(g, ops, w, u)]
    without_offload(ops, drop, p)
    return replaced(ops, drop, w, [Compute("R", t[1])] + [Free(u) for u in extra] + moves)


CHAIN = 4   # at most this many layers remade by :func:`recompute_chain`


def recompute_chain(g: Graph, ops: list[Op], p: int) -> list[Op] | None:
    """:func:`recompute` where the layer's inputs are not on the device at the
    wait: those remade too, back to inputs that are (at most ``CHAIN``
    layers, in forward order), each remade input freed once the last of the
    chain that reads it has run, a saved extra the plan does not hold there
    freed right after its recomputation.  ``optimal``'s tail on ResNet-50
    b32 at 1.05x remakes a segment a second time (``R31``, ``R32`` before
    ``B33``) where ``superneurons`` copied its output back.  None when no
    input is missing (:func:`recompute` covers it) or one cannot be remade."""
    t = ops[p].tensor
    w = wait_of(ops, p)
    if t[0] != "X" or w is None:
        return None
    chain: list[int] = []
    remade: set = set()
    there: dict = {}

    def resident(u) -> bool:
        if u not in there:
            there[u] = on_device(g, ops, w, u)
        return there[u]

    def remake(x) -> bool:
        """Remake ``x`` (append its layer to the chain), its missing inputs first."""
        if x in remade:
            return True
        if x[0] != "X" or g.layers[x[1]].kind == "data" or len(chain) >= CHAIN:
            return False
        step = ("R", x[1])
        made = g.allocs_map.get(step)
        if made is None or x not in made:
            return False
        for u in g.needs_map[step]:
            if not (resident(u) or remake(u)):
                return False
        chain.append(x[1])
        remade.add(x)
        return True

    if not remake(t) or len(chain) < 2:
        return None
    last_read: dict = {}
    for n, j in enumerate(chain):
        for u in g.needs_map[("R", j)]:
            last_read[u] = n
    drop = {p}
    without_offload(ops, drop, p)
    at_wait: list[Op] = []
    for n, j in enumerate(chain):
        at_wait.append(Compute("R", j))
        at_wait.extend(Free(u) for u in g.allocs_map[("R", j)]
                       if u[0] != "X" and not resident(u))
        at_wait.extend(Free(u) for u in sorted(remade - {t}) if last_read.get(u) == n)
    return replaced(ops, drop, w, at_wait)


def replaced(ops: list[Op], drop: set, w: int, new: list[Op]) -> list[Op]:
    """``ops`` without the ops at the indices ``drop``, ``new`` in place of the op at ``w``."""
    out: list[Op] = []
    for k, o in enumerate(ops):
        if k == w:
            out.extend(new)
        elif k not in drop:
            out.append(o)
    return out


def on_device(g: Graph, ops: list[Op], w: int, u) -> bool:
    """Whether tensor ``u`` is on the device at op ``w``: made or named before it,
    and not freed since."""
    k = last_made_or_touched(g, ops, w, u)
    return k >= 0 and type(ops[k]) is not Free


def last_made_or_touched(g: Graph, ops: list[Op], w: int, u) -> int:
    """Index of the last op before ``w`` that names tensor ``u`` or computes it
    (-1 if none): ``u`` is on the device at ``w`` unless that op is a free."""
    allocs = g.allocs_map
    k = w - 1
    while k >= 0:
        o = ops[k]
        if getattr(o, "tensor", None) == u or (type(o) is Compute and u in allocs[o.step]):
            return k
        k -= 1
    return -1

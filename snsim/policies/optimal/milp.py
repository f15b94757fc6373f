"""A sparse MILP under construction (columns, then rows), for :mod:`.solve`."""

from __future__ import annotations

import math

MiB = float(1 << 20)   # memory rows are in MiB: better conditioned than bytes


class Milp:
    """A sparse MILP under construction: columns, then rows of (index, coefficient)."""

    def __init__(self):
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[list[int], list[float], float, float]] = []

    def var(self, lb: float = 0.0, ub: float = 1.0, cost: float = 0.0,
            integer: bool = True) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lb) - 1

    def row(self, terms: dict[int, float], lo: float = -math.inf, hi: float = math.inf) -> None:
        idx = [k for k, v in terms.items() if v != 0.0]
        self.rows.append((idx, [terms[k] for k in idx], lo, hi))

    def relaxed(self) -> "Milp":
        """The LP relaxation: the same columns and rows (shared, not copied), none
        of them integer."""
        lp = Milp()
        lp.lb, lp.ub, lp.cost, lp.rows = self.lb, self.ub, self.cost, self.rows
        lp.integer = [False] * len(self.lb)
        return lp

    @property
    def nonzeros(self) -> int:
        return sum(len(r[0]) for r in self.rows)

    @property
    def n_binary(self) -> int:
        return sum(self.integer)


def add(terms: dict[int, float], var: int | None, coef: float) -> None:
    if var is not None:
        terms[var] = terms.get(var, 0.0) + coef


def running_sums(m: Milp, parts):
    """Per ``(key, terms)`` of ``parts`` in order, a continuous column equal to
    the sum of the terms (``{column: coefficient}``) of the parts up to it:
    (key, column), its defining row added before it is yielded.  Leading parts
    without terms make no column and are not yielded."""
    acc = None
    for key, terms in parts:
        if not terms and acc is None:
            continue
        a = m.var(0.0, math.inf, integer=False)
        row = {a: 1.0}
        add(row, acc, -1.0)
        for v, c in terms.items():
            add(row, v, -c)
        m.row(row, 0.0, 0.0)
        yield key, a
        acc = a

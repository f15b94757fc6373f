"""The one place that fixes how each policy looks in every plot."""

from __future__ import annotations

_STYLE = {
    "none": ("#7f7f7f", "x"), "liveness": ("#1f77b4", "o"), "vdnn-all": ("#ff7f0e", "v"),
    "vdnn-conv": ("#ffbb78", "^"), "utp": ("#2ca02c", "s"), "recompute-speed": ("#9467bd", "<"),
    "recompute-memory": ("#c5b0d5", ">"), "cost-aware": ("#8c564b", "D"),
    "sqrt-n": ("#e377c2", "P"), "superneurons": ("#d62728", "*"), "dtr": ("#17becf", "h"),
}
_FALLBACK = ["#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39"]


def color(policy: str) -> str:
    if policy in _STYLE:
        return _STYLE[policy][0]
    return _FALLBACK[sum(map(ord, policy)) % len(_FALLBACK)]


def marker(policy: str) -> str:
    return _STYLE.get(policy, ("", "o"))[1]

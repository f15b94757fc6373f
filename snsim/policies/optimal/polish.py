"""The polish ``optimal`` applies to the plans it returns: :mod:`snsim.policies.polish`
(shared with ``superneurons``, which polishes its own plan)."""

from snsim.policies.polish import drop, greedy, polish, stages, swap, trim, undo, variants

__all__ = ["drop", "greedy", "polish", "stages", "swap", "trim", "undo", "variants"]

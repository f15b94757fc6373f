"""snsim: trace-driven simulation of GPU memory management for DNN training.

The data path is ``trace -> graph -> policy (schedule) -> simulator``; see
``DESIGN.md`` for the contracts.  Importing snsim has no side effects and does
not import torch.
"""

__version__ = "0.1.0"

from snsim.errors import SnsimError, TraceError

__all__ = ["__version__", "SnsimError", "TraceError"]

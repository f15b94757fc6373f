"""Exceptions that carry one user-facing line.

The CLI prints ``str(err)`` of a :class:`SnsimError` and exits 2; anything
else is a bug and keeps its traceback.
"""


class SnsimError(Exception):
    """A problem with the user's input, reported as one clear line."""


class TraceError(SnsimError):
    """A trace file that cannot be read or breaks the trace contract."""


class ScheduleError(SnsimError):
    """A schedule that breaks the execution rules (see ``schedule.verify``)."""


class PolicyError(SnsimError):
    """An unknown policy or one that cannot plan for the given trace."""


def require_torch(command: str) -> None:
    """Raise a one-line :class:`SnsimError` if PyTorch is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SnsimError(f"{command} needs PyTorch: pip install 'snsim[torch]' "
                         "(torch==2.13.0)") from None

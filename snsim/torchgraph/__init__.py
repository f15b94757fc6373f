"""The torch layer both the profiler and the executor stand on (needs torch).

:mod:`capture` turns a model into trace layers with torch.fx (layer kinds
from :mod:`kinds`); :mod:`program` runs the same graph one layer at a time;
:mod:`clock` times callables on the device they run on.  ``snsim.profile``
and ``snsim.execute`` import this package; it imports neither of them.
Nothing here is imported by ``import snsim``.
"""

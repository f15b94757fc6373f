"""The profiler: PyTorch model -> ``snsim.trace/1`` trace (issue 3).

Two modes share one graph capture (:mod:`snsim.profile.capture`):

* measured (:mod:`snsim.profile.measure`): per-layer times from a real run
  on ``cpu`` or ``cuda``;
* modeled (:mod:`snsim.profile.modeled`): the model runs on the ``meta``
  device (shapes only, no memory) and times come from a roofline on a
  device preset (:mod:`snsim.profile.devices`).

Byte fields are identical in both modes: they come from the same capture.
This package imports torch lazily (inside the submodules), so ``import
snsim.profile`` and ``snsim --help`` work without torch.
"""

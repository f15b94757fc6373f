"""The profiler: PyTorch model -> ``snsim.trace/1`` trace (issue 3).

Two modes share one graph capture (:mod:`snsim.torchgraph.capture`):

* measured (:mod:`snsim.profile.measure`): per-layer times from a real run
  on ``cpu`` or ``cuda``;
* modeled (:mod:`snsim.profile.modeled`): the model runs on the ``meta``
  device (shapes only, no memory) and times come from a roofline on a
  device preset (:mod:`snsim.devices`).

Byte fields are identical in both modes: they come from the same capture.
Models: the zoo (:mod:`snsim.profile.zoo`) or any ``package.module:function``
returning an ``nn.Module`` (or ``(module, input_shape)``).

    snsim profile --model resnet18 --batch 8 --input-shape 3,64,64 --out r18.json
    snsim profile --model resnet-2500 --batch 32 --device-model k40c --out r2500.json
    snsim profile --model gpt:layers=4,heads=4,width=256 --batch 8 --input-shape 128 ...
    snsim profile --list-models | --list-device-models

From Python: ``snsim.profile.profiler.profile(...)`` returns the validated
trace document, ``profiler.write(doc, path)`` writes it whole.

This package imports torch lazily (inside the submodules), so ``import
snsim.profile`` and ``snsim --help`` work without torch.
"""

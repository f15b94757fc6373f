"""Importers: other tools' records turned into snsim inputs.

``dtr_log``: the DTR authors' op logs (simrd's input) as forward-only
traces; ``torch_snapshot``: PyTorch's CUDA memory snapshots as a measured
ground truth.  Torch-free: both read plain files.
"""

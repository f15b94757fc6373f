"""The real executor: run a schedule layer by layer in PyTorch (needs torch).

:mod:`program` turns a model into one callable per trace layer (the same
torch.fx capture the profiler uses, so layer ids agree); :mod:`executor`
obeys a schedule's ops on those layers with an explicit store of live
tensors; :mod:`memory` measures real peak memory; :mod:`baselines` runs what
a user would use instead (plain autograd, ``torch.utils.checkpoint``,
``save_on_cpu``).  Nothing here is imported by ``import snsim``.
"""

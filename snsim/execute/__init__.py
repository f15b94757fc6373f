"""The real executor: run a schedule layer by layer in PyTorch (needs torch).

:mod:`executor` obeys a schedule's ops on the per-layer callables of
:class:`snsim.torchgraph.program.Program` (the same torch.fx capture the
profiler uses, so layer ids agree) with an explicit store of live tensors;
:mod:`memory` measures real peak memory; :mod:`baselines` runs what a user
would use instead (plain autograd, ``torch.utils.checkpoint``,
``save_on_cpu``).  This package never imports :mod:`snsim.profile` (the
profiler imports it, to time steps as the executor runs them).  Nothing
here is imported by ``import snsim``.
"""

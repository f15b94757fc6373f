"""Validation: predicted (simulator) against measured (real executor), per case.

:mod:`run` validates one (model, batch, policy, budget) case; :mod:`suite`
runs a declarative TOML suite and writes CSV, markdown and a scatter plot;
:mod:`baselines` measures what a user would run instead.  Needs torch.
"""

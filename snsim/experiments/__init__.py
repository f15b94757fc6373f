"""Paper-style experiments (``snsim experiment NAME``): each returns a tidy table
and draws its figure from that table; :mod:`snsim.experiments.base` writes the
CSV, PNG, PDF and resolved configuration.  The registry below is the one list."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    module: str     # snsim.experiments.<module> defines run_<name with _ for ->
    summary: str
    paper: bool = True   # one of the paper's figures: run by ``snsim experiment all``
    needs: tuple[tuple[str, str], ...] = ()   # (module, what installs it), checked first

    def check(self) -> None:
        """One line (:class:`SnsimError`) if a module the experiment needs is
        missing, or its module's ``check_<name>()`` finds an input missing (the
        validation report, the shipped traces): before any output is made."""
        import importlib.util

        from snsim.errors import SnsimError

        for module, extra in self.needs:
            if importlib.util.find_spec(module) is None:
                raise SnsimError(f"{self.name} needs {module}: pip install '{extra}'")
        mod = importlib.import_module(f"snsim.experiments.{self.module}")
        inputs = getattr(mod, "check_" + self.name.replace("-", "_"), None)
        if inputs is not None:
            inputs()

    def load(self):
        mod = importlib.import_module(f"snsim.experiments.{self.module}")
        return getattr(mod, "run_" + self.name.replace("-", "_"))


EXPERIMENTS = {e.name: e for e in (
    Entry("peak-memory", "memory", "peak memory per network under none, liveness, utp, "
          "cost-aware, superneurons; lower bound marked (12 GB K40c model)"),
    Entry("memory-timeline", "timeline", "memory over one iteration per policy, ResNet-50"),
    Entry("max-depth", "capacity", "deepest ResNet per policy in 12 GB (K40c model), ratio "
          "to liveness, time per iteration at each policy's deepest"),
    Entry("max-batch", "capacity", "largest batch per network per policy in 12 GB"),
    Entry("throughput", "throughput", "samples/s against batch per policy; speed-, memory- "
          "and cost-aware recomputation side by side (extra compute, peak)"),
    Entry("overlap", "timeline", "Gantt of the compute, H2D and D2H streams under utp "
          "(stalls visible)"),
    Entry("link-whatif", "throughput", "utp and superneurons throughput against host link "
          "bandwidth (PCIe 3, 4, 5, a 450 GB/s coherent link)"),
    Entry("fidelity", "fidelity", "predicted against measured, from the validation suite's "
          "report"),
    Entry("budget-sweep", "memory", "time over compute against budget over lower bound, "
          "every policy, each network"),
    Entry("optimality-gap", "optimality", "each heuristic's time over the optimum's (MILP, "
          "HiGHS) with its proven gap, every shipped K40c trace, 1.05x-3x the lower bound "
          "(not in 'all': needs snsim[optimal], about an hour)", paper=False,
          needs=(("highspy", "snsim[optimal]"),)),
)}


def names() -> list[str]:
    return list(EXPERIMENTS)


def paper_names() -> list[str]:
    """What ``snsim experiment all`` runs: the paper's figures."""
    return [e.name for e in EXPERIMENTS.values() if e.paper]

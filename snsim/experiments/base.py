"""What every experiment shares: its options, its outcome, and writing the outcome.

An experiment is ``run_NAME(opts) -> Outcome``: a tidy pandas table (one row per
evaluated point, with its configuration) and a function that draws the figure
from that table alone.  :func:`save` writes ``NAME.csv``, ``NAME.png``,
``NAME.pdf`` and ``NAME.config.json`` (the resolved configuration, the points'
cache location and the versions) into the output folder, each file whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from snsim.sweep import TraceSpec

GiB = 2**30
PAPER_POLICIES = ("none", "liveness", "utp", "cost-aware", "superneurons")
# The paper's networks at the batch its figures use (AlexNet 128, the rest 16 here).
NETWORKS = {"alexnet": 128, "vgg16": 16, "resnet50": 16, "resnet101": 16, "resnet152": 16,
            "inception_v4": 16, "densenet121": 16}
QUICK_NETWORKS = {"resnet50": 16, "resnet101": 16}  # torch-free (shape arithmetic)


@dataclass(frozen=True)
class Options:
    out: Path
    quick: bool = False
    workers: int = 2
    scheduler: str | None = None
    progress: bool = False
    device_model: str = "k40c"
    parquet: bool = False   # also NAME.parquet (needs pyarrow: the `parquet` extra)

    @property
    def cache(self) -> Path:
        return self.out / "cache"


@dataclass
class Outcome:
    table: Any                                # pandas.DataFrame
    draw: Callable[[Any, Any], Any]           # draw(table, plt) -> figure
    config: dict[str, Any] = field(default_factory=dict)
    summary: str = ""                         # printed after the run (a few lines)


def checkout_file(rel: Path, found: Callable[[Path], bool] = Path.is_file) -> Path | None:
    """``rel`` in the current folder, else in the source checkout snsim runs from,
    where ``found`` holds (None: in neither): the inputs an experiment reads
    that pip does not install (the validation report, the shipped traces)."""
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if found(base / rel):
            return base / rel
    return None


def network(name: str, batch: int, device_model: str) -> TraceSpec:
    return TraceSpec("model", model=name, batch=batch, device_model=device_model)


def networks(opts: Options) -> dict[str, int]:
    return QUICK_NETWORKS if opts.quick else NETWORKS


def save(name: str, outcome: Outcome, opts: Options) -> list[Path]:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from snsim.fileio import provenance, write_atomic, write_json, write_with

    prov = provenance({"experiment": name, "quick": opts.quick, "workers": opts.workers,
                       "scheduler": opts.scheduler, "device_model": opts.device_model,
                       "cache": str(opts.cache), **outcome.config})
    paths = [opts.out / f"{name}.{ext}" for ext in ("csv", "png", "pdf", "config.json")]
    write_atomic(paths[0], outcome.table.to_csv(index=False))
    if opts.parquet:
        paths.append(opts.out / f"{name}.parquet")
        write_with(paths[-1], lambda tmp: outcome.table.to_parquet(tmp, index=False))
    fig = outcome.draw(outcome.table, plt)
    fig.text(0.995, 0.005, f"snsim experiment {name}{' --quick' if opts.quick else ''}",
             ha="right", va="bottom", fontsize=6, color="#888888")
    meta = {"Software": "snsim", "Description": json.dumps(prov)}
    write_with(paths[1], lambda tmp: fig.savefig(tmp, format="png", dpi=120, metadata=meta))
    write_with(paths[2], lambda tmp: fig.savefig(
        tmp, format="pdf", metadata={"Creator": "snsim", "Subject": json.dumps(prov)}))
    plt.close(fig)
    write_json(paths[3], {**prov, "columns": list(outcome.table.columns),
                          "rows": len(outcome.table)})
    return paths

"""Small multiples: one panel per network, a shared legend on the right."""

from __future__ import annotations


def panels(plt, n: int, legend_in: float = 1.6, cols_max: int = 4):
    """A figure with ``n`` panels (at most ``cols_max`` a row) and ``legend_in``
    inches on the right for the legend: (figure, axes list)."""
    cols = min(cols_max, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + legend_in + 0.4, 3.2 * rows + 0.4),
                             squeeze=False)
    return fig, list(axes.flat)


def budget_axes(ax, title: str) -> None:
    """A panel of time over compute against budget over the lower bound."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("budget / lower bound", fontsize=8)
    ax.set_ylabel("iteration / compute time", fontsize=8)


def finish(fig, axes: list, used: int, title: str, legend_in: float = 1.6):
    """Blank the unused panels, the first panel's legend in the right ``legend_in``
    inches (as given to :func:`panels`), the title."""
    for ax in axes[used:]:
        ax.axis("off")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.suptitle(title)
    width = fig.get_size_inches()[0]
    fig.tight_layout(rect=(0, 0, 1 - legend_in / width, 1))
    return fig

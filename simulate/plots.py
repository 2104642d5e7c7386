"""PNG figures of a simulation (matplotlib's Agg renderer; no display, no pyplot state).

* ``estimates_<mechanism>_eps<e>_n<n>.png``: truth against each estimate (categories);
* ``heatmaps_<mechanism>_eps<e>_n<n>.png``: truth, noisy reports and reconstructions
  on the grid (locations);
* ``error_vs_epsilon_<mechanism>.png``: the error of each method against epsilon,
  one panel per number of users (total variation, and EMD for locations).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from shared.spec import GRID_MECHANISMS
from simulate.runner import NOISY, ResultRow, SimulationResult, Snapshot

# Beyond this many categories the estimates are drawn as points sorted by truth, not bars.
MAX_BARS = 40
_DPI = 110
# matplotlib's default cycle ("tab10"), given by name so colours do not depend on the order
# in which methods happen to be drawn.
_PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
)
METHOD_COLOURS = {
    "ibu": "tab:blue",
    "inversion": "tab:orange",
    "clip": "tab:green",
    "projection": "tab:red",
    "mle": "tab:purple",
    NOISY: "tab:gray",
}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _stem(snapshot: Snapshot) -> str:
    return f"{snapshot.spec.mechanism}_eps{snapshot.spec.epsilon:.6g}_n{snapshot.n}"


def _title(snapshot: Snapshot) -> str:
    unit = "/m" if snapshot.spec.mechanism in GRID_MECHANISMS else ""
    return (
        f"{snapshot.spec.mechanism}, epsilon = {snapshot.spec.epsilon:.4g}{unit}, n = {snapshot.n}"
    )


def plot_estimates(snapshot: Snapshot, labels: Sequence[str], path: Path) -> Path:
    """Truth and every estimate over the categories."""
    k = snapshot.truth.size
    methods = [m for m in snapshot.estimates if m != NOISY]
    figure = Figure(figsize=(max(6.0, min(16.0, 0.35 * k + 3)), 4.2), dpi=_DPI)
    axes = figure.add_subplot()
    colours = {"truth": "black", **method_colours(methods)}
    if k <= MAX_BARS:
        series = [("truth", snapshot.truth)] + [(m, snapshot.estimates[m]) for m in methods]
        width = 0.8 / len(series)
        x = np.arange(k)
        for i, (name, values) in enumerate(series):
            offset = (i - (len(series) - 1) / 2) * width
            axes.bar(x + offset, values, width, label=name, color=colours[name])
        axes.set_xticks(x, labels, rotation=90 if k > 12 else 0, fontsize=8)
    else:
        order = np.argsort(-snapshot.truth)
        x = np.arange(k)
        axes.plot(x, snapshot.truth[order], color="black", linewidth=2, label="truth")
        for m in methods:
            axes.plot(x, snapshot.estimates[m][order], ".", markersize=3, label=m, color=colours[m])
        axes.set_xlabel("categories, by true frequency")
    axes.axhline(0, color="grey", linewidth=0.5)
    axes.set_ylabel("frequency")
    axes.set_title(_title(snapshot))
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_heatmaps(snapshot: Snapshot, rows: int, cols: int, path: Path) -> Path:
    """Truth, noisy reports and each non-negative reconstruction on the grid (north up)."""
    panels = [("truth", snapshot.truth), ("noisy reports", snapshot.reports)]
    panels += [
        (m, v)
        for m, v in snapshot.estimates.items()
        if m not in (NOISY, "inversion") and v.min() >= 0
    ]
    vmax = max(float(snapshot.truth.max()), 1e-12)
    figure = Figure(figsize=(3.2 * len(panels), 3.6), dpi=_DPI)
    for i, (name, values) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), i + 1)
        image = axes.imshow(
            values.reshape(rows, cols), origin="lower", cmap="viridis", vmin=0, vmax=vmax
        )
        axes.set_title(name, fontsize=10)
        axes.set_xticks([])
        axes.set_yticks([])
    figure.colorbar(image, ax=figure.axes, shrink=0.8, label="share of users per cell")
    figure.suptitle(_title(snapshot), fontsize=10)
    figure.savefig(path)
    return path


def method_colours(methods: Sequence[str]) -> dict[str, str]:
    """One colour per method, the same in every panel and every figure.

    The known methods have colours of their own; any other method takes the
    next unused colour of the palette, in name order, so a panel that lacks a
    method (inversion has no EMD) never shifts the colours of the others.
    """
    colours = {m: METHOD_COLOURS[m] for m in methods if m in METHOD_COLOURS}
    spare = [c for c in _PALETTE if c not in METHOD_COLOURS.values()]
    for i, method in enumerate(sorted(set(methods) - set(METHOD_COLOURS))):
        colours[method] = spare[i % len(spare)]
    return colours


def epsilon_axis_label(mechanism: str) -> str:
    """The epsilon axis's title with its unit (per metre for locations)."""
    if mechanism in GRID_MECHANISMS:
        return "epsilon (per metre, log scale)"
    return "epsilon (per report, log scale)"


def error_vs_epsilon_figure(rows: Sequence[ResultRow], *, location: bool) -> Figure:
    """Error against epsilon per method, one panel per n (and per metric for locations).

    Each method has one colour and marker in every panel (:func:`method_colours`),
    and every panel has its own legend of the methods it shows.
    """
    ns = sorted({row.n for row in rows})
    metrics = [("tv", "total variation", "total variation")]
    if location:
        metrics.append(("emd_m", "EMD (m)", "EMD"))
    figure = Figure(figsize=(4.6 * len(ns), 3.6 * len(metrics)), dpi=_DPI)
    grid = figure.subplots(len(metrics), len(ns), squeeze=False)
    methods = list(dict.fromkeys(row.method for row in rows))
    colours = method_colours(methods)
    markers = {m: _MARKERS[i % len(_MARKERS)] for i, m in enumerate(sorted(methods))}
    mechanisms = {row.mechanism for row in rows}
    x_label = epsilon_axis_label(mechanisms.pop() if len(mechanisms) == 1 else "")
    for j, n in enumerate(ns):
        for i, (metric, label, short) in enumerate(metrics):
            axes = grid[i][j]
            for method in methods:
                points = sorted(
                    (row.epsilon, getattr(row.scores, metric))
                    for row in rows
                    if row.n == n and row.method == method
                )
                points = [(e, v) for e, v in points if v is not None]
                if points:
                    axes.plot(
                        *zip(*points, strict=True),
                        marker=markers[method],
                        color=colours[method],
                        label=method,
                    )
            axes.set_xscale("log")
            for axis_ticks in (axes.xaxis.set_major_formatter, axes.xaxis.set_minor_formatter):
                axis_ticks(FuncFormatter(lambda value, _: f"{value:g}"))
            axes.set_xlabel(x_label)
            axes.set_ylabel(label)
            axes.set_title(f"n = {n}", fontsize=10)
            axes.grid(True, alpha=0.3)
            drawn = {line.get_label() for line in axes.lines}
            if drawn:
                missing = [m for m in methods if m not in drawn]
                title = f"no {short}: {', '.join(missing)}" if missing else None
                axes.legend(fontsize=8, title=title, title_fontsize=8)
    figure.tight_layout()
    return figure


def plot_error_vs_epsilon(rows: Sequence[ResultRow], path: Path, *, location: bool) -> Path:
    """:func:`error_vs_epsilon_figure`, written to ``path``."""
    error_vs_epsilon_figure(rows, location=location).savefig(path)
    return path


def write_plots(result: SimulationResult, directory: str | Path) -> list[Path]:
    """Every figure that applies to the result, in ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    population = result.population
    written = []
    for snapshot in result.snapshots:
        if population.grid is not None:
            path = directory / f"heatmaps_{_stem(snapshot)}.png"
            written.append(
                plot_heatmaps(snapshot, population.grid.rows, population.grid.cols, path)
            )
        else:
            path = directory / f"estimates_{_stem(snapshot)}.png"
            written.append(plot_estimates(snapshot, population.labels, path))
    for mechanism in dict.fromkeys(row.mechanism for row in result.rows):
        rows = [row for row in result.rows if row.mechanism == mechanism]
        if len({row.epsilon for row in rows}) > 1:
            path = directory / f"error_vs_epsilon_{mechanism}.png"
            written.append(plot_error_vs_epsilon(rows, path, location=population.grid is not None))
    return written

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

from aggregator.simulate.runner import NOISY, ResultRow, SimulationResult, Snapshot

# Beyond this many categories the estimates are drawn as points sorted by truth, not bars.
MAX_BARS = 40
_DPI = 110


def _stem(snapshot: Snapshot) -> str:
    return f"{snapshot.spec.mechanism}_eps{snapshot.spec.epsilon:.6g}_n{snapshot.n}"


def _title(snapshot: Snapshot) -> str:
    unit = "/m" if snapshot.spec.mechanism == "planar_laplace" else ""
    return (
        f"{snapshot.spec.mechanism}, epsilon = {snapshot.spec.epsilon:.4g}{unit}, n = {snapshot.n}"
    )


def plot_estimates(snapshot: Snapshot, labels: Sequence[str], path: Path) -> Path:
    """Truth and every estimate over the categories."""
    k = snapshot.truth.size
    methods = [m for m in snapshot.estimates if m != NOISY]
    figure = Figure(figsize=(max(6.0, min(16.0, 0.35 * k + 3)), 4.2), dpi=_DPI)
    axes = figure.add_subplot()
    if k <= MAX_BARS:
        series = [("truth", snapshot.truth)] + [(m, snapshot.estimates[m]) for m in methods]
        width = 0.8 / len(series)
        x = np.arange(k)
        for i, (name, values) in enumerate(series):
            axes.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
        axes.set_xticks(x, labels, rotation=90 if k > 12 else 0, fontsize=8)
    else:
        order = np.argsort(-snapshot.truth)
        x = np.arange(k)
        axes.plot(x, snapshot.truth[order], color="black", linewidth=2, label="truth")
        for m in methods:
            axes.plot(x, snapshot.estimates[m][order], ".", markersize=3, label=m)
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


def plot_error_vs_epsilon(rows: Sequence[ResultRow], path: Path, *, location: bool) -> Path:
    """Error against epsilon per method, one panel per n (and per metric for locations)."""
    ns = sorted({row.n for row in rows})
    metrics = [("tv", "total variation")] + ([("emd_m", "EMD (m)")] if location else [])
    figure = Figure(figsize=(4.6 * len(ns), 3.6 * len(metrics)), dpi=_DPI)
    grid = figure.subplots(len(metrics), len(ns), squeeze=False)
    methods = list(dict.fromkeys(row.method for row in rows))
    for j, n in enumerate(ns):
        for i, (metric, label) in enumerate(metrics):
            axes = grid[i][j]
            for method in methods:
                points = sorted(
                    (row.epsilon, getattr(row.scores, metric))
                    for row in rows
                    if row.n == n and row.method == method
                )
                points = [(e, v) for e, v in points if v is not None]
                if points:
                    axes.plot(*zip(*points, strict=True), marker="o", label=method)
            axes.set_xscale("log")
            axes.set_xlabel("epsilon")
            axes.set_ylabel(label)
            axes.set_title(f"n = {n}", fontsize=10)
            axes.grid(True, alpha=0.3)
    grid[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
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

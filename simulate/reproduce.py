"""Planar Laplace versus k-RR on Gowalla check-ins, both reconstructed by IBU, compared by EMD.

The setting of the IBU literature (ElSalamouny and Palamidessi, EuroS&P 2020;
Palamidessi et al.): check-ins in a 3 km x 3 km area of a city on a 20 x 20
grid of 150 m cells; planar Laplace with epsilon = ln(2) per 100 m and k-RR
over the 400 cells with epsilon = ln(8) (a region campaign, as the service
collects it); every check-in is one user's report;
the distribution of check-ins over the cells is reconstructed by IBU with a
fixed number of iterations (and, for comparison, with the cross-validated
stopping the aggregator uses), and scored by the earth mover's distance to
the true distribution. ``ldp-simulate reproduce`` runs it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shared.geo import EARTH_RADIUS_M, Grid, Region
from shared.spec import CampaignSpec
from simulate.populations import Population
from simulate.runner import SimulationResult, simulate

SIDE_M = 3000.0
CELL_M = 150.0
PLANAR_EPSILON = math.log(2) / 100  # per metre
KRR_EPSILON = math.log(8)
# Cells of 1,000 km: reading the points to find their middle needs no fine grid.
BOUNDING_CELL_M = 1.0e6
EPSILON_LABELS = {"planar_laplace": "ln(2)/100 per m", "krr": "ln(8)"}


@dataclass(frozen=True)
class ReproductionRow:
    """One line of the comparison: a mechanism, an estimator, and its EMD and TV over the repeats."""

    mechanism: str
    epsilon: str
    estimator: str
    ibu_iterations: float | None
    emd_m: float
    emd_m_sd: float
    tv: float
    tv_sd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reproduction:
    """The comparison's rows, and what it ran on."""

    data: str
    check_ins: int
    region: Region
    grid: Grid
    repeats: int
    rows: list[ReproductionRow]
    plots: list[Path]

    def to_dict(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "check_ins": self.check_ins,
            "region": self.region.to_dict(),
            "grid": {"rows": self.grid.rows, "cols": self.grid.cols, "cell_size_m": CELL_M},
            "repeats": self.repeats,
            "results": [row.to_dict() for row in self.rows],
            "plots": [str(path) for path in self.plots],
        }


def square_region(lat_centre: float, lon_centre: float, side_m: float) -> Region:
    """A ``side_m`` x ``side_m`` square in the grid's projection, centred on a point."""
    m_per_deg_lat = EARTH_RADIUS_M * math.pi / 180
    m_per_deg_lon = m_per_deg_lat * math.cos(math.radians(lat_centre))
    half_lat = side_m / 2 / m_per_deg_lat
    half_lon = side_m / 2 / m_per_deg_lon
    return Region(
        round(lat_centre - half_lat, 7),
        round(lat_centre + half_lat, 7),
        round(lon_centre - half_lon, 7),
        round(lon_centre + half_lon, 7),
    )


def data_region(path: str | Path) -> Region:
    """The 3 km square centred on the middle of the bounding box of the points of ``path``.

    ``path`` is a CSV file with ``lat`` and ``lon`` columns, checked as any
    points file is (:meth:`Population.from_csv_points`).
    """
    points = Population.from_csv_points(path, cell_size_m=BOUNDING_CELL_M).points
    if points is None:
        raise ValueError(f"{path}: no points")
    lat = float(points[:, 0].min() + points[:, 0].max()) / 2
    lon = float(points[:, 1].min() + points[:, 1].max()) / 2
    # A hair under 3 km, so that rounding cannot make the grid 21 cells wide.
    return square_region(lat, lon, SIDE_M - 0.01)


def _specs(region: Region, grid: Grid) -> list[CampaignSpec]:
    common = {"title": "Gowalla reproduction"}
    planar = {
        **common,
        "id": "gowalla-planar",
        "mechanism": "planar_laplace",
        "epsilon": PLANAR_EPSILON,
        "region": region.to_dict(),
        "cell_size_m": CELL_M,
    }
    krr = {
        **common,
        "id": "gowalla-krr",
        "mechanism": "krr",
        "epsilon": KRR_EPSILON,
        "region": region.to_dict(),
        "cell_size_m": CELL_M,
    }
    return [CampaignSpec.from_dict(planar), CampaignSpec.from_dict(krr)]


# The rows other than IBU's: the raw reports, and the service's default for a region campaign
# of k-RR (Norm-Sub smoothed over neighbouring cells).
ESTIMATOR_NAMES = {
    "noisy": "noisy reports as they are",
    "smoothed_projection": "the service's default (Norm-Sub smoothed over neighbouring cells)",
}


def _rows(result: SimulationResult, stopping: str) -> list[ReproductionRow]:
    rows = []
    for row in result.rows:
        mean, sd = row.scores, row.scores_sd
        if mean.emd_m is None or sd.emd_m is None:
            raise ValueError(f"no earth mover's distance for {row.mechanism} {row.method}")
        rows.append(
            ReproductionRow(
                mechanism=row.mechanism,
                epsilon=EPSILON_LABELS[row.mechanism],
                estimator=ESTIMATOR_NAMES.get(row.method, f"IBU, {stopping}"),
                ibu_iterations=row.n_iter,
                emd_m=mean.emd_m,
                emd_m_sd=sd.emd_m,
                tv=mean.tv,
                tv_sd=sd.tv,
            )
        )
    return rows


def reproduce_gowalla(
    csv_path: str | Path,
    *,
    repeats: int = 20,
    iterations: int = 500,
    seed: int = 0,
    plot_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Reproduction:
    """Run the comparison on the check-ins of ``csv_path``.

    Parameters
    ----------
    csv_path
        Check-ins with a header and ``lat``, ``lon`` columns; every row is one report.
    repeats
        Noise draws per configuration (the rows give mean and standard deviation).
    iterations
        IBU's fixed number of iterations; a cross-validated run is added for comparison.
    seed
        Seed of the noise (the users are the data set's rows, each once).
    plot_dir
        When given, the figures of the fixed-iteration runs are written there.
    log
        Called with a line of progress (timings, files written), e.g. to print on stderr.

    Returns
    -------
    Reproduction
        Seven rows: for each mechanism, IBU with fixed iterations, the noisy
        reports as they are, and IBU with cross-validated stopping; for k-RR (a region
        campaign over the cells, as the service collects it) also the service's default.

    Raises
    ------
    ValueError
        If the check-ins do not span a 20 x 20 grid of 150 m cells, or a row is
        malformed (:class:`simulate.PopulationError` names it).
    """
    region = data_region(csv_path)
    grid = Grid(region, CELL_M)
    if (grid.rows, grid.cols) != (20, 20):
        raise ValueError(f"the check-ins span a {grid.rows} x {grid.cols} grid, not 20 x 20")
    population = Population.from_csv_points(csv_path, grid)
    rows: list[ReproductionRow] = []
    plots: list[Path] = []
    for spec in _specs(region, grid):
        for stopping, fixed in (("fixed", iterations), ("cross-validated", None)):
            started = time.perf_counter()
            result = simulate(
                population,
                [spec],
                [None],
                methods=("ibu", "noisy") if fixed else _cross_validated_methods(spec),
                repeats=repeats,
                seed=seed,
                ibu_iterations=fixed,
                progress=False,
            )
            rows += _rows(result, stopping)
            if plot_dir is not None and fixed:
                from simulate.plots import write_plots

                plots += write_plots(result, plot_dir)
            if log is not None:
                log(f"({spec.mechanism}, {stopping}: {time.perf_counter() - started:.1f} s)")
    return Reproduction(
        data=Path(csv_path).name,
        check_ins=population.n_rows or 0,
        region=region,
        grid=grid,
        repeats=repeats,
        rows=rows,
        plots=plots,
    )


def _cross_validated_methods(spec: CampaignSpec) -> tuple[str, ...]:
    """IBU with cross-validated stopping, and for k-RR the service's default beside it."""
    return ("ibu", "smoothed_projection") if spec.mechanism == "krr" else ("ibu",)


def format_reproduction(reproduction: Reproduction) -> str:
    """The comparison as the markdown table of docs/simulation.md, after two lines of setting."""
    lines = [
        f"data: {reproduction.data}, {reproduction.check_ins} check-ins, "
        f"region {reproduction.region.to_dict()}",
        f"grid: {reproduction.grid.rows} x {reproduction.grid.cols} cells of {CELL_M:g} m; "
        f"{reproduction.repeats} noise draws",
        "",
        "| mechanism | epsilon | estimator | IBU iterations | EMD (m), mean ± sd | TV, mean ± sd |",
        "|---|---|---|---|---|---|",
    ]
    for row in reproduction.rows:
        its = "-" if row.ibu_iterations is None else f"{row.ibu_iterations:.0f}"
        lines.append(
            f"| {row.mechanism} | {row.epsilon} | {row.estimator} | {its} "
            f"| {row.emd_m:.1f} ± {row.emd_m_sd:.1f} | {row.tv:.3f} ± {row.tv_sd:.3f} |"
        )
    return "\n".join(lines)

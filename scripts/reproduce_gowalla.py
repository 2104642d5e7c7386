"""Planar Laplace versus k-RR on Gowalla check-ins, both reconstructed by IBU, compared by EMD.

The setting of the IBU literature (ElSalamouny and Palamidessi, EuroS&P 2020;
Palamidessi et al.): check-ins in a 3 km x 3 km area of a city on a 20 x 20
grid of 150 m cells; planar Laplace with epsilon = ln(2) per 100 m and k-RR
over the 400 cells with epsilon = ln(8); every check-in is one user's report;
the distribution of check-ins over the cells is reconstructed by IBU with a
fixed number of iterations (and, for comparison, with the cross-validated
stopping the aggregator uses), and scored by the earth mover's distance to
the true distribution.

    python scripts/reproduce_gowalla.py [--csv PATH] [--repeats 20] [--iterations 500] [--plot DIR]

The data set is not part of the project: by default it is read from
``../shared/data/gowalla_sf_downtown.csv`` next to the repository. Without it
the script says so and exits with status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(REPO))

from shared.geo import EARTH_RADIUS_M, Grid, Region  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402
from simulate.populations import Population, cell_labels  # noqa: E402
from simulate.runner import simulate  # noqa: E402

DEFAULT_CSV = REPO.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
SIDE_M = 3000.0
CELL_M = 150.0
PLANAR_EPSILON = math.log(2) / 100  # per metre
KRR_EPSILON = math.log(8)


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


def data_region(path: Path) -> Region:
    """The 3 km square centred on the middle of the check-ins' bounding box."""
    points = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(1, 2))
    lat = float(points[:, 0].min() + points[:, 0].max()) / 2
    lon = float(points[:, 1].min() + points[:, 1].max()) / 2
    # A hair under 3 km, so that rounding cannot make the grid 21 cells wide.
    return square_region(lat, lon, SIDE_M - 0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="directory for heatmaps")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        print(f"Error: the Gowalla data set is not at {args.csv} (give --csv)", file=sys.stderr)
        return 1

    region = data_region(args.csv)
    grid = Grid(region, CELL_M)
    assert (grid.rows, grid.cols) == (20, 20), (grid.rows, grid.cols)
    population = Population.from_csv_points(args.csv, grid)
    common = {"title": "Gowalla reproduction"}
    planar = CampaignSpec.from_dict(
        {
            **common,
            "id": "gowalla-planar",
            "mechanism": "planar_laplace",
            "epsilon": PLANAR_EPSILON,
            "region": region.to_dict(),
            "cell_size_m": CELL_M,
        }
    )
    krr = CampaignSpec.from_dict(
        {
            **common,
            "id": "gowalla-krr",
            "mechanism": "krr",
            "epsilon": KRR_EPSILON,
            "domain": list(cell_labels(grid)),
        }
    )
    print(f"data: {args.csv.name}, {population.n_rows} check-ins, region {region.to_dict()}")
    print(f"grid: {grid.rows} x {grid.cols} cells of {CELL_M:g} m; {args.repeats} noise draws")
    print()
    print(
        "| mechanism | epsilon | estimator | IBU iterations | EMD (m), mean ± sd | TV, mean ± sd |"
    )
    print("|---|---|---|---|---|---|")
    for spec, label in ((planar, "ln(2)/100 per m"), (krr, "ln(8)")):
        for stopping, iterations in (("fixed", args.iterations), ("cross-validated", None)):
            started = time.perf_counter()
            methods = ("ibu", "noisy") if stopping == "fixed" else ("ibu",)
            result = simulate(
                population,
                [spec],
                [None],
                methods=methods,
                repeats=args.repeats,
                seed=args.seed,
                ibu_iterations=iterations,
                progress=False,
            )
            for row in result.rows:
                name = f"IBU, {stopping}" if row.method == "ibu" else "noisy reports as they are"
                its = "-" if row.n_iter is None else f"{row.n_iter:.0f}"
                mean, sd = row.scores, row.scores_sd
                print(
                    f"| {spec.mechanism} | {label} | {name} | {its} "
                    f"| {mean.emd_m:.1f} ± {sd.emd_m:.1f} | {mean.tv:.3f} ± {sd.tv:.3f} |"
                )
            if args.plot and stopping == "fixed":
                from simulate.plots import write_plots

                for path in write_plots(result, args.plot):
                    print(f"wrote {path}", file=sys.stderr)
            seconds = time.perf_counter() - started
            print(f"({spec.mechanism}, {stopping}: {seconds:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

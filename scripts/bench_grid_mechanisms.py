"""Location mechanisms compared at equal privacy on the San Francisco check-ins.

Every check-in of ``../shared/data/gowalla_sf_downtown.csv`` is one user's
report, on the 20 x 20 grid of 150 m cells over the 3 km square around them
(as in ``scripts/bench_estimators.py``). For each epsilon per metre and seed the
same users report through each mechanism (the vectorised samplers of
:mod:`simulate.sampling`, the same laws as the devices'), the service's default
estimator for that mechanism (the decision table's, ``aggregator.estimation.decision``:
IBU with its iteration count chosen by 10-fold cross-validation for the metric
mechanisms, Norm-Sub for k-RR) estimates the distribution,
and the error is the earth mover's distance in metres to the distribution of the
users drawn.

Equal privacy, for ``epsilon`` per metre of Euclidean distance between cell
centres (what planar Laplace gives):

* **planar Laplace** and **exponential_grid, euclidean** at ``epsilon``;
* **exponential_grid, manhattan** at ``epsilon / sqrt(2)`` per metre of
  Manhattan distance, which is at most ``epsilon`` per Euclidean metre
  (``d_M <= sqrt(2) d_E``, equality for diagonal neighbours), and also at
  ``epsilon`` per Manhattan metre (the same loss between side neighbours, up
  to ``sqrt(2)`` times more per Euclidean metre between diagonal ones);
* **k-RR over the 400 cells** at ``epsilon * 150`` (the metric mechanisms' loss
  between neighbouring cells: k-RR is then at least as private as they are for
  every pair of cells) and at ``epsilon * D`` with ``D`` the distance between
  the two farthest cell centres, ``19 sqrt(2) * 150 = 4,031`` m (the same loss
  as theirs between those two; for every nearer pair k-RR is then less private).

A second table gives the coverage of the default estimate's 95% intervals for the
three metric mechanisms at ln 2 per 100 m, with the check-ins' cell shares as the truth:
counts drawn from ``Multinomial(n, p C)``, 10 trials per row, every (trial, cell) pair
checked, with the trial loop of ``scripts/bench_coverage.py`` (seeds 900-905).

Writes a marked section (``grid-mechanisms``) of docs/mechanisms.md and
``docs/grid_mechanisms_sf.png``. Without the data file the comparison is
skipped with a message. Run from the repository root::

    python scripts/bench_grid_mechanisms.py            # 8 seeds, 5 epsilons, coverage (6 minutes)
    python scripts/bench_grid_mechanisms.py --quick    # 2 seeds, 2 epsilons, print only
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for, point_estimate  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.geo import Grid  # noqa: E402
from shared.mechanisms import KRR, ExponentialGrid, Mechanism, PlanarLaplace  # noqa: E402
from shared.spec import EUCLIDEAN, MANHATTAN  # noqa: E402
from simulate.metrics import earth_movers_distance  # noqa: E402
from simulate.populations import Population, cell_labels  # noqa: E402
from simulate.reproduce import data_region  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "grid-mechanisms"
DOC = ROOT / "docs" / "mechanisms.md"
PLOT = ROOT / "docs" / "grid_mechanisms_sf.png"
SF_CSV = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
CELL_M = 150.0
EPSILONS = (0.001, 0.002, 0.005, 0.01, 0.02)  # per metre
QUICK_EPSILONS = (0.002, 0.02)
SEEDS = tuple(range(300, 308))
# The plot's log axis starts here: a k-RR that reports almost truthfully has an EMD near 0.
FLOOR_M = 1.0

Builder = Callable[[float, Grid], Mechanism]


def mechanisms(grid: Grid) -> list[tuple[str, Builder]]:
    """(label, epsilon per Euclidean metre -> mechanism) at equal privacy (module docstring)."""
    corners = math.hypot(grid.rows - 1, grid.cols - 1) * grid.cell_size_m
    labels = cell_labels(grid)
    return [
        ("planar Laplace, eps", lambda e, g: PlanarLaplace(epsilon=e, grid=g)),
        (
            "exponential_grid euclidean, eps",
            lambda e, g: ExponentialGrid(epsilon=e, grid=g, metric=EUCLIDEAN),
        ),
        (
            "exponential_grid manhattan, eps/sqrt 2",
            lambda e, g: ExponentialGrid(epsilon=e / math.sqrt(2), grid=g, metric=MANHATTAN),
        ),
        (
            "exponential_grid manhattan, eps (per Manhattan m)",
            lambda e, g: ExponentialGrid(epsilon=e, grid=g, metric=MANHATTAN),
        ),
        (
            "k-RR over cells, eps x 150 m (neighbours)",
            lambda e, g: KRR(epsilon=e * g.cell_size_m, domain=labels),
        ),
        (
            f"k-RR over cells, eps x {corners:,.0f} m (farthest cells)",
            lambda e, g: KRR(epsilon=e * corners, domain=labels),
        ),
    ]


@functools.cache
def sf_data(path: Path) -> tuple[Grid, Population]:
    """The check-ins' grid of :data:`CELL_M` cells over their region, and their population."""
    grid = Grid(data_region(path), CELL_M)
    return grid, Population.from_csv_points(path, grid)


def emd_of(mechanism: Mechanism, users: np.ndarray, grid: Grid, seed: int) -> tuple[float, float]:
    """(EMD in metres of the default estimate, seconds it took) for one seed's reports."""
    generator = np.random.default_rng(seed)
    truth = np.bincount(users, minlength=grid.n_cells) / users.size
    reports = sample(mechanism, users, generator)
    counts = np.bincount(reports, minlength=mechanism.n_outputs).astype(float)
    channel = channel_for(mechanism)
    started = time.perf_counter()
    estimate = point_estimate(mechanism, counts, seed=seed, channel=channel)
    seconds = time.perf_counter() - started
    estimate = np.maximum(estimate, 0.0)
    value = earth_movers_distance(truth, estimate / estimate.sum(), grid)
    assert value is not None
    return value, seconds


def run(epsilons: Sequence[float], seeds: Sequence[int]) -> dict[str, dict[float, list[float]]]:
    grid, population = sf_data(SF_CSV)
    assert (grid.rows, grid.cols) == (20, 20), (grid.rows, grid.cols)
    users = population.rows
    assert users is not None
    results: dict[str, dict[float, list[float]]] = {}
    for label, build in mechanisms(grid):
        results[label] = {}
        for epsilon in epsilons:
            mechanism = build(epsilon, grid)
            errors = []
            for seed in seeds:
                error, seconds = emd_of(mechanism, users, grid, seed)
                errors.append(error)
                print(
                    f"{label:52} eps {epsilon:<6g} seed {seed}: EMD {error:6.1f} m ({seconds:.1f} s)"
                )
            results[label][epsilon] = errors
    return results


def table(results: dict[str, dict[float, list[float]]], n_users: int, seeds: Sequence[int]) -> str:
    epsilons = sorted(next(iter(results.values())))
    head = "| mechanism (epsilon per Euclidean metre: eps) | " + " | ".join(
        f"eps = {e:g}" for e in epsilons
    )
    lines = [
        "EMD (metres) of the default estimate (cross-validated IBU; k-RR: Norm-Sub) to "
        f"the {n_users:,} check-ins' "
        f"distribution on 20 x 20 cells of 150 m: median over seeds {seeds[0]}-{seeds[-1]} "
        "(smallest-largest).",
        "",
        head + " |",
        "|---" * (len(epsilons) + 1) + "|",
    ]
    for label, by_epsilon in results.items():
        cells = [
            f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
            for v in (by_epsilon[e] for e in epsilons)
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict[float, list[float]]], path: Path) -> Path:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.0), dpi=80)
    axes = figure.add_subplot()
    for label, by_epsilon in results.items():
        epsilons = sorted(by_epsilon)
        medians = [max(statistics.median(by_epsilon[e]), FLOOR_M) for e in epsilons]
        axes.plot(epsilons, medians, marker="o", label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("epsilon per Euclidean metre")
    axes.set_ylim(FLOOR_M * 0.8, None)
    axes.set_ylabel(f"EMD of the default estimate (m; below {FLOOR_M:g} m at {FLOOR_M:g})")
    axes.set_title("SF check-ins, 20 x 20 cells of 150 m: equal privacy", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})
    return path


COVERAGE_TRIALS = 10
COVERAGE_SEED = 900


def coverage_table(trials: int = COVERAGE_TRIALS) -> str:
    """The 95% intervals' coverage on the check-ins' shares, per mechanism and n."""
    from scripts.bench_coverage import Config
    from scripts.bench_coverage import run as coverage_run

    grid, population = sf_data(SF_CSV)
    truth = population.probabilities
    epsilon = math.log(2) / 100
    mechanisms: list[tuple[str, Mechanism]] = [
        (
            "exponential_grid euclidean",
            ExponentialGrid(epsilon=epsilon, grid=grid, metric=EUCLIDEAN),
        ),
        (
            "exponential_grid manhattan",
            ExponentialGrid(epsilon=epsilon, grid=grid, metric=MANHATTAN),
        ),
        ("planar Laplace", PlanarLaplace(epsilon=epsilon, grid=grid)),
    ]
    lines = [
        f"Coverage of the default estimate's 95% intervals (IBU, bootstrap) on the check-ins' "
        f"shares, ln 2 per 100 m of each metric, {trials} trials of counts drawn from "
        "Multinomial(n, p C) per row, every (trial, cell) pair checked; large: cells above "
        "the uniform share 1/400:",
        "",
        "| mechanism | n | coverage | large cells | small cells | zero-width |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    index = 0
    for label, mechanism in mechanisms:
        for n in (10_000, 100_000):
            tally = coverage_run(
                Config("sf", label, mechanism, truth, n), trials, COVERAGE_SEED + index
            )
            index += 1
            large, small = tally.class_coverage("large"), tally.class_coverage("small")
            row = (
                f"| {label} | {n:,} | {tally.coverage:.3f} | {large or 0:.3f} | {small or 0:.3f} "
                f"| {tally.zero_width} |"
            )
            print(row)
            lines.append(row)
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 2 epsilons, print only")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not SF_CSV.is_file():
        print(f"no {SF_CSV}: the San Francisco comparison is skipped", file=sys.stderr)
        return 0
    epsilons = QUICK_EPSILONS if args.quick else EPSILONS
    seeds = SEEDS[:2] if args.quick else SEEDS
    results = run(epsilons, seeds)
    users = sf_data(SF_CSV)[1].rows
    assert users is not None
    markdown = table(results, users.size, seeds)
    print(markdown)
    if not args.quick:
        markdown += "\n\n" + coverage_table()
        write_section(SECTION, markdown, path=DOC)
        print(
            f"wrote section {SECTION} of {DOC.relative_to(ROOT)} and {plot(results, PLOT).relative_to(ROOT)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

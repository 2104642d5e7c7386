"""Locations by k-RR and OLH over a region's cells, against the standards and planar Laplace.

For each population (the San Francisco check-ins of ``../shared/data/`` when present, and
two synthetic clustered cities from population seeds no estimator was tuned on) on 20 x 20
cells of 150 m, each epsilon of k-RR over the 400 cells, and each seed, the same users
report through k-RR, and their reports are estimated by:

* the **default** (the decision table's for a region campaign of k-RR: Norm-Sub smoothed over
  neighbouring cells, the width chosen by 10-fold cross-validation of the held-out
  likelihood, :mod:`aggregator.estimation.smoothing`);
* **Norm-Sub** (the unbiased inversion projected onto the simplex) and the **MLE** (IBU run
  to convergence): the standards;
* **hindsight-best IBU**: IBU from equal shares scored against the users after every step up
  to 30, then about every 5% up to 1,000 steps, the best kept. No estimator can know this
  count: a bound to compare with, not a method.

Beside them, the same users through **OLH** over the cells at the same epsilon (its default,
the same smoothing through OLH's channel), and through **planar Laplace** and the
**exponential mechanism** (Euclidean) at the equal-privacy epsilon per metre: k-RR's epsilon
reached at 300 m (k-RR at ln 8 against ln 2 per 100 m). The raw report shares are a column
for reference. Errors are earth mover's distances in metres to the users' own distribution.

Writes section ``krr-grid`` of BENCHMARKS.md. Run from the repository root::

    python scripts/bench_krr_grid.py                 # 20 seeds (about 10 minutes on 2 cores)
    python scripts/bench_krr_grid.py --quick         # 2 seeds, ln 8 only, print only
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import (  # noqa: E402
    MatrixInversion,
    MaximumLikelihood,
    channel_for,
    point_estimate,
)
from aggregator.estimation.ibu import start_steps  # noqa: E402
from aggregator.estimation.smoothing import SmoothedProjection  # noqa: E402
from scripts.benchlib import seed_range, write_section  # noqa: E402
from shared.geo import Grid  # noqa: E402
from shared.mechanisms import KRR, ExponentialGrid, Mechanism, PlanarLaplace  # noqa: E402
from shared.oracles import OLH  # noqa: E402
from shared.spec import EUCLIDEAN  # noqa: E402
from simulate.metrics import earth_movers_distance  # noqa: E402
from simulate.populations import Population, cell_labels  # noqa: E402
from simulate.reproduce import data_region  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "krr-grid"
SF_CSV = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
CELL_M = 150.0
SEEDS = tuple(range(300, 320))
CITY_SEEDS = (31, 32)
# k-RR's epsilons (ln of these) and the distance at which planar Laplace reaches the same loss.
EPSILON_BASES = (2, 4, 8, 16)
EQUAL_AT_M = 300.0
HINDSIGHT_CAP = 1000
COLUMNS = ("raw", "default", "norm_sub", "mle", "hindsight", "olh", "planar", "exp_grid")


@dataclass(frozen=True)
class Users:
    """One population of users on the grid: a name, the grid, and a draw of its users."""

    name: str
    grid: Grid
    rows: np.ndarray | None  # every check-in once; else drawn from probabilities
    probabilities: np.ndarray
    n: int

    def users(self, generator: np.random.Generator) -> np.ndarray:
        if self.rows is not None:
            return self.rows
        return generator.choice(self.probabilities.size, size=self.n, p=self.probabilities)


def populations() -> list[Users]:
    if SF_CSV.is_file():
        grid = Grid(data_region(SF_CSV), CELL_M)
        sf = Population.from_csv_points(SF_CSV, grid)
        n = int(sf.rows.size)
    else:
        print(f"(no {SF_CSV}: the San Francisco rows are skipped)", file=sys.stderr)
        grid = Grid(data_region_fallback(), CELL_M)
        sf, n = None, 10_000
    out = []
    if sf is not None:
        out.append(Users("SF check-ins", grid, sf.rows, sf.probabilities, n))
    for seed in CITY_SEEDS:
        city = Population.clustered_city(grid, seed=seed).probabilities
        out.append(Users(f"clustered city {seed}", grid, None, city, n))
    return out


def data_region_fallback():
    """A 3 km square at the equator, where the check-ins are not at hand."""
    from scripts.benchlib import equator_grid

    return equator_grid(20, 20, CELL_M).region


def hindsight_ibu(counts: np.ndarray, channel, truth: np.ndarray, grid: Grid) -> float:
    steps, best, taken = start_steps(channel, counts), math.inf, 0
    while taken < HINDSIGHT_CAP:
        stride = 1 if taken < 30 else max(1, taken // 20)
        steps.advance(stride, 0.0)
        taken += stride
        best = min(best, earth_movers_distance(truth, steps.p, grid))
    return best


def emd(truth: np.ndarray, estimate: np.ndarray, grid: Grid) -> float:
    estimate = np.maximum(estimate, 0.0)
    value = earth_movers_distance(truth, estimate / estimate.sum(), grid)
    assert value is not None
    return float(value)


def reports(mechanism: Mechanism, users: np.ndarray, generator) -> np.ndarray:
    outputs = sample(mechanism, users, generator)
    return np.bincount(outputs, minlength=mechanism.n_outputs).astype(float)


def run_seed(population: Users, base: int, seed: int) -> dict[str, float]:
    grid = population.grid
    epsilon = math.log(base)
    generator = np.random.default_rng([seed, base])
    users = population.users(generator)
    truth = np.bincount(users, minlength=grid.n_cells) / users.size
    krr = KRR(epsilon=epsilon, domain=list(cell_labels(grid)))
    channel = channel_for(krr)
    counts = reports(krr, users, generator)
    smoothed = SmoothedProjection(grid.rows, grid.cols, seed=seed).fit(counts, channel)
    out = {
        "raw": emd(truth, counts / counts.sum(), grid),
        "default": emd(truth, smoothed.frequencies_, grid),
        "norm_sub": emd(
            truth, MatrixInversion(postprocess="projection").fit(counts, channel).frequencies_, grid
        ),
        "mle": emd(truth, MaximumLikelihood().fit(counts, channel).frequencies_, grid),
        "hindsight": hindsight_ibu(counts, channel, truth, grid),
        "bandwidth": smoothed.bandwidth_,
    }
    olh = OLH(epsilon=epsilon, domain_size=grid.n_cells)
    olh_channel = channel_for(olh)
    olh_fit = SmoothedProjection(grid.rows, grid.cols, seed=seed).fit(
        reports(olh, users, generator), olh_channel
    )
    out["olh"] = emd(truth, olh_fit.frequencies_, grid)
    per_metre = epsilon / EQUAL_AT_M
    for name, mechanism in (
        ("planar", PlanarLaplace(epsilon=per_metre, grid=grid)),
        ("exp_grid", ExponentialGrid(epsilon=per_metre, grid=grid, metric=EUCLIDEAN)),
    ):
        estimate = point_estimate(mechanism, reports(mechanism, users, generator), seed=seed)
        out[name] = emd(truth, estimate, grid)
    return out


def run_row(population: Users, base: int, seeds: Sequence[int]) -> dict:
    per_seed = [run_seed(population, base, seed) for seed in seeds]
    means = {c: statistics.fmean(s[c] for s in per_seed) for c in COLUMNS}
    bandwidths = [s["bandwidth"] for s in per_seed]
    row = {
        "name": f"{population.name}, k-RR ln {base} (planar ln {base} / 300 m)",
        **means,
        "bandwidth": statistics.median(bandwidths),
        "none_chosen": sum(b == 0 for b in bandwidths),
        "seeds": len(per_seed),
    }
    print(format_row(row), flush=True)
    return row


HEADER = (
    "| row | raw shares | default | Norm-Sub | MLE | hindsight-best IBU | default / hindsight "
    "| default / Norm-Sub | width (cells, median; none chosen) | OLH default | planar Laplace "
    "| exponential (Euclidean) |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(row: dict) -> str:
    return (
        f"| {row['name']} | {row['raw']:.0f} | {row['default']:.0f} | {row['norm_sub']:.0f} "
        f"| {row['mle']:.0f} | {row['hindsight']:.0f} | {row['default'] / row['hindsight']:.3f} "
        f"| {row['default'] / row['norm_sub']:.3f} | {row['bandwidth']:g}; {row['none_chosen']} "
        f"of {row['seeds']} | {row['olh']:.0f} | {row['planar']:.0f} | {row['exp_grid']:.0f} |"
    )


def table(rows: list[dict], seeds: Sequence[int]) -> str:
    return "\n".join(
        [
            f"Mean EMD (metres) over seeds {seeds[0]}-{seeds[-1]} ({len(seeds)} per row) to the "
            "users' own distribution on 20 x 20 cells of 150 m; planar Laplace and the "
            "exponential mechanism at the epsilon per metre that reaches k-RR's at 300 m; "
            "OLH over the same cells at k-RR's epsilon.",
            "",
            HEADER,
            *(format_row(row) for row in rows),
        ]
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, ln 8 only, print only")
    parser.add_argument("--seeds", type=seed_range, default=None, help="e.g. 300-319")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = tuple(args.seeds) if args.seeds else (SEEDS[:2] if args.quick else SEEDS)
    bases = (8,) if args.quick else EPSILON_BASES
    print(HEADER, flush=True)
    rows = [run_row(p, base, seeds) for p in populations() for base in bases]
    if not args.quick and args.seeds is None:
        write_section(SECTION, table(rows, seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

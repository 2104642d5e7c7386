"""k-RR over the cells of a grid: the label-only default against a grid-aware estimator
(:class:`scripts.krr_grid.KRRGridSmoothing`).

For every configuration and seed the same noisy k-RR reports are estimated by

* the **default** of k-RR campaigns today (``empirical_bayes``, which knows only labels);
* the **grid estimator** (``KRRGridSmoothing``): that default, or where the default is the raw
  shares and a chi-square test finds spatial structure, the inversion smoothed by a Gaussian
  of ``h`` cells and shrunk towards uniform (``--selection cv``: ``h`` chosen by 10-fold
  cross-validation instead, the rule measured first);
* the **raw reports** (report counts normalised to shares);
* **hindsight-best IBU**: IBU on the same reports, scored against the truth along its path
  (checkpoints every iteration up to 30, then about every 5% to 3,000; the exact EMD is
  computed at 12 of them spread evenly in log scale over the path, then by golden-section
  search between the two neighbours of the best of those), keeping the best: a bound, not
  a method (a search, so it can miss the best checkpoint where the error is not unimodal).

Errors: exact earth mover's distance in metres over cell centres (the optimal transport of
the difference of the two distributions, which for a metric cost equals the transport of
the distributions themselves), and total variation; against the distribution of the users
drawn. The configurations: the San Francisco check-ins (``../shared/data/gowalla_sf_downtown.csv``,
20 x 20 cells of 150 m, epsilon ln 8, every check-in or a resample of 1,000) and synthetic
20 x 20 and 40 x 40 grids of 100 m cells (clustered city: 8 Gaussian hotspots of 100-500 m
over a 10% uniform background; uniform-ish: weights 1 + 0.3 U(0, 1) per cell; spiky city:
40 hotspots of 20-60 m over a 2% background) at epsilon ln 2, ln 4, ln 8 with 500, 1,000,
10^4 and 10^5 reports.

Run from the repository root::

    python scripts/bench_krr_grid.py --seeds 200-207          # the table; writes BENCHMARKS.md
    python scripts/bench_krr_grid.py --seeds 100-107 --no-write
    python scripts/bench_krr_grid.py --quick                  # a few rows, 2 seeds, print only
    python scripts/bench_krr_grid.py --cost-only              # seconds per estimate

Hindsight-best IBU is the slow part (about 20 exact EMDs over 1,600 cells per 40 x 40 seed);
``--cache FILE`` keeps it between runs (keyed by configuration and seed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for  # noqa: E402
from aggregator.estimation.estimators import _steps, empirical_bayes  # noqa: E402
from scripts.bench_estimators import Case as estimators_case  # noqa: E402
from scripts.bench_estimators import planar_grid, synthetic_categorical  # noqa: E402
from scripts.benchlib import seed_range, spiky_city, write_section  # noqa: E402
from scripts.krr_grid import KRRGridSmoothing  # noqa: E402
from shared.geo import Grid  # noqa: E402
from shared.mechanisms import KRR  # noqa: E402
from simulate.metrics import earth_movers_distance, total_variation  # noqa: E402
from simulate.populations import Population, cell_labels  # noqa: E402
from simulate.reproduce import data_region  # noqa: E402

SECTION = "krr-grid"
SF_CSV = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
POPULATION_SEED = 2024
IBU_CAP = 3000
DENSE_UNTIL = 30
COARSE = 12
GOLDEN = (1 + 5**0.5) / 2


@dataclass(frozen=True)
class Case:
    name: str
    truth: np.ndarray
    grid: Grid
    epsilon: float
    n: int | None  # None: every row of the data set once
    rows: np.ndarray | None = None

    def mechanism(self) -> KRR:
        return KRR(epsilon=self.epsilon, domain=list(cell_labels(self.grid)))

    def reports(self, mechanism: KRR, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Report counts of one seed, and the distribution of those users' true cells (drawn
        as bench_estimators draws them)."""
        drawn = estimators_case(self.name, self.truth, mechanism, self.n, self.rows, self.grid)
        return drawn.reports(seed)


def emd_m(truth: np.ndarray, estimate: np.ndarray, grid: Grid) -> float:
    """Exact EMD in metres between ``truth`` and ``estimate`` (negatives clipped, renormalised)
    over the cell centres of ``grid``."""
    estimate = np.maximum(estimate, 0.0)
    value = earth_movers_distance(truth, estimate / estimate.sum(), grid)
    assert value is not None, "the grid is too large for an exact EMD"
    return value


def tv(truth: np.ndarray, estimate: np.ndarray) -> float:
    estimate = np.maximum(estimate, 0.0)
    return total_variation(truth, estimate / estimate.sum())


def checkpoints() -> list[int]:
    points = list(range(1, DENSE_UNTIL + 1))
    while points[-1] < IBU_CAP:
        points.append(min(IBU_CAP, points[-1] + max(1, points[-1] // 20)))
    return points


def hindsight_best_ibu(case: Case, channel, counts: np.ndarray, truth: np.ndarray) -> float:
    """The least EMD along IBU's path (see the module docstring for the search)."""
    steps = _steps(channel, counts)
    points = checkpoints()
    path, done = [], 0
    for point in points:
        steps.advance(point - done, 0.0)
        done = point
        path.append(steps.p.copy())
    errors: dict[int, float] = {}

    def error(index: int) -> float:
        if index not in errors:
            errors[index] = emd_m(truth, path[index], case.grid)
        return errors[index]

    coarse = sorted({int(np.rint(i)) - 1 for i in np.geomspace(1, len(points), COARSE)})
    best = min(coarse, key=error)
    position = coarse.index(best)
    low = coarse[max(position - 1, 0)]
    high = coarse[min(position + 1, len(coarse) - 1)]
    # Golden-section search between the best coarse point's neighbours (the error along the
    # path is taken to be unimodal there), then the few points left.
    while high - low > 3:
        left = high - round((high - low) / GOLDEN)
        right = low + round((high - low) / GOLDEN)
        if error(left) <= error(right):
            high = right
        else:
            low = left
    for index in range(low, high + 1):
        error(index)
    return min(errors.values())


def synthetic_truth(grid: Grid, shape: str) -> np.ndarray:
    if shape == "clustered city":
        return Population.clustered_city(grid, seed=POPULATION_SEED).probabilities
    if shape == "spiky city":
        return spiky_city(grid, seed=POPULATION_SEED).probabilities
    if shape == "uniform-ish":
        return synthetic_categorical(grid.n_cells, "uniform-ish")
    raise ValueError(shape)


EPSILONS = (("ln 2", math.log(2)), ("ln 4", math.log(4)), ("ln 8", math.log(8)))
SIZES = (500, 1000, 10_000, 100_000)
SHAPES = ("clustered city", "uniform-ish", "spiky city")


def cases(quick: bool) -> list[Case]:
    out: list[Case] = []
    if SF_CSV.is_file():
        grid = Grid(data_region(SF_CSV), 150.0)
        sf = Population.from_csv_points(SF_CSV, grid)
        assert sf.rows is not None
        for n in (None, 1000):
            label = "all" if n is None else f"n={n:,}"
            name = f"SF check-ins 20 x 20 (150 m) ln 8, {label}"
            out.append(Case(name, sf.probabilities, grid, math.log(8), n, sf.rows))
    else:
        print(f"(no {SF_CSV}: the San Francisco rows are skipped)", file=sys.stderr)
    for side in (20, 40):
        grid = planar_grid(side * 100.0, 100.0)
        assert (grid.rows, grid.cols) == (side, side)
        for shape in SHAPES:
            truth = synthetic_truth(grid, shape)
            for label, epsilon in EPSILONS:
                for n in SIZES:
                    if quick and (side == 40 or n in (1000, 100_000) or label == "ln 4"):
                        continue
                    name = f"{shape} {side} x {side} {label}, n={n:,}"
                    out.append(Case(name, truth, grid, epsilon, n))
    return out


def evaluate(case: Case, seed: int, cache: dict, options: dict, *, hindsight: bool = True) -> dict:
    """One seed: the errors of the raw reports, today's default and the grid estimator
    (``KRRGridSmoothing(**options)``), and hindsight-best IBU's (from ``cache`` if there)."""
    mechanism = case.mechanism()
    channel = channel_for(mechanism)
    counts, truth = case.reports(mechanism, seed)
    key = f"{case.name}|{seed}"
    if key not in cache and hindsight:
        cache[key] = hindsight_best_ibu(case, channel, counts, truth)
    started = time.perf_counter()
    fitted = KRRGridSmoothing(case.grid.rows, case.grid.cols, **options).fit(counts, channel)
    seconds = time.perf_counter() - started
    default = fitted.default_.frequencies_
    raw = counts / counts.sum()
    return {
        "best": cache.get(key, math.nan),
        "raw": (emd_m(truth, raw, case.grid), tv(truth, raw)),
        "default": (emd_m(truth, default, case.grid), tv(truth, default)),
        "grid": (emd_m(truth, fitted.frequencies_, case.grid), tv(truth, fitted.frequencies_)),
        "bandwidth": fitted.bandwidth_,
        "seconds": seconds,
    }


def summarise(name: str, records: list[dict]) -> dict:
    grid_emd = np.array([r["grid"][0] for r in records])
    default_emd = np.array([r["default"][0] for r in records])
    raw_emd = np.array([r["raw"][0] for r in records])
    best = np.array([r["best"] for r in records])
    grid_tv = np.array([r["grid"][1] for r in records])
    raw_tv = np.array([r["raw"][1] for r in records])
    default_tv = np.array([r["default"][1] for r in records])
    return {
        "name": name,
        "grid_mean": float(grid_emd.mean()),
        "best_median": float(np.median(grid_emd / best)),
        "best_worst": float(np.max(grid_emd / best)),
        "default_best_median": float(np.median(default_emd / best)),
        "raw_median": float(np.median(grid_emd / raw_emd)),
        "raw_worst": float(np.max(grid_emd / raw_emd)),
        "worse_than_raw": int(np.sum(grid_emd > raw_emd)),
        "mean_vs_raw": float(grid_emd.mean() / raw_emd.mean()),
        "default_mean_vs_raw": float(default_emd.mean() / raw_emd.mean()),
        "mean_vs_default": float(grid_emd.mean() / default_emd.mean()),
        "tv_mean_vs_raw": float(grid_tv.mean() / raw_tv.mean()),
        "tv_default_mean_vs_raw": float(default_tv.mean() / raw_tv.mean()),
        "bandwidth": statistics.median(r["bandwidth"] for r in records),
        "seconds": statistics.median(r["seconds"] for r in records),
        "seeds": len(records),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| configuration | grid estimator: mean EMD (m) | median bandwidth (cells) "
        "| grid / hindsight-best IBU: median, worst seed | today's default / hindsight-best "
        "IBU, median | grid / raw reports: median, worst seed | seeds worse than raw "
        "| mean EMD: grid / raw (today's default / raw) | mean EMD grid / today's default "
        "| mean TV: grid / raw (today's default / raw) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['grid_mean']:.4g} | {r['bandwidth']:g} "
            f"| {r['best_median']:.3f}, {r['best_worst']:.3f} | {r['default_best_median']:.3f} "
            f"| {r['raw_median']:.3f}, {r['raw_worst']:.3f} | {r['worse_than_raw']} of {r['seeds']} "
            f"| {r['mean_vs_raw']:.3f} ({r['default_mean_vs_raw']:.3f}) "
            f"| {r['mean_vs_default']:.3f} "
            f"| {r['tv_mean_vs_raw']:.3f} ({r['tv_default_mean_vs_raw']:.3f}) |"
        )
    return "\n".join(lines)


def cost_rows(repeats: int = 5) -> str:
    """Median seconds of the grid estimator and of today's default, on clustered cities."""
    lines = [
        "| grid, reports | grid estimator (s) | today's default (s) | bandwidth chosen |",
        "|---|---|---|---|",
    ]
    for side, n in ((20, 10_000), (20, 100_000), (128, 10**6), (512, 10**6)):
        grid = planar_grid(side * 100.0, 100.0)
        case = Case("", synthetic_truth(grid, "clustered city"), grid, math.log(8), n)
        mechanism = case.mechanism()
        channel = channel_for(mechanism)
        counts, _ = case.reports(mechanism, 0)
        timings: dict[str, list[float]] = {"grid": [], "default": []}
        for _ in range(repeats):
            started = time.perf_counter()
            fitted = KRRGridSmoothing(side, side).fit(counts, channel)
            timings["grid"].append(time.perf_counter() - started)
            started = time.perf_counter()
            empirical_bayes(channel).fit(counts, channel)
            timings["default"].append(time.perf_counter() - started)
        lines.append(
            f"| {side} x {side}, {n:,} | {statistics.median(timings['grid']):.3f} "
            f"| {statistics.median(timings['default']):.3f} | {fitted.bandwidth_:g} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="200-207", help="a seed or a range, e.g. 100-107")
    parser.add_argument("--quick", action="store_true", help="a few rows, 2 seeds, print only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--section", default=SECTION, help="the BENCHMARKS.md section written")
    parser.add_argument("--only", default="", help="only the rows whose name contains this")
    parser.add_argument("--cache", type=Path, help="a JSON file keeping hindsight-best IBU")
    parser.add_argument("--records", type=Path, help="write every seed's errors as JSON")
    parser.add_argument(
        "--fill-cache", action="store_true", help="only compute hindsight-best IBU into --cache"
    )
    parser.add_argument("--selection", default="test", choices=("test", "cv"))
    parser.add_argument("--candidates", default="smooth-then-project", help="with --selection cv")
    parser.add_argument("--se-rule", type=float, default=0.0, help="with --selection cv")
    parser.add_argument("--alpha", type=float, help="with --selection test: the test's level")
    parser.add_argument("--margin", type=float, help="with --selection test: the caution")
    parser.add_argument("--no-hindsight", action="store_true", help="skip hindsight-best IBU")
    parser.add_argument("--bandwidths", default="", help="comma-separated, e.g. 0.5,1,2")
    parser.add_argument("--cost-only", action="store_true", help="only the cost table")
    args = parser.parse_args(argv)
    if args.cost_only:
        print(cost_rows())
        return 0
    options: dict = {"selection": args.selection}
    if args.selection == "cv":
        options.update(candidates=args.candidates, se_rule=args.se_rule)
    for name in ("alpha", "margin"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.bandwidths:
        options["bandwidths"] = tuple(float(h) for h in args.bandwidths.split(","))
    seeds = seed_range(args.seeds)[: 2 if args.quick else None]
    cache = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
    if args.fill_cache:
        for case in cases(args.quick):
            if args.only and args.only not in case.name:
                continue
            mechanism = case.mechanism()
            channel = channel_for(mechanism)
            for seed in seeds:
                key = f"{case.name}|{seed}"
                if key not in cache:
                    counts, truth = case.reports(mechanism, seed)
                    cache[key] = hindsight_best_ibu(case, channel, counts, truth)
            print(f"{case.name}: cached", file=sys.stderr)
            args.cache.write_text(json.dumps(cache))
        return 0
    rows, everything = [], {}
    for case in cases(args.quick):
        if args.only and args.only not in case.name:
            continue
        started = time.perf_counter()
        records = [
            evaluate(case, seed, cache, options, hindsight=not args.no_hindsight) for seed in seeds
        ]
        everything[case.name] = records
        rows.append(summarise(case.name, records))
        print(f"{case.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        if args.cache:
            args.cache.write_text(json.dumps(cache))
        if args.records:
            args.records.write_text(json.dumps(everything))
    markdown = (
        f"k-RR over the cells of a grid, seeds {seeds[0]}-{seeds[-1]}: the grid estimator "
        "(`krr_grid`) against hindsight-best IBU, the raw reports and today's label-only "
        f"default (`empirical_bayes`).\n\n{table(rows)}\n"
    )
    print(markdown)
    if not (args.quick or args.no_write):
        print(f"wrote {write_section(args.section, markdown)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Coverage of the estimates' confidence intervals, as the service computes them.

Each configuration is a mechanism, a true distribution and a number of reports
``n``. A trial draws the report counts from ``Multinomial(n, p C)`` (``n``
users drawn independently from the truth ``p``, each report perturbed by the
channel ``C``), runs the service's default estimate with its 95% intervals
(:func:`aggregator.estimation.estimate`, seeded by the trial), and checks every
(trial, value) pair: does the interval hold the true frequency? does it hold
its own point estimate? has it zero width? Seeds are fixed, so a rerun on the
same code gives the same table.

Configurations (default run, a few minutes on 2 cores):

* k-RR over k = 10, 50 and 1,000 categories with Zipf(1.1) shares, epsilon
  0.5, 1, 2 and 4, n = 10^3 .. 10^6;
* planar Laplace on a synthetic clustered city (8 Gaussian hotspots over a
  10% uniform background) on 20 x 20 and 64 x 64 grids of 100 and 150 m cells,
  epsilon ln 2 and ln 4 per 100 m, n = 10^3 .. 10^5, and on the 64 x 64 grids 10^6;
* planar Laplace on a spiky synthetic city (40 hotspots of 20-60 m over a 2%
  background: check-ins' shape without the data) on 20 x 20 cells of 150 m,
  epsilon ln 2 and ln 4 per 100 m, n = 10^3 .. 10^5;
* the exponential mechanism over the clustered city's 64 x 64 cells of 150 m
  (``exponential_grid``, Manhattan and Euclidean distance), epsilon ln 2 and
  ln 4 per 100 m, n = 10^3 .. 10^5;
* the geometric mechanism over 30 integers, Zipf(1.1) (piled at the lowest value) and
  bell-shaped truths, epsilon 0.5 and 1 per unit, n = 10^3 .. 10^5;
* with ``../shared/data/gowalla_sf_downtown.csv`` (or ``--data``): the
  check-ins' cell shares on their 20 x 20 grid of 150 m cells, planar Laplace
  at ln 2 and ln 4 per 100 m, and k-RR and OLH over the 400 cells at ln 8 (region
  campaigns: their default smooths Norm-Sub over neighbouring cells).

Classes: a value is "large" when its true share is above ``1 / k`` (the
uniform share) and "small" otherwise; the worst class's coverage is printed
beside the overall one. Interval time is the time spent inside
:func:`aggregator.estimation.intervals.confidence_interval` per estimate
(median), against the whole estimate's.

The per-configuration table goes into section ``coverage`` of
``BENCHMARKS.md``, a summary into the intervals section of
``docs/estimation.md``. ``--quick`` runs a few configurations with few
trials and only prints::

    python scripts/bench_coverage.py           # full run
    python scripts/bench_coverage.py --quick   # smoke run (seconds)
    python scripts/bench_coverage.py --only planar   # some configurations, as in the full run (print only)
    python scripts/bench_coverage.py --only planar --replicates 8   # fewer bootstrap refits
    python scripts/bench_coverage.py --only planar --method projection   # another method's intervals
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

import aggregator.estimation.compute as estimation_compute  # noqa: E402
from aggregator.estimation import METHODS, channel_for, estimate  # noqa: E402
from aggregator.http.estimates import applicable_methods  # noqa: E402
from scripts.bench_estimators import bell  # noqa: E402
from scripts.benchlib import equator_grid, spiky_city, write_section  # noqa: E402
from shared.mechanisms import (  # noqa: E402
    KRR,
    ExponentialGrid,
    Geometric,
    Mechanism,
    PlanarLaplace,
)
from shared.oracles import OLH  # noqa: E402
from simulate.populations import Population  # noqa: E402

SECTION = "coverage"
DOC = ROOT / "docs" / "estimation.md"
DATA = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
CONFIDENCE = 0.95
# Nominal 95% intervals count as honest when they cover in this band of (trial, value) pairs.
BAND = (0.90, 0.995)
KRR_TRIALS = 20
PLANAR_TRIALS = 10
ZIPF_S = 1.1


@dataclass(frozen=True)
class Config:
    """One mechanism, truth and sample size."""

    family: str  # the summary row it belongs to
    setting: str  # epsilon and the like, for the full table
    mechanism: Mechanism
    truth: np.ndarray
    n: int


@dataclass
class Tally:
    """Counts over a configuration's trials."""

    pairs: int = 0
    covered: int = 0
    by_class: dict[str, list[int]] = field(
        default_factory=lambda: {"large": [0, 0], "small": [0, 0]}
    )
    width_sum: float = 0.0
    outside: int = 0
    zero_width: int = 0
    seconds: list[float] = field(default_factory=list)
    interval_seconds: list[float] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        return self.covered / self.pairs

    def class_coverage(self, name: str) -> float | None:
        covered, pairs = self.by_class[name]
        return covered / pairs if pairs else None

    @property
    def worst_class(self) -> tuple[str, float]:
        shares = {name: self.class_coverage(name) for name in self.by_class}
        name = min((n for n, v in shares.items() if v is not None), key=lambda n: shares[n])
        return name, shares[name]


def krr_configs(quick: bool) -> Iterator[Config]:
    ks = (50,) if quick else (10, 50, 1000)
    epsilons = (1.0,) if quick else (0.5, 1.0, 2.0, 4.0)
    sizes = (10_000,) if quick else (1_000, 10_000, 100_000, 1_000_000)
    for k in ks:
        truth = Population.zipf(k, ZIPF_S).probabilities
        mechanism_of = {
            eps: KRR(epsilon=eps, domain=[f"v{i}" for i in range(k)]) for eps in epsilons
        }
        for eps in epsilons:
            for n in sizes:
                family = f"k-RR, k = {k:,}, Zipf({ZIPF_S:g})"
                yield Config(family, f"eps {eps:g}", mechanism_of[eps], truth, n)


def planar_configs(quick: bool) -> Iterator[Config]:
    grids = ((20, 150.0),) if quick else ((20, 100.0), (20, 150.0), (64, 100.0), (64, 150.0))
    levels = (2,) if quick else (2, 4)
    sizes = (10_000,) if quick else (1_000, 10_000, 100_000)
    for cells, cell_m in grids:
        grid = equator_grid(cells, cells, cell_m)
        truth = Population.clustered_city(grid, seed=cells).probabilities
        for level in levels:
            mechanism = PlanarLaplace(epsilon=math.log(level) / 100, grid=grid)
            for n in sizes:
                family = f"planar, {cells} x {cells}, clustered city"
                setting = f"{cell_m:g} m cells, ln {level} / 100 m"
                yield Config(family, setting, mechanism, truth, n)


def spiky_city_configs(quick: bool) -> Iterator[Config]:
    """Planar Laplace on a spiky synthetic city (40 hotspots of 20-60 m over a 2% uniform
    background), the shape of check-in data without the data."""
    if quick:
        return
    grid = equator_grid(20, 20, 150.0)
    truth = spiky_city(grid, seed=20).probabilities
    for level in (2, 4):
        mechanism = PlanarLaplace(epsilon=math.log(level) / 100, grid=grid)
        for n in (1_000, 10_000, 100_000):
            family = "planar, 20 x 20, spiky city"
            yield Config(family, f"150 m cells, ln {level} / 100 m", mechanism, truth, n)


def million_report_configs(quick: bool) -> Iterator[Config]:
    """The 64 x 64 clustered city's settings from 10^6 reports (after the others, so that
    their rows keep their seeds)."""
    if quick:
        return
    for config in planar_configs(quick):
        if config.family.startswith("planar, 64 x 64") and config.n == 100_000:
            yield replace(config, n=10**6)


def exponential_grid_configs(quick: bool) -> Iterator[Config]:
    if quick:
        return
    grid = equator_grid(64, 64, 150.0)
    truth = Population.clustered_city(grid, seed=64).probabilities
    for metric in ("manhattan", "euclidean"):
        for level in (2, 4):
            mechanism = ExponentialGrid(epsilon=math.log(level) / 100, grid=grid, metric=metric)
            for n in (1_000, 10_000, 100_000):
                family = f"exponential grid, {metric}, 64 x 64, clustered city"
                yield Config(family, f"150 m cells, ln {level} / 100 m", mechanism, truth, n)


def geometric_configs(quick: bool) -> Iterator[Config]:
    if quick:
        return
    truths = {"Zipf(1.1)": Population.zipf(30, ZIPF_S).probabilities, "bell": bell(30)}
    for name, truth in truths.items():
        for eps in (0.5, 1.0):
            mechanism = Geometric(epsilon=eps, lo=0, hi=29)
            for n in (1_000, 10_000, 100_000):
                yield Config(
                    f"geometric, 30 values, {name}", f"eps {eps:g} / unit", mechanism, truth, n
                )


def data_configs(path: Path, quick: bool) -> Iterator[Config]:
    population = Population.from_csv_points(path, cell_size_m=150.0)
    grid = population.grid
    assert grid is not None
    truth = population.probabilities
    sizes = (10_000,) if quick else (1_000, 10_000, 100_000)
    shape = f"{grid.rows} x {grid.cols}"
    for level in (2,) if quick else (2, 4):
        mechanism = PlanarLaplace(epsilon=math.log(level) / 100, grid=grid)
        for n in sizes:
            family = f"planar, SF check-ins, {shape}"
            yield Config(family, f"150 m cells, ln {level} / 100 m", mechanism, truth, n)
    # A region campaign of k-RR over the cells: its default smooths Norm-Sub over neighbours.
    cells = KRR(epsilon=math.log(8), grid=grid)
    for n in sizes:
        yield Config(f"k-RR, SF check-ins, {grid.n_cells} cells", "eps ln 8", cells, truth, n)


def data_oracle_configs(path: Path, quick: bool) -> Iterator[Config]:
    """OLH over the check-ins' cells at ln 8 (after every other row, to keep their seeds)."""
    population = Population.from_csv_points(path, cell_size_m=150.0)
    grid = population.grid
    assert grid is not None
    hashed = OLH(epsilon=math.log(8), grid=grid)
    for n in (10_000,) if quick else (1_000, 10_000, 100_000):
        yield Config(
            f"OLH, SF check-ins, {grid.n_cells} cells",
            "eps ln 8",
            hashed,
            population.probabilities,
            n,
        )


@contextmanager
def timed_intervals(record: list[float]) -> Iterator[None]:
    """Time every call of the interval entry point made by the estimate pipeline."""
    original: Callable = estimation_compute.confidence_interval

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - started)

    estimation_compute.confidence_interval = timed
    try:
        yield
    finally:
        estimation_compute.confidence_interval = original


def run(
    config: Config,
    trials: int,
    seed: int,
    replicates: int | None = None,
    method: str | None = None,
) -> Tally:
    """``trials`` estimates of ``config``'s counts, tallied (``replicates``: the error
    bootstrap's, if not the service's; ``method``: the estimate API's, if not the default)."""
    channel = channel_for(config.mechanism)
    truth = config.truth
    report_shares = np.maximum(channel.forward(truth), 0.0)
    report_shares /= report_shares.sum()
    large = truth > 1.0 / truth.size
    generator = np.random.default_rng(seed)
    tally = Tally()
    for trial in range(trials):
        counts = generator.multinomial(config.n, report_shares)
        interval_times: list[float] = []
        with timed_intervals(interval_times):
            started = time.perf_counter()
            result = estimate(
                config.mechanism,
                counts,
                confidence=CONFIDENCE,
                seed=trial,
                channel=channel,
                n_bootstrap=replicates,
                method=method,
            )
            tally.seconds.append(time.perf_counter() - started)
        tally.interval_seconds.append(sum(interval_times))
        low, high = result.ci_low, result.ci_high
        covered = (low <= truth) & (truth <= high)
        point = np.clip(result.frequencies, 0.0, 1.0)
        tally.pairs += truth.size
        tally.covered += int(covered.sum())
        for name, members in (("large", large), ("small", ~large)):
            tally.by_class[name][0] += int(covered[members].sum())
            tally.by_class[name][1] += int(members.sum())
        tally.width_sum += float((high - low).sum())
        tally.outside += int(((point < low) | (point > high)).sum())
        tally.zero_width += int((high - low <= 0).sum())
    return tally


def in_band(value: float) -> bool:
    return BAND[0] <= value <= BAND[1]


def full_table(results: list[tuple[Config, Tally]]) -> str:
    lines = [
        "| configuration | setting | n | coverage | large | small | mean width | "
        "outside | zero width | estimate s | interval s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, tally in results:
        large, small = tally.class_coverage("large"), tally.class_coverage("small")
        lines.append(
            f"| {config.family} | {config.setting} | {config.n:,} | {tally.coverage:.3f}"
            f"{'' if in_band(tally.coverage) else ' (!)'} | {_share(large)} | {_share(small)} | "
            f"{tally.width_sum / tally.pairs:.2e} | {tally.outside} | {tally.zero_width} | "
            f"{statistics.median(tally.seconds):.3f} | "
            f"{statistics.median(tally.interval_seconds):.3f} |"
        )
    return "\n".join(lines)


def summary_table(results: list[tuple[Config, Tally]]) -> str:
    families: dict[str, list[Tally]] = {}
    for config, tally in results:
        families.setdefault(config.family, []).append(tally)
    lines = [
        "| configurations | count | coverage (lowest - highest) | worst class (lowest) | "
        "in 90-99.5% | pairs | outside own interval | zero width |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family, tallies in families.items():
        coverages = [t.coverage for t in tallies]
        worst = min((t.worst_class for t in tallies), key=lambda item: item[1])
        lines.append(
            f"| {family} | {len(tallies)} | {min(coverages):.3f} - {max(coverages):.3f} | "
            f"{worst[1]:.3f} ({worst[0]}) | {sum(in_band(c) for c in coverages)} of "
            f"{len(tallies)} | {sum(t.pairs for t in tallies):,} | "
            f"{sum(t.outside for t in tallies)} | {sum(t.zero_width for t in tallies)} |"
        )
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few configurations; print only")
    parser.add_argument("--data", type=Path, default=DATA, help="SF check-ins CSV (optional)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", default="", help="run the configurations whose name contains this; print only"
    )
    parser.add_argument(
        "--replicates",
        type=int,
        default=None,
        help="the error bootstrap's replicates, if not the service's (print only)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="the estimate API's method, if not each mechanism's default (print only; "
        "configurations it does not apply to are skipped)",
    )
    args = parser.parse_args(argv)

    configs = [
        *((c, KRR_TRIALS) for c in krr_configs(args.quick)),
        *((c, PLANAR_TRIALS) for c in planar_configs(args.quick)),
    ]
    if args.data.exists():
        configs += [(c, PLANAR_TRIALS) for c in data_configs(args.data, args.quick)]
    else:
        print(f"{args.data} not found: the SF check-in rows are skipped", file=sys.stderr)
    # After the check-ins, so that their rows keep their seeds.
    configs += [(c, PLANAR_TRIALS) for c in exponential_grid_configs(args.quick)]
    configs += [(c, KRR_TRIALS) for c in geometric_configs(args.quick)]
    configs += [(c, PLANAR_TRIALS) for c in spiky_city_configs(args.quick)]
    configs += [(c, PLANAR_TRIALS) for c in million_report_configs(args.quick)]
    if args.data.exists():
        configs += [(c, PLANAR_TRIALS) for c in data_oracle_configs(args.data, args.quick)]
    if args.quick:
        configs = [(config, 3) for config, _ in configs]
    # Each configuration's seed is its place in the whole list, so that --only gives the rows
    # of the full run.
    chosen = [
        (index, config, trials)
        for index, (config, trials) in enumerate(configs)
        if args.only in config.family
        and (args.method is None or args.method in applicable_methods(config.mechanism))
    ]
    results = []
    started = time.perf_counter()
    for index, config, trials in chosen:
        tally = run(
            config, trials, seed=args.seed + index, replicates=args.replicates, method=args.method
        )
        results.append((config, tally))
        name, worst = tally.worst_class
        print(
            f"{config.family:38s} {config.setting:28s} n={config.n:>9,} "
            f"coverage {tally.coverage:.3f} worst {name} {worst:.3f} "
            f"outside {tally.outside} zero {tally.zero_width} "
            f"({statistics.median(tally.seconds):.3f} s/estimate)",
            flush=True,
        )
    print(f"\n{time.perf_counter() - started:.0f} s\n")
    summary, full = summary_table(results), full_table(results)
    print(summary, "\n", full, sep="\n")
    if args.quick or args.only or args.replicates is not None or args.method is not None:
        return 0
    trials_text = (
        f"{KRR_TRIALS} trials per k-RR or geometric configuration, {PLANAR_TRIALS} per planar or "
        "exponential-grid one; "
        f"nominal {CONFIDENCE:.0%} intervals of the default estimate; "
        "(!) marks coverage outside 90-99.5%."
    )
    write_section(SECTION, f"### Interval coverage\n\n{trials_text}\n\n{full}")
    write_section(SECTION, f"{trials_text}\n\n{summary}", path=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

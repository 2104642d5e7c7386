"""The default estimate against the raw reports over a wide grid of settings (printed only).

Where ``bench_estimators.py`` measures a table of chosen configurations, this sweeps each
mechanism's settings corner to corner (few and many categories or values, epsilon from strong
to weak privacy, few and many reports, spread-out and concentrated truths) and prints, per
setting, the mean error of the raw report shares and of the service's default estimate (errors
as in ``bench_estimators.py``: against the distribution of the users drawn; total variation, or
the earth mover's distance in metres on a grid), their ratio, and how many seeds were worse
than the raw reports. Rows whose default's mean error over the seeds is above the raw
reports' are marked ``(!)``; the last lines count them and give the largest ratio and the
geometric mean of the ratios. Eight seeds cannot tell a few percent from chance where the
reports are few, so ``--confirm SEEDS`` runs the marked settings again on other seeds and gives
each ratio with two standard errors of the paired differences: worse than the raw reports in
expectation, better, or not told apart::

    python scripts/sweep_defaults.py krr          # k-RR, seeds 600-607
    python scripts/sweep_defaults.py rr geometric planar --seeds 600-603
    python scripts/sweep_defaults.py rr --wide    # randomized response over 140 settings
    python scripts/sweep_defaults.py krr --wide   # k-RR over 192 settings
    python scripts/sweep_defaults.py rr --method ibu   # cross-validated IBU, not the default
    python scripts/sweep_defaults.py krr --method empirical_bayes
    python scripts/sweep_defaults.py geometric --gain-se 0   # without the gain rule past 20 steps
    python scripts/sweep_defaults.py geometric --no-noise-stop   # runs not stopped at the noise
    python scripts/sweep_defaults.py geometric --confirm 1000-1199
    python scripts/sweep_defaults.py krr --wide --hindsight   # also against hindsight-best IBU
    python scripts/sweep_defaults.py krr --no-likelihood-check   # k-RR without its MLE check
    python scripts/sweep_defaults.py krr-checkins   # k-RR over coarse grids of the SF check-ins

``--hindsight`` adds, per setting, the median over the seeds of the default's error over
hindsight-best IBU's (the best of IBU's iterations for that seed, chosen with the truth), and
its median and worst seed over the best fixed IBU count's (the one iteration count with the
least mean error over the setting's seeds, also chosen with the truth), and counts the
settings where those are above 1.05.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for, estimators  # noqa: E402
from aggregator.estimation.estimators import (  # noqa: E402
    cross_validated_ibu,
    default_estimator,
    empirical_bayes,
    posterior_median,
)
from scripts.bench_estimators import (  # noqa: E402
    SF_CSV,
    Case,
    best_fixed,
    ibu_errors,
    krr_case,
    planar_grid,
    to_hindsight,
)
from scripts.benchlib import seed_range  # noqa: E402
from scripts.measure_stopping import geometric_truths  # noqa: E402
from shared.geo import Grid  # noqa: E402
from shared.mechanisms import KRR, Geometric, PlanarLaplace, RandomizedResponse  # noqa: E402
from simulate.populations import Population  # noqa: E402
from simulate.reproduce import data_region  # noqa: E402

MECHANISMS = ("krr", "rr", "geometric", "planar", "krr-checkins")
# The estimators the sweep can run in place of the default (by the estimate API's method names).
ESTIMATORS = {
    "default": default_estimator,
    "ibu": cross_validated_ibu,
    "empirical_bayes": empirical_bayes,
    "posterior_median": posterior_median,
}


def settings(mechanism: str, *, wide: bool = False) -> Iterator[Case]:
    """The sweep's settings; ``wide``: k-RR and randomized response over the wider grids of
    docs/estimation.md (192 and 140 settings; the other mechanisms are unchanged)."""
    if mechanism == "krr":
        shapes, ks, epsilons = ("zipf", "spiky", "uniform-ish"), (3, 7, 30, 300), (0.5, 2.0, 6.0)
        if wide:
            epsilons = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)
        for shape, k, epsilon, n in itertools.product(shapes, ks, epsilons, (1000, 30_000)):
            yield krr_case(shape, k, epsilon, n)
    elif mechanism == "rr":
        epsilons, ns, shares = (0.25, 1.0, 3.0, 6.0), (100, 1000, 30_000), (0.02, 0.3, 0.5)
        if wide:
            epsilons = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)
            ns, shares = (100, 1000, 10_000, 100_000), (0.02, 0.1, 0.3, 0.45, 0.5)
        for epsilon, n, share in itertools.product(epsilons, ns, shares):
            truth = np.array([1.0 - share, share])
            name = f"rr eps={epsilon:g} p(yes)={share:g}, n={n:,}"
            yield Case(name, truth, RandomizedResponse(epsilon=epsilon), n)
    elif mechanism == "geometric":
        for k, epsilon, n in itertools.product((10, 30), (0.25, 1.0, 4.0), (300, 3000)):
            geometric = Geometric(epsilon=epsilon, lo=0, hi=k - 1)
            for shape, truth in geometric_truths(k).items():
                name = f"geometric k={k} eps={epsilon:g}/unit, n={n:,}, {shape}"
                yield Case(name, truth, geometric, n)
    elif mechanism == "krr-checkins":
        yield from checkin_categories()
    else:
        grid = planar_grid(2000.0, 100.0)
        city = Population.clustered_city(grid, seed=77).probabilities
        for ratio, n in itertools.product(
            (1.5, 2.0, 8.0, 32.0, 128.0), (300, 3000, 30_000, 100_000)
        ):
            planar = PlanarLaplace(epsilon=math.log(ratio) / 100, grid=grid)
            yield Case(f"planar city ln {ratio:g} / 100 m, n={n:,}", city, planar, n, grid=grid)


def checkin_categories() -> Iterator[Case]:
    """k-RR over the occupied cells of coarse grids on the SF check-ins (9, 25 and 61 cells of
    1,000, 600 and 400 m) at epsilon 1, 2 and 4 with 1,000 and 10,000 users drawn from the
    check-ins: real shares over few categories, without the synthetic truths' ties; none
    without the data file."""
    if not SF_CSV.is_file():
        return
    region = data_region(SF_CSV)
    for cell_m in (1000.0, 600.0, 400.0):
        grid = Grid(region, cell_m)
        checkins = Population.from_csv_points(SF_CSV, grid)
        occupied = np.flatnonzero(checkins.probabilities > 0)
        category = np.full(grid.n_cells, -1)
        category[occupied] = np.arange(occupied.size)
        truth = checkins.probabilities[occupied] / checkins.probabilities[occupied].sum()
        domain = [f"cell {i}" for i in occupied]
        for epsilon, n in itertools.product((1.0, 2.0, 4.0), (1000, 10_000)):
            name = (
                f"SF check-ins k-RR over {occupied.size} cells of {cell_m:g} m "
                f"eps={epsilon:g}, n={n:,}"
            )
            mechanism = KRR(epsilon=epsilon, domain=domain)
            yield Case(name, truth, mechanism, n, rows=category[checkins.rows])


def errors(
    case: Case, seeds: Sequence[int], estimator=default_estimator, *, hindsight: bool = False
) -> np.ndarray:
    """Per seed (rows), the estimate's error and the raw report shares' (columns), and with
    ``hindsight`` hindsight-best IBU's and the best fixed IBU count's."""
    channel = channel_for(case.mechanism)
    table = np.zeros((len(seeds), 4 if hindsight else 2))
    curves = []
    for row, seed in enumerate(seeds):
        counts, truth = case.reports(seed)
        fitted = estimator(channel).fit(counts, channel).frequencies_
        table[row, :2] = case.error(truth, fitted), case.error(truth, counts / counts.sum())
        if hindsight:
            curves.append(ibu_errors(case, channel, counts, truth))
            table[row, 2] = curves[-1].min()
    if hindsight:
        table[:, 3] = best_fixed(np.stack(curves))
    return table


@dataclass(frozen=True)
class Yardsticks:
    """A setting's default against the two hindsight yardsticks: its median ratio over the
    seeds to hindsight-best IBU, and its median and worst ratio to the best fixed IBU count."""

    best: float
    fixed: float
    fixed_worst: float

    @classmethod
    def of(cls, table: np.ndarray) -> Yardsticks:
        """From a table of :func:`errors` with ``hindsight``."""
        to_best = [to_hindsight(error, best) for error, best in table[:, [0, 2]]]
        to_fixed = [to_hindsight(error, fixed) for error, fixed in table[:, [0, 3]]]
        return cls(float(np.median(to_best)), float(np.median(to_fixed)), max(to_fixed))


def paired_ratio(table: np.ndarray) -> tuple[float, float]:
    """The ratio of the mean errors in ``table`` (as from :func:`errors`) and two standard
    errors of it, from the spread of the per-seed differences (the raw reports' mean taken as
    known; 0 with one seed)."""
    estimate_mean, raw_mean = table.mean(axis=0)
    if raw_mean <= 0:
        return 1.0, 0.0
    differences = table[:, 0] - table[:, 1]
    spread = differences.std(ddof=1) if len(differences) > 1 else 0.0
    return estimate_mean / raw_mean, 2 * spread / math.sqrt(len(differences)) / raw_mean


def seeds_worse(table: np.ndarray) -> int:
    """The seeds of ``table`` (as from :func:`errors`) whose estimate was worse than the raw
    report shares."""
    return int(np.sum(table[:, 0] > table[:, 1] * (1 + 1e-9)))


def sweep(
    cases: Iterator[Case],
    seeds: Sequence[int],
    estimator=default_estimator,
    hindsight: list[Yardsticks] | None = None,
) -> tuple[list[Case], int, list[float]]:
    """Print a row per setting; the settings worse than the raw reports, how many settings
    there were, and the ratios of the mean errors (of the settings whose raw reports have an
    error). With ``hindsight`` (a list), each setting's :class:`Yardsticks` are printed and
    appended to it."""
    above: list[Case] = []
    total = 0
    ratios = []
    for case in cases:
        table = errors(case, seeds, estimator, hindsight=hindsight is not None)
        default_mean, raw_mean = table[:, :2].mean(axis=0)
        ratio = default_mean / raw_mean if raw_mean > 0 else 1.0
        if raw_mean > 0:
            ratios.append(ratio)
        worse = seeds_worse(table)
        mark = " (!)" if ratio > 1 + 1e-9 else ""
        total += 1
        if mark:
            above.append(case)
        best = ""
        if hindsight is not None:
            yardsticks = Yardsticks.of(table)
            hindsight.append(yardsticks)
            best = (
                f" {yardsticks.best:.3f} | {yardsticks.fixed:.3f}, {yardsticks.fixed_worst:.3f} |"
            )
        print(
            f"| {case.name} | {raw_mean:.4g} | {default_mean:.4g} | {ratio:.3f}{mark} "
            f"| {worse} of {len(seeds)} |{best}",
            flush=True,
        )
    return above, total, ratios


def confirm(cases: Sequence[Case], seeds: Sequence[int], estimator=default_estimator) -> int:
    """Run ``cases`` again on other ``seeds`` and print each ratio with two standard errors;
    how many are worse than the raw reports beyond them."""
    print(
        f"\nThe settings marked (!), again on {len(seeds)} other seeds ({seeds[0]}-{seeds[-1]}):\n"
    )
    print("| setting | ratio to the raw reports | two standard errors | seeds worse | verdict |")
    print("|---|---|---|---|---|")
    beyond = 0
    for case in cases:
        table = errors(case, seeds, estimator)
        ratio, margin = paired_ratio(table)
        if ratio - margin > 1:
            verdict, beyond = "worse", beyond + 1
        elif ratio + margin < 1:
            verdict = "better"
        else:
            verdict = "not told apart"
        worse = seeds_worse(table)
        print(
            f"| {case.name} | {ratio:.3f} | {ratio - margin:.3f}-{ratio + margin:.3f} "
            f"| {worse} of {len(seeds)} | {verdict} |",
            flush=True,
        )
    return beyond


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mechanisms", nargs="+", choices=MECHANISMS)
    parser.add_argument("--seeds", type=seed_range, default=seed_range("600-607"))
    parser.add_argument(
        "--wide",
        action="store_true",
        help="k-RR over 192 settings, randomized response over 140",
    )
    parser.add_argument(
        "--method",
        choices=tuple(ESTIMATORS),
        default="default",
        help="the estimate to sweep: the default, or a method of the estimate API "
        "(ibu: cross-validated IBU; empirical_bayes: k-RR over three categories or more; "
        "posterior_median: k-RR)",
    )
    parser.add_argument(
        "--confirm",
        type=seed_range,
        metavar="SEEDS",
        help="run the settings marked (!) again on these seeds (e.g. 1000-1199) and tell "
        "which are worse than the raw reports beyond two standard errors",
    )
    parser.add_argument(
        "--gain-se",
        type=float,
        default=estimators.GEOMETRIC_GAIN_SE,
        help="the standard errors a geometric IBU run's held-out score must gain past 20 "
        "iterations (estimators.GEOMETRIC_GAIN_SE; 0: any gain, as before it)",
    )
    parser.add_argument(
        "--no-noise-stop",
        action="store_true",
        help="geometric IBU runs not stopped where they fit the reports within their noise "
        "(estimators.GEOMETRIC_DISCREPANCY_SD set to None, as before it)",
    )
    parser.add_argument(
        "--no-likelihood-check",
        action="store_true",
        help="k-RR's empirical Bayes never replaced by the maximum-likelihood shares "
        "(estimators.KRR_LIKELIHOOD_CHECK_MARGIN set to None, as before it)",
    )
    parser.add_argument(
        "--hindsight",
        action="store_true",
        help="also each setting's error over hindsight-best IBU's (median seed) and over "
        "the best fixed IBU count's (median and worst seed)",
    )
    args = parser.parse_args(argv)
    name = {"default": "default", "ibu": "cross-validated IBU"}.get(args.method, args.method)
    best = ""
    if args.hindsight:
        best = (
            f" {name} / hindsight-best IBU: median | {name} / best fixed IBU count: median, "
            "worst seed |"
        )
    print(
        f"| setting | raw reports: mean error | {name}: mean error | {name} / raw "
        f"| seeds worse than raw |{best}"
    )
    print("|---|---|---|---|---|" + ("---|---|" if args.hindsight else ""))
    above: list[Case] = []
    total = 0
    ratios: list[float] = []
    estimator = ESTIMATORS[args.method]
    for mechanism in args.mechanisms:
        first = next(settings(mechanism), None)
        if first is None:
            parser.error(f"{mechanism}: needs the SF check-ins at {SF_CSV}")
        channel = channel_for(first.mechanism)
        try:
            estimator(channel)
        except ValueError as error:
            parser.error(f"{mechanism}: {error}")
    # The rules' module constants as the flags set them, for this sweep only.
    rules: dict[str, float | None] = {"GEOMETRIC_GAIN_SE": args.gain_se}
    if args.no_noise_stop:
        rules["GEOMETRIC_DISCREPANCY_SD"] = None
    if args.no_likelihood_check:
        rules["KRR_LIKELIHOOD_CHECK_MARGIN"] = None
    hindsight: list[Yardsticks] | None = [] if args.hindsight else None
    with patch.multiple(estimators, **rules):
        for mechanism in args.mechanisms:
            flagged, count, more = sweep(
                settings(mechanism, wide=args.wide), args.seeds, estimator, hindsight
            )
            above, total, ratios = above + flagged, total + count, ratios + more
        print(f"\n{len(above)} of {total} settings worse than the raw reports on these seeds (!)")
        if hindsight:
            # Their median, not a geometric mean: where the estimate is exact and IBU is not
            # (a high epsilon, few users) a setting's median is 0 or nearly.
            medians = [y.best for y in hindsight]
            print(
                f"{sum(r > 1.05 for r in medians)} of {len(hindsight)} settings above 1.05 "
                "times hindsight-best IBU in the median seed; the median of those medians "
                f"{np.median(medians):.3f}"
            )
            fixed = [y.fixed for y in hindsight]
            print(
                f"{sum(r > 1.05 for r in fixed)} of {len(hindsight)} settings above 1.05 "
                "times the best fixed IBU count in the median seed, "
                f"{sum(y.fixed_worst > 1.05 for y in hindsight)} in the worst seed; the median "
                f"of those medians {np.median(fixed):.3f}, the worst seed of all "
                f"{max(y.fixed_worst for y in hindsight):.3f}"
            )
        if ratios:  # settings whose raw reports have an error
            print(
                f"largest ratio {max(ratios):.3f}; geometric mean of the ratios "
                f"{math.exp(np.mean(np.log(ratios))):.3f} (over {len(ratios)} settings)"
            )
        if args.confirm and above:
            beyond = confirm(above, args.confirm, estimator)
            print(
                f"\n{beyond} of {len(above)} worse than the raw reports beyond two standard "
                f"errors on seeds {args.confirm[0]}-{args.confirm[-1]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

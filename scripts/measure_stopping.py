"""Measurements behind docs/estimation.md's notes on IBU stopping rules (printed only).

* ``planar SEEDS``: for the planar rows of ``bench_estimators.py``, the cross-validated count
  against the largest count within 0.25, 0.5 or 1 standard error of the best (a rule towards
  more iterations), and the mean of the iterates weighted by ``exp(score / T)``; each as the
  median and worst seed's ratio to hindsight-best IBU.
* ``geometric``: the geometric mechanism over 30 integers (Zipf(1.1) truth): IBU's mean total
  variation against the raw reports' with the standard-error rule at 0, 0.5 and 1
  (seeds 100-199), and at fixed iteration counts (seeds 100-159).
* ``starts SEEDS``: the geometric mechanism's default (two IBU runs, from equal shares and from
  the report shares, :class:`estimators.TwoStartIBU`) against each run alone, over several
  ranges, privacy levels, numbers of reports and truths: mean total variation against the raw
  reports', the worst seed's ratio and how many seeds were worse than the raw reports
  (a Markdown table).
* ``weights SEEDS``: on the rows of ``starts``, two ways of leaning the default towards the
  report shares, measured and not adopted: a handicap of ``c`` nats for the run from equal
  shares (weight ``expit((gap - c) / 3)``), and the run from the report shares stopped at the
  smallest count within 1 standard error of the best (mean total variation against the raw
  reports'; the last lines give each column's worst row and how many rows are above 1).
* ``noise SEEDS``: on the rows of ``starts``, the default against the same two runs without
  their stop at the reports' noise level (``estimators.GEOMETRIC_DISCREPANCY_SD`` set to None):
  mean total variation against the raw reports', the worst seed's ratio and how many seeds were
  worse than the raw reports; the last lines count the rows above the raw reports and the rows
  whose worst seed is over 1.5 and 2 times them.
* ``excess SEEDS``: the worst of those rows, a Zipf(1.1) truth over 30 values at 0.5 per unit
  with 200 reports, over many seeds: the default's mean total variation against the raw
  reports', with a band of two standard errors of the paired per-seed differences.
* ``corner``: the exponential mechanism on a 16 x 16 grid of 100 m cells (Manhattan, ln 2 per
  100 m), whose noise is clamped at the grid's edges as the geometric mechanism's is at its
  range's ends: its default (IBU from equal shares) against the raw reports for a truth piled
  in a corner and one in the centre (mean TV and EMD ratios, seeds 200-211).
* ``tails N``: the end-to-end tests' populations in ``N`` in-process surveys: the geometric
  campaign's default estimate (TV, and the estimate's weight on the ten lowest values), the OLH
  campaign's projection (TV, largest error), and the k-RR commute campaign's TV per method in
  standard deviations from the mean of 40 surveys.

    python scripts/measure_stopping.py planar 100-107
    python scripts/measure_stopping.py geometric
    python scripts/measure_stopping.py starts 200-259
    python scripts/measure_stopping.py weights 100-159
    python scripts/measure_stopping.py noise 4000-4039
    python scripts/measure_stopping.py excess 1000-2999
    python scripts/measure_stopping.py corner
    python scripts/measure_stopping.py tails 2000
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
from scipy.special import expit, logit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for, estimate, estimators  # noqa: E402
from aggregator.estimation.estimators import (  # noqa: E402
    IBU,
    PATIENCE_FRACTION,
    PATIENCE_MIN,
    TWO_STARTS_TEMPERATURE,
    _fold_steps,
    _next_checkpoint,
    _steps,
    default_estimator,
    held_out_folds,
    held_out_scores,
    paired_se,
)
from scripts.bench_estimators import bell, cases, ibu_errors  # noqa: E402
from scripts.benchlib import equator_grid, seed_range  # noqa: E402
from shared.mechanisms import ExponentialGrid, Geometric, PlanarLaplace  # noqa: E402
from shared.oracles import OLH  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402
from simulate.metrics import earth_movers_distance, total_variation  # noqa: E402
from simulate.populations import Population  # noqa: E402
from simulate.runner import simulate  # noqa: E402
from simulate.sampling import sample  # noqa: E402


def fold_curve(channel, counts: np.ndarray) -> tuple[list[int], np.ndarray, int]:
    """The cross-validation's checkpoints, per-fold scores and best index, as IBU runs it."""
    held = held_out_folds(counts, 10, 0)
    folds = _fold_steps(channel, counts[None, :] - held)
    iterations, per_fold, done, best = [], [], 0, 0
    while done < 10_000:
        target = _next_checkpoint(done)
        folds.advance(target - done)
        done = target
        iterations.append(done)
        per_fold.append(held_out_scores(held, folds.predicted()))
        if per_fold[-1].sum() > per_fold[best].sum():
            best = len(per_fold) - 1
        if done - iterations[best] >= max(PATIENCE_MIN, PATIENCE_FRACTION * iterations[best]):
            break
    return iterations, np.asarray(per_fold), best


def iterate_at(channel, counts: np.ndarray, count: int) -> np.ndarray:
    steps = _steps(channel, counts)
    steps.advance(count, 0.0)
    return steps.p


def planar(seeds: range) -> None:
    for case in cases(quick=False):
        if not isinstance(case.mechanism, PlanarLaplace):
            continue
        channel = channel_for(case.mechanism)
        ratios: dict[str, list[float]] = {}
        for seed in seeds:
            counts, truth = case.reports(seed)
            best_error = ibu_errors(case, channel, counts, truth).min()
            iterations, scores, best = fold_curve(channel, counts)
            totals = scores.sum(axis=1)
            for rule in (0.0, 0.25, 0.5, 1.0):
                chosen = best
                for index in range(len(iterations) - 1, best, -1):
                    if totals[best] - totals[index] <= rule * paired_se(
                        scores[best] - scores[index]
                    ):
                        chosen = index
                        break
                fit = iterate_at(channel, counts, iterations[chosen])
                ratios.setdefault(f"se+{rule:g}", []).append(case.error(truth, fit) / best_error)
            for temperature in (1.0, 2.0, 4.0):
                weights = np.exp((totals - totals.max()) / temperature)
                weights /= weights.sum()
                steps, done, mean = _steps(channel, counts), 0, np.zeros(channel.n_inputs)
                for count, weight in zip(iterations, weights, strict=True):
                    if weight < 1e-8:
                        continue
                    steps.advance(count - done, 0.0)
                    done = count
                    mean += weight * steps.p
                error = case.error(truth, mean / mean.sum())
                ratios.setdefault(f"mean T={temperature:g}", []).append(error / best_error)
        print(
            case.name,
            " | ".join(
                f"{name}: median {np.median(v):.3f} worst {max(v):.3f}"
                for name, v in ratios.items()
            ),
            flush=True,
        )


def geometric() -> None:
    points = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 3000]
    for k, epsilon, n in ((30, 0.5, 200), (30, 0.5, 1000), (30, 1.0, 200), (100, 0.5, 1000)):
        mechanism = Geometric(epsilon=epsilon, lo=0, hi=k - 1)
        channel = channel_for(mechanism)
        truth_p = Population.zipf(k, 1.1).probabilities
        raw, rules, fixed = [], {0.0: [], 0.5: [], 1.0: []}, np.zeros(len(points))
        for seed in range(100, 200):
            generator = np.random.default_rng(seed)
            users = generator.choice(k, size=n, p=truth_p)
            truth = np.bincount(users, minlength=k) / n
            counts = np.bincount(sample(mechanism, users, generator), minlength=k).astype(float)
            raw.append(total_variation(truth, counts / n))
            for rule, errors in rules.items():
                errors.append(
                    total_variation(truth, IBU(se_rule=rule).fit(counts, channel).frequencies_)
                )
            if seed < 160:
                steps, done = _steps(channel, counts), 0
                for i, count in enumerate(points):
                    steps.advance(count - done, 0.0)
                    done = count
                    fixed[i] += total_variation(truth, steps.p) / 60
        mean_raw = np.mean(raw)
        mean_raw_60 = np.mean(raw[:60])
        print(
            f"geometric k={k} eps={epsilon} n={n}: raw {mean_raw:.3f} | "
            + " | ".join(f"se {r:g}: {np.mean(e) / mean_raw:.3f}" for r, e in rules.items())
            + f" | best fixed count {points[int(fixed.argmin())]}: {fixed.min() / mean_raw_60:.3f}",
            flush=True,
        )


def geometric_truths(k: int) -> dict[str, np.ndarray]:
    """Truths over ``k`` ordered values: piled at either end, spread out, two bumps, a spike."""
    x = np.arange(k)
    zipf = Population.zipf(k, 1.1).probabilities
    bumps = np.exp(-0.5 * ((x - k / 4) / (k / 15)) ** 2)
    bumps += 0.6 * np.exp(-0.5 * ((x - 3 * k / 4) / (k / 15)) ** 2)
    spike = np.full(k, 0.3 / k)
    spike[k // 3] += 0.7
    shapes = {"Zipf, low end": zipf, "Zipf, high end": zipf[::-1], "bell": bell(k)}
    shapes |= {"uniform": np.ones(k), "two bumps": bumps, "one spike": spike}
    return {name: shape / shape.sum() for name, shape in shapes.items()}


# (values, epsilon per unit, reports) of the ``starts`` and ``weights`` tables.
STARTS_ROWS = (
    (30, 0.5, 200),
    (30, 0.5, 1000),
    (30, 1.0, 200),
    (100, 0.5, 1000),
    (30, 0.5, 5000),
    (10, 1.0, 500),
)
# Handicaps (nats) of the run from equal shares measured by ``weights``.
HANDICAPS = (1.0, 2.0, 4.0)


def geometric_survey(
    mechanism: Geometric, truth_p: np.ndarray, n: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` users drawn from ``truth_p`` with ``seed``: their own shares and their report
    counts through ``mechanism``."""
    k = truth_p.size
    generator = np.random.default_rng(seed)
    users = generator.choice(k, size=n, p=truth_p)
    counts = np.bincount(sample(mechanism, users, generator), minlength=k)
    return np.bincount(users, minlength=k) / n, counts.astype(float)


def starts(seeds: range) -> None:
    print(
        "| values, epsilon per unit, reports | truth | raw reports' mean TV | two starts "
        "(default) | from equal shares alone | from the report shares alone | default: worst "
        "seed, seeds worse than raw |"
    )
    print("|---|---|---|---|---|---|---|")
    for k, epsilon, n in STARTS_ROWS:
        mechanism = Geometric(epsilon=epsilon, lo=0, hi=k - 1)
        channel = channel_for(mechanism)
        for name, truth_p in geometric_truths(k).items():
            raw, errors = [], np.zeros((len(seeds), 3))
            for row, seed in enumerate(seeds):
                truth, counts = geometric_survey(mechanism, truth_p, n, seed)
                fit = default_estimator(channel).fit(counts, channel)
                fits = (fit.frequencies_, *(run.frequencies_ for run in fit.runs_))
                errors[row] = [total_variation(truth, p) for p in fits]
                raw.append(total_variation(truth, counts / n))
            raw_a = np.asarray(raw)
            ratios = errors.mean(axis=0) / raw_a.mean()
            print(
                f"| {k}, {epsilon:g}, {n:,} | {name} | {raw_a.mean():.3f} | "
                + " | ".join(f"{r:.3f}" for r in ratios)
                + f" | {np.max(errors[:, 0] / raw_a):.2f}, "
                f"{int(np.sum(errors[:, 0] > raw_a))} of {len(seeds)} |",
                flush=True,
            )


def weights(seeds: range) -> None:
    columns = ["default", *(f"handicap {c:g}" for c in HANDICAPS), "reports run, 1 SE"]
    print("| values, epsilon per unit, reports | truth | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    worst, above = np.zeros(len(columns)), np.zeros(len(columns), dtype=int)
    for k, epsilon, n in STARTS_ROWS:
        mechanism = Geometric(epsilon=epsilon, lo=0, hi=k - 1)
        channel = channel_for(mechanism)
        for name, truth_p in geometric_truths(k).items():
            raw, errors = [], np.zeros((len(seeds), len(columns)))
            for row, seed in enumerate(seeds):
                truth, counts = geometric_survey(mechanism, truth_p, n, seed)
                default = default_estimator(channel).fit(counts, channel)
                uniform_run, reports_run = default.runs_
                cautious = IBU(start="reports", se_rule=1.0).fit(counts, channel)
                # The default's weight, then the handicapped ones (a handicap of c nats on the
                # score gap divides the odds by exp(c / T)).
                odds = logit(default.weight_)
                weights = [expit(odds - c / TWO_STARTS_TEMPERATURE) for c in HANDICAPS]
                fits = [default.frequencies_]
                fits += [
                    w * uniform_run.frequencies_ + (1 - w) * reports_run.frequencies_
                    for w in weights
                ]
                weight = default.weight_
                fits.append(
                    weight * uniform_run.frequencies_ + (1 - weight) * cautious.frequencies_
                )
                errors[row] = [total_variation(truth, p) for p in fits]
                raw.append(total_variation(truth, counts / n))
            ratios = errors.mean(axis=0) / np.mean(raw)
            worst, above = np.maximum(worst, ratios), above + (ratios > 1)
            print(
                f"| {k}, {epsilon:g}, {n:,} | {name} | "
                + " | ".join(f"{r:.3f}" for r in ratios)
                + " |",
                flush=True,
            )
    print("| worst row | | " + " | ".join(f"{w:.3f}" for w in worst) + " |")
    print("| rows above 1 | | " + " | ".join(str(a) for a in above) + " |")


def noise(seeds: range, rows: tuple[tuple[int, float, int], ...] = STARTS_ROWS) -> None:
    columns = ("default", "without the noise-level stop")
    print(
        "| values, epsilon per unit, reports | truth | raw reports' mean TV | "
        + " | ".join(f"{c}: mean TV / raw, worst seed, seeds worse" for c in columns)
        + " |"
    )
    print("|---|---|---|---|---|")
    ratios, worst = [], []
    default_sd = estimators.GEOMETRIC_DISCREPANCY_SD
    for k, epsilon, n in rows:
        mechanism = Geometric(epsilon=epsilon, lo=0, hi=k - 1)
        channel = channel_for(mechanism)
        for name, truth_p in geometric_truths(k).items():
            raw, errors = np.zeros(len(seeds)), np.zeros((len(seeds), len(columns)))
            for row, seed in enumerate(seeds):
                truth, counts = geometric_survey(mechanism, truth_p, n, seed)
                raw[row] = total_variation(truth, counts / n)
                for column, sd in enumerate((default_sd, None)):
                    with patch.object(estimators, "GEOMETRIC_DISCREPANCY_SD", sd):
                        fit = default_estimator(channel).fit(counts, channel).frequencies_
                    errors[row, column] = total_variation(truth, fit)
            ratios.append(errors.mean(axis=0) / raw.mean())
            worst.append(np.max(errors / raw[:, None], axis=0))
            cells = [
                f"{r:.3f}, {w:.2f}, {int(np.sum(e > raw))}"
                for r, w, e in zip(ratios[-1], worst[-1], errors.T, strict=True)
            ]
            print(
                f"| {k}, {epsilon:g}, {n:,} | {name} | {raw.mean():.3f} | "
                + " | ".join(cells)
                + " |",
                flush=True,
            )
    ratio_a, worst_a = np.asarray(ratios), np.asarray(worst)
    for column, name in enumerate(columns):
        print(
            f"{name}: {int(np.sum(ratio_a[:, column] > 1))} rows above the raw reports (largest "
            f"{ratio_a[:, column].max():.3f}); worst seed over 1.5 times them in "
            f"{int(np.sum(worst_a[:, column] > 1.5))} rows, over 2 in "
            f"{int(np.sum(worst_a[:, column] > 2))}; geometric mean of the rows' ratios "
            f"{math.exp(np.mean(np.log(ratio_a[:, column]))):.3f}"
        )


def excess(seeds: range) -> None:
    mechanism = Geometric(epsilon=0.5, lo=0, hi=29)
    channel, truth_p = channel_for(mechanism), geometric_truths(30)["Zipf, low end"]
    errors = np.zeros((len(seeds), 2))
    for row, seed in enumerate(seeds):
        truth, counts = geometric_survey(mechanism, truth_p, 200, seed)
        default = default_estimator(channel).fit(counts, channel).frequencies_
        errors[row] = total_variation(truth, default), total_variation(truth, counts / 200)
    default_mean, raw_mean = errors.mean(axis=0)
    difference = errors[:, 0] - errors[:, 1]
    band = 2 * difference.std(ddof=1) / math.sqrt(len(seeds))
    print(
        f"Zipf(1.1) over 30 values, 0.5 per unit, 200 reports, seeds {seeds.start}-"
        f"{seeds.stop - 1}: mean TV {default_mean:.4f} (default), {raw_mean:.4f} (raw reports); "
        f"ratio {default_mean / raw_mean:.3f}, two standard errors "
        f"{(default_mean - band) / raw_mean:.3f}-{(default_mean + band) / raw_mean:.3f}; "
        f"{np.mean(difference > 0):.0%} of seeds worse than the raw reports"
    )


def corner() -> None:
    rows = 16
    grid = equator_grid(rows, rows, 100.0)
    row, col = np.divmod(np.arange(grid.n_cells), grid.cols)
    mechanism = ExponentialGrid(epsilon=math.log(2) / 100, grid=grid, metric="manhattan")
    channel = channel_for(mechanism)
    piled = 1.0 / (1 + row + col) ** 2.2
    centred = np.exp(-((row - rows / 2) ** 2 + (col - grid.cols / 2) ** 2) / 8)
    for name, shape in (("corner", piled), ("centre", centred)):
        truth_p = shape / shape.sum()
        for n in (300, 2000):
            errors = np.zeros((12, 4))
            for index, seed in enumerate(range(200, 212)):
                generator = np.random.default_rng(seed)
                users = generator.choice(grid.n_cells, size=n, p=truth_p)
                truth = np.bincount(users, minlength=grid.n_cells) / n
                counts = np.bincount(sample(mechanism, users, generator), minlength=grid.n_cells)
                fit = default_estimator(channel).fit(counts.astype(float), channel).frequencies_
                raw = counts / n
                errors[index] = [
                    total_variation(truth, fit),
                    total_variation(truth, raw),
                    earth_movers_distance(truth, fit, grid),
                    earth_movers_distance(truth, raw, grid),
                ]
            tv_worse = int(np.sum(errors[:, 0] > errors[:, 1]))
            emd_worse = int(np.sum(errors[:, 2] > errors[:, 3]))
            mean = errors.mean(axis=0)
            print(
                f"{name}, {n} reports: TV default / raw {mean[0] / mean[1]:.3f} "
                f"({tv_worse} of 12 seeds worse), EMD {mean[2] / mean[3]:.3f} ({emd_worse} worse)",
                flush=True,
            )


def tails(surveys: int) -> None:
    mechanism = Geometric(epsilon=0.5, lo=18, hi=47)
    channel = channel_for(mechanism)
    truth_p = Population.zipf(30, 1.1).probabilities
    tv, lowest = [], []
    for seed in range(surveys):
        generator = np.random.default_rng(seed)
        users = generator.choice(30, size=200, p=truth_p)
        truth = np.bincount(users, minlength=30) / 200
        counts = np.bincount(sample(mechanism, users, generator), minlength=30).astype(float)
        fit = default_estimator(channel).fit(counts, channel).frequencies_
        tv.append(total_variation(truth, fit))
        lowest.append(fit[:10].sum())
    tv_a, low_a = np.asarray(tv), np.asarray(lowest)
    print(
        f"geometric, 200 users: TV median {np.median(tv_a):.3f}, max {tv_a.max():.3f}, "
        f"share above 0.3 {np.mean(tv_a > 0.3):.4f}; weight on the ten lowest: median "
        f"{np.median(low_a):.3f}, least {low_a.min():.3f} (truth {truth_p[:10].sum():.3f})"
    )
    oracle = OLH(epsilon=2.0, domain_size=3000)
    channel = channel_for(oracle)
    truth_p = Population.zipf(3000, 2.0).probabilities
    tv, largest = [], []
    for seed in range(surveys):
        generator = np.random.default_rng(seed)
        users = generator.choice(3000, size=300, p=truth_p)
        truth = np.bincount(users, minlength=3000) / 300
        counts = np.bincount(sample(oracle, users, generator), minlength=oracle.n_outputs)
        fit = estimate(oracle, counts, method="projection", channel=channel).frequencies
        tv.append(total_variation(truth, fit))
        largest.append(np.abs(truth - fit).max())
    tv_a, big = np.asarray(tv), np.asarray(largest)
    print(
        f"OLH, 300 users: TV median {np.median(tv_a):.3f}, max {tv_a.max():.3f}, share at least "
        f"0.7 {np.mean(tv_a >= 0.7):.4f}; largest error median {np.median(big):.3f}, max "
        f"{big.max():.3f}, share at least 0.25 {np.mean(big >= 0.25):.4f}"
    )
    # The k-RR commute campaign: one survey's error against the mean and spread of 40 (seed 11),
    # in standard deviations.
    labels = ["bus", "bike", "car", "foot", "train"]
    spec = CampaignSpec.from_dict(
        {"id": "commute", "title": "Commute", "mechanism": "krr", "epsilon": 2.0, "domain": labels}
    )
    population = Population.zipf(5, 1.1, labels=labels)
    methods = ["ibu", "inversion", "noisy"]

    def surveys_of(repeats: int, seed: int):
        return simulate(
            population, [spec], [300], methods=methods, repeats=repeats, seed=seed, progress=False
        ).rows

    spread = {row.method: (row.scores.tv, row.scores_sd.tv) for row in surveys_of(40, 11)}
    z: dict[str, list[float]] = {method: [] for method in methods}
    for seed in range(surveys):
        for row in surveys_of(1, 1000 + seed):
            mean, sd = spread[row.method]
            z[row.method].append((row.scores.tv - mean) / sd)
    print(
        "k-RR commute, 300 users, TV in standard deviations from the mean of 40 surveys: "
        + "; ".join(f"{method} {min(v):.2f} to {max(v):.2f}" for method, v in z.items())
    )


def main(argv: list[str]) -> int:
    by_seeds = {
        "planar": planar,
        "starts": starts,
        "weights": weights,
        "noise": noise,
        "excess": excess,
    }
    if len(argv) >= 2 and argv[0] in by_seeds:
        by_seeds[argv[0]](seed_range(argv[1]))
    elif argv[:1] == ["geometric"]:
        geometric()
    elif argv[:1] == ["corner"]:
        corner()
    elif len(argv) >= 2 and argv[0] == "tails":
        tails(int(argv[1]))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Accuracy and cost of the default estimate, against Norm-Sub, the MLE and hindsight-best IBU.

**Categorical rows** (randomized response, k-RR, OLH, Hadamard response, and k-RR over the
cells of a grid). For every row and seed the same noisy reports are estimated three ways:

* the **default**: ``estimate(mechanism, counts)`` as the service runs it (its method is
  whatever the service picks; the table says which);
* **Norm-Sub**: the unbiased matrix inversion projected onto the probability simplex
  (``MatrixInversion(postprocess="projection")``; Wang et al. 2020);
* the **MLE** (``MaximumLikelihood``, the service's method ``mle``): in closed form over
  randomized response and k-RR, elsewhere IBU run to convergence (from equal shares until no
  frequency changes by more than 1e-9 in a step, at most 10,000 steps; the table names the
  rows where it had not converged by then). Over OLH and Hadamard response IBU steps through
  the hashed channel; where one fit would take more than a few seconds it is not run (the
  table says so and gives the cost of one step), and the row's ratio is against Norm-Sub
  alone.

The table gives the mean error over the seeds of each, beside the **raw report shares**'
(the report counts normalised, what a dashboard would show without estimation: a column,
not a yardstick; OLH and Hadamard reports are hashes, not values, so they have none), and
the default's mean error over the smaller of Norm-Sub's and the MLE's, then the geometric
mean of that ratio over the rows.

**Planar rows** (planar Laplace): the default against **hindsight-best IBU**, IBU on the same
reports scored against the truth at every iteration up to 30, then about every 5% up to
1,000, and at the default's own count, the best kept. No estimator can know that count: it
is a bound to compare with, not a method. IBU at each checkpoint is a fit of that
many steps (``IBU(tol=1e-9).fit(counts, channel, n_iter=t)``), the path the service's IBU
takes.

Errors are the earth mover's distance in metres where the labels are the cells of a grid
(planar Laplace, k-RR over cells) and the total variation distance otherwise, against the
distribution of the users drawn (what their reports measure). The seeds (3100-3119) and the
synthetic populations' seed (7070) are none the earlier tables, sweeps and checks of the
defaults used (seeds 0-5, 100-107, 200-231, 400-431, 600-607, 700-707 and 900-979;
populations from seeds 77, 1234, 2024 and 4242). The San Francisco check-ins (``../shared/data/gowalla_sf_downtown.csv``)
are used when present (20 x 20 cells of 150 m, every check-in one report, or a resample);
without them those rows are skipped.

**Cost rows**: the default estimate with its intervals (the whole ``estimate()`` call) for a
64 x 64 planar campaign with 10^5 reports (a smooth and a spiky city) and for k-RR over
1,000 categories with 10^5 reports: medians over repeats, the channel built beforehand (the
service caches it), on the estimate's automatic threads and on one.

Writes section ``estimators`` of ``BENCHMARKS.md``. Run from the repository root::

    python scripts/bench_estimators.py             # full run (about 12 minutes on 2 shared cores)
    python scripts/bench_estimators.py --quick     # 2 seeds, a few rows, print only
    python scripts/bench_estimators.py --only "k-RR k=100" --seeds 5000-5031
        # some rows (name contains), other seeds; print only
    python scripts/bench_estimators.py --no-write  # everything, print only
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import (  # noqa: E402
    IBU,
    MatrixInversion,
    MaximumLikelihood,
    budget,
    channel_for,
    estimate,
)
from scripts.benchlib import seed_range, spiky_city, write_section  # noqa: E402
from shared.geo import Grid  # noqa: E402
from shared.mechanisms import (  # noqa: E402
    KRR,
    HadamardResponse,
    Mechanism,
    PlanarLaplace,
    RandomizedResponse,
)
from shared.oracles import OLH  # noqa: E402
from simulate.metrics import earth_movers_distance, total_variation  # noqa: E402
from simulate.populations import Population  # noqa: E402
from simulate.reproduce import data_region, square_region  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "estimators"
SF_CSV = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
SEEDS = tuple(range(3100, 3120))
POPULATION_SEED = 7070
# Hindsight-best IBU looks at every iteration up to this, then about every 5%.
DENSE_UNTIL = 30
PLANAR_CAP = 1000
# The MLE: IBU to convergence.
MLE_TOL = 1e-9
MLE_MAX_ITER = 10_000
TIMING_REPEATS = 7
# A campaign whose estimate takes over SLOW_S seconds is timed SLOW_REPEATS times.
SLOW_S, SLOW_REPEATS = 2.0, 3
# Errors below this (a share, or metres) are rounding: the estimate is exact.
EXACT = 1e-9
# The bars: a categorical row's default within 5% of the better of Norm-Sub and the
# MLE, a planar row's within 3% of hindsight-best IBU in the median seed.
CATEGORICAL_BAR = 1.05
PLANAR_BAR = 1.03
# The demo's commute-mode question (walk, bike, bus, train, car, scooter, other).
COMMUTE_SHARES = (0.35, 0.25, 0.15, 0.10, 0.08, 0.05, 0.02)


@dataclass(frozen=True)
class Case:
    """One row: a truth, a mechanism, how many reports, and how to score."""

    name: str
    truth: np.ndarray
    mechanism: Mechanism
    n: int | None  # None: every row of a data set once
    rows: np.ndarray | None = None
    grid: Grid | None = None  # score by EMD on this grid, else by total variation
    mle: bool = True  # False: IBU to convergence costs too much here to run every seed

    def reports(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Report counts of one seed, and the distribution of those users' true values."""
        generator = np.random.default_rng(seed)
        if self.rows is not None:
            users = (
                self.rows
                if self.n is None
                else self.rows[generator.integers(0, self.rows.size, self.n)]
            )
            truth_counts = np.bincount(users, minlength=self.truth.size)
        else:
            truth_counts = generator.multinomial(self.n, self.truth)
            users = np.repeat(np.arange(self.truth.size), truth_counts)
        outputs = sample(self.mechanism, users, generator)
        counts = np.bincount(outputs, minlength=self.mechanism.n_outputs).astype(float)
        return counts, truth_counts / truth_counts.sum()

    def error(self, truth: np.ndarray, estimate: np.ndarray) -> float:
        estimate = np.maximum(estimate, 0.0)
        estimate = estimate / estimate.sum()
        if self.grid is not None:
            value = earth_movers_distance(truth, estimate, self.grid)
            assert value is not None
            return value
        return total_variation(truth, estimate)

    @property
    def reports_are_values(self) -> bool:
        """Whether a report is one of the values (so its shares are an estimate at all)."""
        return self.mechanism.n_outputs == self.truth.size and not isinstance(
            self.mechanism, (OLH, HadamardResponse)
        )


def bell(k: int) -> np.ndarray:
    """A discretised normal over the integers ``0..k-1``: mean ``k / 2``, standard deviation
    ``k / 8``, normalised (the spread-out truth of the geometric mechanism's benchmarks)."""
    values = np.arange(k)
    weights = np.exp(-0.5 * ((values - k / 2) / (k / 8)) ** 2)
    return weights / weights.sum()


def planar_grid(side_m: float, cell_m: float) -> Grid:
    # A hair under the side, so that rounding cannot add a row of cells.
    return Grid(square_region(37.7749, -122.4194, side_m - 0.01), cell_m)


def synthetic_categorical(k: int, shape: str, seed: int = POPULATION_SEED) -> np.ndarray:
    """A truth over ``k`` categories: ``"zipf"`` (Zipf(1.1)), ``"near-uniform"`` (also
    ``"uniform-ish"``: weights 1 to 1.3) or ``"spiky"`` (80% on 5 categories)."""
    generator = np.random.default_rng(seed)
    if shape == "zipf":
        return Population.zipf(k, 1.1).probabilities
    if shape in ("near-uniform", "uniform-ish"):
        weights = 1 + 0.3 * generator.random(k)
    elif shape == "spiky":
        spikes = min(5, k // 2)
        weights = np.full(k, 0.2 / (k - spikes))
        weights[generator.choice(k, spikes, replace=False)] = 0.8 / spikes
    else:
        raise ValueError(shape)
    return weights / weights.sum()


def krr_case(shape: str, k: int, epsilon: float, n: int) -> Case:
    """k-RR over ``k`` categories with a :func:`synthetic_categorical` truth."""
    mechanism = KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)])
    truth = synthetic_categorical(k, shape)
    return Case(f"{shape} k-RR k={k:,} eps={epsilon:g}, n={n:,}", truth, mechanism, n)


def oracle_case(kind: str, shape: str, k: int, epsilon: float, n: int, mle: bool) -> Case:
    """OLH (``kind="olh"``) or Hadamard response over ``k`` values, a synthetic truth."""
    if kind == "olh":
        mechanism: Mechanism = OLH(epsilon=epsilon, domain_size=k)
        label = "OLH"
    else:
        mechanism = HadamardResponse(epsilon=epsilon, domain_size=k)
        label = "Hadamard"
    truth = synthetic_categorical(k, shape)
    name = f"{shape} {label} k={k:,} eps={epsilon:g}, n={n:,}"
    return Case(name, truth, mechanism, n, mle=mle)


# (shape, k, epsilon, n) of the k-RR rows over synthetic truths: every k, shape and epsilon,
# reports from 500 to 10^6.
KRR_ROWS = (
    ("zipf", 10, 2.0, 10_000),
    ("spiky", 10, 1.0, 1000),
    ("near-uniform", 10, 0.5, 500),
    ("zipf", 10, 8.0, 500),
    ("near-uniform", 10, 4.0, 1_000_000),
    ("zipf", 100, 1.0, 500),
    ("zipf", 100, 1.0, 10_000),
    ("near-uniform", 100, 1.0, 100_000),
    ("spiky", 100, 2.0, 1000),
    ("zipf", 100, 4.0, 1_000_000),
    ("spiky", 100, 8.0, 10_000),
    ("near-uniform", 100, 0.5, 10_000),
    ("zipf", 1000, 2.0, 100_000),
    ("spiky", 1000, 1.0, 10_000),
    ("near-uniform", 1000, 4.0, 1_000_000),
    ("zipf", 1000, 0.5, 1_000_000),
    ("spiky", 1000, 8.0, 10_000),
)
# (kind, shape, k, epsilon, n, MLE measured) of the OLH and Hadamard rows. The MLE is run
# where a fit costs a few seconds at most (up to 10,000 steps of about 0.3 ms for OLH over 100
# values, 0.2 ms for Hadamard over 1,000); OLH over 1,000 values takes about 2 ms a step and
# over 10^5 0.4 s, Hadamard over 10^5 15 ms.
ORACLE_ROWS = (
    ("olh", "zipf", 100, 1.0, 10_000, True),
    ("olh", "near-uniform", 1000, 2.0, 100_000, False),
    ("olh", "zipf", 100_000, 4.0, 1_000_000, False),
    ("hadamard", "spiky", 100, 2.0, 10_000, True),
    ("hadamard", "zipf", 1000, 1.0, 100_000, True),
    ("hadamard", "zipf", 100_000, 1.0, 1_000_000, False),
)
# (epsilon, p(yes), n) of the randomized response rows.
RR_ROWS = ((0.5, 0.3, 1000), (1.0, 0.1, 10_000), (4.0, 0.3, 500))


def sf_grid() -> tuple[Grid, Population] | None:
    """The SF check-ins over 20 x 20 cells of 150 m, or None (with a note) without the file."""
    if not SF_CSV.is_file():
        print(f"(no {SF_CSV}: the San Francisco rows are skipped)", file=sys.stderr)
        return None
    grid = Grid(data_region(SF_CSV), 150.0)
    return grid, Population.from_csv_points(SF_CSV, grid)


def categorical_cases(quick: bool = False) -> list[Case]:
    out: list[Case] = []
    for epsilon, share, n in RR_ROWS[:1] if quick else RR_ROWS:
        truth = np.array([1 - share, share])
        rr = RandomizedResponse(epsilon=epsilon)
        out.append(Case(f"rr eps={epsilon:g} p(yes)={share:g}, n={n:,}", truth, rr, n))
    commute = KRR(epsilon=1.0, domain=[f"c{i}" for i in range(len(COMMUTE_SHARES))])
    shares = np.asarray(COMMUTE_SHARES) / sum(COMMUTE_SHARES)
    out.append(Case("commute shares k-RR k=7 eps=1, n=1,500", shares, commute, 1500))
    if not quick:
        zipf = Population.zipf(7, 1.1).probabilities
        out.append(Case("zipf k-RR k=7 eps=1, n=1,500", zipf, commute, 1500))
    for shape, k, epsilon, n in KRR_ROWS[::6] if quick else KRR_ROWS:
        out.append(krr_case(shape, k, epsilon, n))
    for row in ORACLE_ROWS[::3] if quick else ORACLE_ROWS:
        out.append(oracle_case(*row))
    sf = sf_grid()
    if sf is not None:
        grid, checkins = sf
        city = Population.clustered_city(grid, seed=POPULATION_SEED).probabilities
        n = int(checkins.rows.size)
        for label, epsilon in (("ln 8", math.log(8)), ("ln 16", math.log(16)))[
            : 1 if quick else None
        ]:
            krr = KRR(epsilon=epsilon, grid=grid)  # a campaign over the region's cells
            out.append(
                Case(
                    f"SF k-RR {label} over 400 cells, all ({n:,})",
                    checkins.probabilities,
                    krr,
                    None,
                    checkins.rows,
                    grid,
                )
            )
            if not quick:
                name = f"clustered city k-RR {label} over the same cells, n={n:,}"
                out.append(Case(name, city, krr, n, grid=grid))
    return out


def planar_cases(quick: bool = False) -> list[Case]:
    out: list[Case] = []
    sf = sf_grid()
    if sf is not None:
        grid, checkins = sf
        for label, per_100m, n in (
            ("ln 2 / 200 m", math.log(2) / 2, None),
            ("ln 2 / 100 m", math.log(2), None),
            ("ln 2 / 100 m", math.log(2), 1000),
        )[: 1 if quick else None]:
            planar = PlanarLaplace(epsilon=per_100m / 100, grid=grid)
            size = "all" if n is None else f"n={n:,}"
            out.append(
                Case(
                    f"SF planar {label}, {size}",
                    checkins.probabilities,
                    planar,
                    n,
                    checkins.rows,
                    grid,
                )
            )
    grid = planar_grid(2000.0, 100.0)
    city = Population.clustered_city(grid, seed=POPULATION_SEED).probabilities
    planar = PlanarLaplace(epsilon=math.log(2) / 100, grid=grid)
    for n in (1000,) if quick else (1000, 10_000):
        out.append(Case(f"clustered city planar ln 2 / 100 m, n={n:,}", city, planar, n, grid=grid))
    return out


def norm_sub(counts: np.ndarray, channel) -> np.ndarray:
    return MatrixInversion(postprocess="projection").fit(counts, channel).frequencies_


def fixed_ibu(counts: np.ndarray, channel, n_iter: int) -> np.ndarray:
    """IBU from equal shares for ``n_iter`` steps, or fewer where a step changes no frequency
    by more than :data:`MLE_TOL` (converged)."""
    return IBU(tol=MLE_TOL).fit(counts, channel, n_iter=n_iter).frequencies_


def maximum_likelihood(counts: np.ndarray, channel) -> tuple[np.ndarray, bool]:
    """The MLE (in closed form over k-RR, else IBU run to convergence, at most
    :data:`MLE_MAX_ITER` steps); and whether it converged before that cap."""
    fitted = MaximumLikelihood(tol=MLE_TOL, max_iter=MLE_MAX_ITER).fit(counts, channel)
    return fitted.frequencies_, bool(fitted.converged_)


def to_better(default: float, norm_sub: float, mle: float | None) -> float:
    """The default's error over the smaller of Norm-Sub's and the MLE's (Norm-Sub's alone
    where the MLE was not measured). Where that is exact (an error of 0), an exact default is
    its equal and any other infinitely worse."""
    best = norm_sub if mle is None else min(norm_sub, mle)
    if best > EXACT:
        return default / best
    return math.inf if default > EXACT else 1.0


def geometric_mean(ratios: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def step_seconds(channel) -> float:
    """The cost of one IBU step (a product each way through the channel), median of 3."""
    p = np.full(channel.n_inputs, 1.0 / channel.n_inputs)
    return median_seconds(lambda: channel.backward(channel.forward(p)), 3)


def run_categorical(case: Case, seeds: Sequence[int]) -> dict:
    channel = channel_for(case.mechanism)
    errors: dict[str, list[float]] = {"raw": [], "default": [], "norm_sub": [], "mle": []}
    methods, at_cap = set(), 0
    for seed in seeds:
        # Scored against the users' own distribution: what their reports measure.
        counts, truth = case.reports(seed)
        result = estimate(case.mechanism, counts, channel=channel)
        methods.add(result.method)
        errors["default"].append(case.error(truth, result.frequencies))
        errors["norm_sub"].append(case.error(truth, norm_sub(counts, channel)))
        if case.mle:
            frequencies, converged = maximum_likelihood(counts, channel)
            errors["mle"].append(case.error(truth, frequencies))
            at_cap += not converged
        if case.reports_are_values:
            errors["raw"].append(case.error(truth, counts / counts.sum()))
    means = {key: statistics.fmean(values) if values else None for key, values in errors.items()}
    assert means["default"] is not None and means["norm_sub"] is not None
    return {
        "case": case,
        "means": means,
        "ratio": to_better(means["default"], means["norm_sub"], means["mle"]),
        "methods": sorted(methods),
        "step_seconds": None if case.mle else step_seconds(channel),
        "mle_at_cap": at_cap,
        "seeds": len(seeds),
    }


def checkpoints(cap: int) -> list[int]:
    points = list(range(1, DENSE_UNTIL + 1))
    while points[-1] < cap:
        points.append(min(cap, points[-1] + max(1, points[-1] // 20)))
    return points


def ibu_errors(
    case: Case,
    channel,
    counts: np.ndarray,
    truth: np.ndarray,
    cap: int = PLANAR_CAP,
    also: int | None = None,
) -> tuple[np.ndarray, list[int]]:
    """IBU's error at every checkpoint of :func:`checkpoints` up to ``cap`` (and at ``also``,
    e.g. the default's own count), and the checkpoints: a fit of that many steps each, from
    equal shares."""
    points = sorted(set(checkpoints(cap)) | ({also} if also else set()))
    errors = [case.error(truth, fixed_ibu(counts, channel, point)) for point in points]
    return np.asarray(errors), points


def run_planar(case: Case, seeds: Sequence[int]) -> dict:
    channel = channel_for(case.mechanism)
    raw, default, best, ratios, iterations, best_at = [], [], [], [], [], []
    methods = set()
    for seed in seeds:
        counts, truth = case.reports(seed)
        result = estimate(case.mechanism, counts, channel=channel)
        methods.add(result.method)
        error = case.error(truth, result.frequencies)
        curve, points = ibu_errors(case, channel, counts, truth, also=result.n_iter)
        raw.append(case.error(truth, counts / counts.sum()))
        default.append(error)
        best.append(float(curve.min()))
        best_at.append(points[int(np.argmin(curve))])
        ratios.append(to_better(error, best[-1], None))
        if result.n_iter is not None:
            iterations.append(result.n_iter)
    return {
        "case": case,
        "raw": statistics.fmean(raw),
        "default": statistics.fmean(default),
        "best": statistics.fmean(best),
        "median": statistics.median(ratios),
        "worst": max(ratios),
        "iterations": statistics.median(iterations) if iterations else None,
        "best_at": statistics.median(best_at),
        "methods": sorted(methods),
        "seeds": len(seeds),
    }


def duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def methods_line(results: list[dict]) -> str:
    """Which method the default used on which rows."""
    rows: dict[str, list[str]] = {}
    for r in results:
        for method in r["methods"]:
            rows.setdefault(method, []).append(r["case"].name)
    if len(rows) == 1:
        return f"{next(iter(rows))} on every row"
    common = max(rows, key=lambda method: len(rows[method]))
    others = "; ".join(
        f"{method} on {', '.join(names)}" for method, names in rows.items() if method != common
    )
    return f"{others}; {common} on the other rows"


def categorical_table(results: list[dict]) -> str:
    lines = [
        "| row | metric | raw shares | default | Norm-Sub | MLE | default / better of the two |",
        "|---|---|---|---|---|---|---|",
    ]
    unmeasured = []
    for r in results:
        case, means = r["case"], r["means"]
        mle = number(means["mle"])
        ratio = f"{r['ratio']:.3f}"
        if means["mle"] is None:
            unmeasured.append(r)
            mle += f" [{len(unmeasured)}]"
            ratio += " (Norm-Sub only)"
        raw = number(means["raw"]) if case.reports_are_values else "— (hashed)"
        metric = "EMD (m)" if case.grid is not None else "TV"
        lines.append(
            f"| {case.name} | {metric} | {raw} | {number(means['default'])} "
            f"| {number(means['norm_sub'])} | {mle} | {ratio} |"
        )
    ratios = [r["ratio"] for r in results]
    over = [r for r in results if r["ratio"] > CATEGORICAL_BAR]
    worst = max(results, key=lambda r: r["ratio"])
    lines += [
        "",
        f"Geometric mean of default / better of the two over the {len(results)} rows: "
        f"**{geometric_mean(ratios):.4f}** (largest {worst['ratio']:.3f}, {worst['case'].name}; "
        f"smallest {min(ratios):.3f}). Rows above {CATEGORICAL_BAR}: "
        + (", ".join(f"{r['case'].name} ({r['ratio']:.3f})" for r in over) or "none")
        + ".",
    ]
    for index, r in enumerate(unmeasured, 1):
        seconds = r["step_seconds"]
        lines.append(
            f"\n[{index}] {r['case'].name}: the MLE not measured; one IBU step through this "
            f"channel costs {seconds * 1e3:.3g} ms here, so a fit of up to {MLE_MAX_ITER:,} "
            f"steps could take {duration(seconds * MLE_MAX_ITER)} a seed."
        )
    capped = [r for r in results if r["mle_at_cap"]]
    lines.append(
        f"\nThe MLE had not converged (a step still changed a share by more than {MLE_TOL:g}) "
        f"at its cap of {MLE_MAX_ITER:,} steps on "
        + (
            ", ".join(f"{r['case'].name} ({r['mle_at_cap']} of {r['seeds']} seeds)" for r in capped)
            or "no row"
        )
        + ": there the column is IBU stopped at that cap, short of the MLE."
    )
    lines.append(
        "\nRaw shares: OLH and Hadamard reports are hashes and codes, not values, so they have "
        f"none. The default's method: {methods_line(results)}."
    )
    return "\n".join(lines)


def planar_table(results: list[dict]) -> str:
    lines = [
        "| row | raw shares (m) | default (m) | hindsight-best IBU (m) "
        "| default / hindsight-best: median seed, worst seed "
        "| median IBU iterations: default, hindsight-best |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        iterations = "—" if r["iterations"] is None else format(r["iterations"], "g")
        lines.append(
            f"| {r['case'].name} | {r['raw']:.4g} | {r['default']:.4g} | {r['best']:.4g} "
            f"| {r['median']:.3f}, {r['worst']:.3f} | {iterations}, {r['best_at']:g} |"
        )
    over = [r for r in results if r["median"] > PLANAR_BAR]
    lines += [
        "",
        "Mean EMD over the seeds in metres. Rows whose median seed is above "
        f"{PLANAR_BAR}: "
        + (", ".join(f"{r['case'].name} ({r['median']:.3f})" for r in over) or "none")
        + f". The default's method: {methods_line(results)}.",
    ]
    return "\n".join(lines)


def median_seconds(
    function: Callable[[], object], repeats: int, slow_s: float | None = None
) -> float:
    """The median time of ``repeats`` runs after a warm-up run (which loads compiled loops and
    makes FFT plans); :data:`SLOW_REPEATS` runs where the warm-up took over ``slow_s``."""
    started = time.perf_counter()
    function()
    if slow_s is not None and time.perf_counter() - started > slow_s:
        repeats = min(repeats, SLOW_REPEATS)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def timing_rows(repeats: int) -> list[tuple[str, str, int | None, float, float, str]]:
    """(campaign, method, IBU iterations, seconds on the automatic threads, on one, target)."""
    rows = []
    generator = np.random.default_rng(7)
    grid = planar_grid(64 * 50.0, 50.0)
    assert (grid.rows, grid.cols) == (64, 64), (grid.rows, grid.cols)
    city = Population.clustered_city(grid, seed=POPULATION_SEED).probabilities
    spiky = spiky_city(grid, seed=POPULATION_SEED).probabilities
    planar = PlanarLaplace(epsilon=math.log(2) / 100, grid=grid)
    krr = KRR(epsilon=2.0, domain=[f"c{i}" for i in range(1000)])
    zipf = Population.zipf(1000, 1.1).probabilities
    for label, mechanism, truth, n, target in (
        ("planar 64 x 64, ln 2 / 100 m, 50 m cells, 10^5 reports", planar, city, 10**5, "< 1 s"),
        ("the same, spiky city (40 hotspots of 20-60 m)", planar, spiky, 10**5, "< 1 s"),
        ("k-RR k = 1,000, eps = 2, Zipf(1.1), 10^5 reports", krr, zipf, 10**5, "< 0.1 s"),
    ):
        users = np.repeat(np.arange(truth.size), generator.multinomial(n, truth))
        counts = np.bincount(sample(mechanism, users, generator), minlength=truth.size)
        channel = channel_for(mechanism)

        def run(m=mechanism, c=channel, y=counts):
            return estimate(m, y, channel=c)

        full = median_seconds(run, repeats, SLOW_S)
        with budget.limited(threads=1):
            single = median_seconds(run, repeats, SLOW_S)
        result = run()
        rows.append((label, result.method, result.n_iter, full, single, target))
    return rows


def timing_table(rows: list[tuple[str, str, int | None, float, float, str]]) -> str:
    threads = budget.automatic_threads()
    lines = [
        "| campaign | default method | IBU iterations "
        f"| default estimate with intervals, {threads} threads (s) "
        "| the same on one thread (s) | target |",
        "|---|---|---|---|---|---|",
    ]
    for label, method, iterations, full, single, target in rows:
        chosen = "—" if iterations is None else iterations
        lines.append(f"| {label} | {method} | {chosen} | {full:.3g} | {single:.3g} | {target} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, a few rows, print only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--only", default="", help="the rows whose name contains this; print only")
    parser.add_argument(
        "--seeds", type=seed_range, default=None, help='e.g. "5000-5031"; print only'
    )
    parser.add_argument(
        "--cost-only", action="store_true", help="only the cost rows (printed, not written)"
    )
    return parser.parse_args(argv)


def run_all(
    selected: list[Case], seeds: Sequence[int], runner: Callable[[Case, Sequence[int]], dict]
) -> list[dict]:
    results = []
    for case in selected:
        started = time.perf_counter()
        results.append(runner(case, seeds))
        print(f"{case.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = 2 if args.quick else TIMING_REPEATS
    if args.cost_only:
        print(timing_table(timing_rows(repeats)))
        return 0
    seeds = SEEDS[:2] if args.quick else SEEDS
    seeds = seeds if args.seeds is None else args.seeds
    categorical = [c for c in categorical_cases(args.quick) if args.only in c.name]
    planar = [c for c in planar_cases(args.quick) if args.only in c.name]
    parts = []
    seed_text = f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)} a row)"
    if categorical:
        table = categorical_table(run_all(categorical, seeds, run_categorical))
        parts.append(
            f"Mean error over {seed_text}, synthetic populations from seed {POPULATION_SEED}: "
            "the default estimate against Norm-Sub (the inversion projected onto the simplex) "
            "and the MLE (in closed form over randomized response and k-RR, else IBU to "
            f"convergence: tolerance {MLE_TOL:g}, at most {MLE_MAX_ITER:,} steps). TV: total variation distance; EMD: earth mover's "
            f"distance in metres over the cells.\n\n{table}"
        )
    if planar:
        table = planar_table(run_all(planar, seeds, run_planar))
        parts.append(
            f"Planar Laplace, {seed_text}: the default against hindsight-best IBU (IBU's best "
            f"iteration count on each seed, known only from the truth; checkpoints every "
            f"iteration to {DENSE_UNTIL}, then about every 5% to {PLANAR_CAP:,}, and the "
            f"default's own count).\n\n{table}"
        )
    printed_only = args.only or args.seeds is not None
    if not printed_only:
        timings = timing_table(timing_rows(repeats))
        parts.append(
            f"Cost of the default estimate with intervals (medians of {repeats} runs after a "
            f"warm-up, {min(repeats, SLOW_REPEATS)} where one took over {SLOW_S:g} s; channel "
            "built beforehand; the machine is shared, so these are noisy):"
            f"\n\n{timings}"
        )
    markdown = "\n\n".join(parts) + "\n"
    print(markdown)
    if not (args.quick or args.no_write or printed_only):
        print(f"wrote {write_section(SECTION, markdown)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

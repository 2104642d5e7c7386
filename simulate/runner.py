"""In-process simulation: perturb a population with a campaign's mechanism, estimate, score.

For each campaign spec (one per epsilon) and each number of users ``n``:

1. users are drawn from the population in chunks (:meth:`Population.index_chunks`),
   perturbed with the mechanism's vectorised sampler
   (:meth:`shared.mechanisms.Mechanism.sample`) and counted with ``bincount``,
   so memory does not grow with ``n`` (10^7 users take a few seconds);
2. every method estimates the distribution from the report counts alone;
3. each estimate is scored (:mod:`simulate.metrics`) against the
   *empirical* distribution of the simulated users' true values, which is
   what a campaign over those users tries to recover.

Randomness is seeded: the users of ``(seed, n, repeat)`` are the same for
every epsilon and mechanism (common random numbers make curves over epsilon
smooth), and the noise is seeded by ``(seed, n, repeat, spec)``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from aggregator.estimation import (
    IBU,
    METHODS,
    Channel,
    SingularChannelError,
    channel_for,
)
from aggregator.estimation.compute import Estimator, estimator_for
from aggregator.estimation.inversion import clip_and_normalise, project_to_simplex
from aggregator.estimation.oracles import oue_estimate
from shared.mechanisms import Mechanism
from shared.oracles import OUE
from shared.spec import OUE_NAME, CampaignSpec
from simulate.metrics import Scores, score
from simulate.populations import DEFAULT_CHUNK, Population, PopulationError
from simulate.sampling import oue_ones, sample

NOISY = "noisy"
# "noisy" is the report histogram taken as it is: the baseline every estimator should beat.
ALL_METHODS = (*METHODS, NOISY)
_SCORE_FIELDS = ("tv", "mse", "max_abs", "kl", "emd_m")


@dataclass(frozen=True)
class MethodRun:
    """One estimator's output on one set of report counts."""

    method: str
    frequencies: np.ndarray
    seconds: float
    n_iter: int | None = None
    converged: bool | None = None


@dataclass(frozen=True)
class ResultRow:
    """The accuracy of one method for one (mechanism, epsilon, n), averaged over repeats.

    ``scores`` holds the mean of each metric over the repeats and
    ``scores_sd`` its standard deviation (0 with one repeat); a metric that
    was undefined in any repeat is ``None`` in both.
    """

    mechanism: str
    epsilon: float
    n: int
    method: str
    repeats: int
    scores: Scores
    scores_sd: Scores
    seconds: float
    n_iter: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "n": self.n,
            "method": self.method,
            "repeats": self.repeats,
            **self.scores.to_dict(),
            **{f"{name}_sd": value for name, value in self.scores_sd.to_dict().items()},
            "seconds": self.seconds,
            "n_iter": self.n_iter,
        }


@dataclass(frozen=True)
class Snapshot:
    """The distributions of one run (the first repeat of a configuration), for plots."""

    spec: CampaignSpec
    n: int
    truth: np.ndarray
    reports: np.ndarray
    estimates: dict[str, np.ndarray]


@dataclass
class SimulationResult:
    """Rows of the accuracy table, and one snapshot per configuration."""

    population: Population
    rows: list[ResultRow] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "population": self.population.name,
            "inputs": self.population.size,
            "results": [row.to_dict() for row in self.rows],
        }


def _disabled(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: ``None`` shows bars on a terminal only."""
    return None if progress is None else not progress


def simulated_mechanism(spec: CampaignSpec) -> Mechanism | OUE:
    """The mechanism of a spec; ``oue``, which the service does not collect, included."""
    if spec.mechanism == OUE_NAME:
        return OUE(epsilon=spec.epsilon, domain=spec.domain, domain_size=spec.domain_size)
    return Mechanism.from_spec(spec)


def oue_runs(
    ones: np.ndarray, n: int, mechanism: OUE, methods: Sequence[str]
) -> dict[str, MethodRun]:
    """OUE's estimates from its per-bit counts: the unbiased one and its post-processings
    (IBU needs a channel with one output per report, which OUE has not: it is left out)."""
    started = time.perf_counter()
    unbiased, _ = oue_estimate(mechanism, ones, n)
    runs: dict[str, MethodRun] = {}
    for method in methods:
        if method == NOISY:
            frequencies = np.asarray(ones, dtype=float) / max(float(np.sum(ones)), 1.0)
        elif method == "projection":
            frequencies = project_to_simplex(unbiased)
        elif method == "clip":
            frequencies = clip_and_normalise(unbiased)
        elif method == "inversion":
            frequencies = unbiased
        else:
            continue
        runs[method] = MethodRun(method, frequencies, time.perf_counter() - started)
    return runs


def check_compatible(population: Population, mechanism: Mechanism | OUE) -> None:
    """The population's inputs must be the mechanism's (same labels, or same grid)."""
    cells = getattr(mechanism, "grid", None)
    if cells is not None:
        grid = population.grid
        if grid is None or (grid.rows, grid.cols) != (cells.rows, cells.cols):
            raise PopulationError(
                f"a {mechanism.name} campaign needs a location population on its grid",
                field="population",
            )
        return
    if mechanism.n_inputs != population.size:
        raise PopulationError(
            f"the campaign has {mechanism.n_inputs} labels, the population {population.size}",
            field="population",
        )
    domain = getattr(mechanism, "domain", None)
    if domain is not None and tuple(domain) != population.labels:
        raise PopulationError(
            "the population's labels are not the campaign's domain (in order)", field="population"
        )


def perturb(
    population: Population,
    mechanism: Mechanism | OUE,
    n: int | None,
    users: np.random.Generator,
    noise: np.random.Generator,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of true values and of reports for ``n`` simulated users (vectorised, chunked).

    For OUE the report counts are per bit: how many reports have each bit set.
    """
    true_counts = np.zeros(population.size, dtype=np.int64)
    if isinstance(mechanism, OUE):
        for chunk in population.index_chunks(n, users, chunk_size):
            true_counts += np.bincount(chunk, minlength=population.size)
        return true_counts, oue_ones(mechanism, true_counts, noise)
    report_counts = np.zeros(mechanism.n_outputs, dtype=np.int64)
    total = n if n is not None else population.n_rows
    chunks = population.index_chunks(n, users, chunk_size)
    n_chunks = -(-int(total) // chunk_size) if total else 0
    bar = tqdm(
        chunks,
        total=n_chunks,
        desc="perturbing",
        unit="chunk",
        leave=False,
        disable=True if n_chunks <= 2 else _disabled(progress),
    )
    for chunk in bar:
        true_counts += np.bincount(chunk, minlength=population.size)
        report_counts += np.bincount(sample(mechanism, chunk, noise), minlength=mechanism.n_outputs)
    return true_counts, report_counts


def estimate_methods(
    report_counts: np.ndarray,
    mechanism: Mechanism,
    methods: Sequence[str] = ALL_METHODS,
    *,
    seed: int = 0,
    ibu_iterations: int | None = None,
    channel: Channel | None = None,
) -> dict[str, MethodRun]:
    """Run each method on the report counts; a method the mechanism does not allow is left
    out. ``channel`` reuses the mechanism's operator, if already built.

    IBU stops by cross-validation (as the service's IBU does) unless
    ``ibu_iterations`` fixes the number of iterations.
    """
    channel = channel if channel is not None else channel_for(mechanism)
    counts = np.asarray(report_counts, dtype=float)
    runs: dict[str, MethodRun] = {}
    for method in methods:
        started = time.perf_counter()
        if method == NOISY:
            if channel.n_outputs != channel.n_inputs:
                continue  # reports are not values (OLH, Hadamard response): no raw histogram
            runs[method] = MethodRun(method, counts / counts.sum(), time.perf_counter() - started)
            continue
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(ALL_METHODS)}")
        fitted: Estimator
        if method == "ibu" and ibu_iterations is not None:
            fitted = IBU(seed=seed).fit(counts, channel, n_iter=ibu_iterations)
        else:
            try:
                fitted = estimator_for(method, mechanism, seed=seed).fit(counts, channel)
            except (SingularChannelError, ValueError):
                continue  # not this mechanism's (smoothing without cells), or not invertible
        runs[method] = MethodRun(
            method,
            np.asarray(fitted.frequencies_, dtype=float),
            time.perf_counter() - started,
            fitted.n_iter_,
            fitted.converged_,
        )
    return runs


def _summarise(trials: list[Scores]) -> tuple[Scores, Scores]:
    """Mean and standard deviation of each metric over the repeats."""
    means, sds = {}, {}
    for name in _SCORE_FIELDS:
        column = [getattr(s, name) for s in trials]
        defined = all(v is not None for v in column)
        means[name] = float(np.mean(column)) if defined else None
        sds[name] = float(np.std(column)) if defined else None
    # tv, mse and max_abs are defined for every estimate: only kl and emd_m may be None.
    return Scores(**means), Scores(**sds)  # type: ignore[arg-type]


def simulate(
    population: Population,
    specs: Sequence[CampaignSpec],
    ns: Sequence[int | None],
    *,
    methods: Sequence[str] = ALL_METHODS,
    repeats: int = 1,
    seed: int = 0,
    ibu_iterations: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: bool | None = None,
) -> SimulationResult:
    """The accuracy of every method for every (spec, n), averaged over ``repeats`` runs.

    ``ns`` may hold ``None`` for a data-set population: every row once.
    ``progress`` is ``None`` for bars on a terminal only, or True / False.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    mechanisms = [simulated_mechanism(spec) for spec in specs]
    for mechanism in mechanisms:
        check_compatible(population, mechanism)
    result = SimulationResult(population)
    grid = population.grid
    total = len(specs) * len(ns) * repeats
    with tqdm(
        total=total,
        desc="simulating",
        unit="run",
        disable=True if total <= 1 else _disabled(progress),
    ) as bar:
        for spec_index, (spec, mechanism) in enumerate(zip(specs, mechanisms, strict=True)):
            channel = None if isinstance(mechanism, OUE) else channel_for(mechanism)
            for n in ns:
                n_key = 0 if n is None else int(n)
                trials: dict[str, list[Scores]] = {m: [] for m in methods}
                seconds: dict[str, list[float]] = {m: [] for m in methods}
                iterations: dict[str, list[int | None]] = {m: [] for m in methods}
                n_users = 0
                for repeat in range(repeats):
                    users = np.random.default_rng([seed, n_key, repeat])
                    noise = np.random.default_rng([seed, n_key, repeat, spec_index, 1])
                    true_counts, report_counts = perturb(
                        population,
                        mechanism,
                        n,
                        users,
                        noise,
                        chunk_size=chunk_size,
                        progress=progress,
                    )
                    n_users = int(true_counts.sum())
                    truth = true_counts / n_users
                    if isinstance(mechanism, OUE):
                        runs = oue_runs(report_counts, n_users, mechanism, methods)
                    else:
                        assert channel is not None
                        runs = estimate_methods(
                            report_counts,
                            mechanism,
                            methods,
                            seed=seed + repeat,
                            ibu_iterations=ibu_iterations,
                            channel=channel,
                        )
                    for method, run in runs.items():
                        trials[method].append(score(truth, run.frequencies, grid))
                        seconds[method].append(run.seconds)
                        iterations[method].append(run.n_iter)
                    if repeat == 0:
                        result.snapshots.append(
                            Snapshot(
                                spec,
                                n_users,
                                truth,
                                report_counts / n_users,
                                {m: r.frequencies for m, r in runs.items()},
                            )
                        )
                    bar.update()
                for method in methods:
                    if not trials[method]:
                        continue
                    means, sds = _summarise(trials[method])
                    iters = iterations[method]
                    result.rows.append(
                        ResultRow(
                            mechanism=spec.mechanism,
                            epsilon=spec.epsilon,
                            n=n_users,
                            method=method,
                            repeats=len(trials[method]),
                            scores=means,
                            scores_sd=sds,
                            seconds=float(np.mean(seconds[method])),
                            n_iter=None if None in iters else float(np.mean(iters)),  # type: ignore[arg-type]  # no None left
                        )
                    )
    return result

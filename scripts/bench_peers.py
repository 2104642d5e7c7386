"""Side by side with the PyPI peers pure-ldp and multi-freq-ldpy: MSE and time per (mechanism, k,
epsilon).

For each mechanism, domain size ``k`` and ``epsilon``, ``--users`` users are drawn from a
Zipf(1.1) law over ``k`` values (one draw per seed), and:

* ours runs its full pipeline: the vectorised simulation sampler (``simulate.sampling.sample``),
  ``np.bincount`` of the reports, ``channel_for`` and the unbiased inversion followed by the
  Euclidean projection onto the simplex (``MatrixInversion(postprocess="projection")``);
* each peer runs its own full pipeline, user by user as its API goes (client ``privatise`` /
  ``*_Client`` per user, then its server's aggregation and estimate), in a forked process that is
  killed after ``--budget`` seconds ("> budget" in the table; larger ``k`` at the same epsilon is
  then not tried);
* each peer's estimator is also handed OUR reports, where its report space is ours, and compared
  with our estimator of the same post-processing on the same reports: that ratio compares
  estimators alone.

MSE is the mean over the ``k`` values of the squared error of the estimated frequencies against
the users' empirical frequencies. Ratios: MSE ours / peer (median over seeds of the per-seed ratio
on the same reports; mean MSE over seeds for the separate pipelines), time peer / ours (medians
over seeds). A second table gives our pipeline at ``--big-users`` users, where the peers are too
slow to follow.

Writes section ``peers`` of BENCHMARKS.md (``--no-write``: print only). The peers are the
``peers`` extra (``pip install -e '.[peers]'``); a peer that does not import is named and left out.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import MatrixInversion, channel_for  # noqa: E402
from aggregator.estimation.inversion import clip_and_normalise, project_to_simplex  # noqa: E402
from aggregator.estimation.oracles import OLHChannel, oue_estimate  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.mechanisms import KRR, HadamardResponse, Mechanism  # noqa: E402
from shared.oracles import OLH, OUE  # noqa: E402
from simulate.sampling import oue_ones, sample  # noqa: E402

SECTION = "peers"
MECHANISMS = ("k-RR", "Hadamard response", "OUE", "OLH")
KS = (100, 1_000, 10_000, 100_000)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
ZIPF_S = 1.1
PEER_INSTALL = "pip install -e '.[peers]'"
# A peer whose reports are k numbers a user (unary encoding) is not run when its reports
# would take more memory than this (the machine is shared).
REPORT_MEMORY_CAP = 2 * 2**30
POOL = 1024  # hash functions in a pool: ours by default, and pure-ldp's FastLH here
POOL_SIZES = (POOL, 16_384)  # OLH's pool sizes compared with fresh seeds
KINDS = ("linear", "served")
POOL_K = 100  # at this many values (a concentrated Zipf law: where the pool's error shows)


# --- ours -----------------------------------------------------------------------------------


@functools.cache
def labels(k: int) -> tuple[str, ...]:
    """A campaign's k labels, made once (the service has them from the spec): not timed."""
    return tuple(str(i) for i in range(k))


def our_mechanism(name: str, k: int, epsilon: float) -> Mechanism | OUE:
    if name == "k-RR":
        return KRR(epsilon=epsilon, domain=labels(k))
    if name == "Hadamard response":
        return HadamardResponse(epsilon=epsilon, domain_size=k)
    if name == "OUE":
        return OUE(epsilon=epsilon, domain_size=k)
    if name == "OLH":
        return OLH(epsilon=epsilon, domain_size=k)  # the default pool of hash functions
    raise ValueError(f"unknown mechanism {name!r}")


@dataclass
class OurRun:
    """One run of our pipeline: its reports, their counts, its time and its estimates.

    ``counts`` are the per-output report counts (per-bit counts of 1s for OUE, which has no
    reports here); ``support`` OLH's support counts (reports whose bucket is the value's under
    their seed).
    """

    reports: np.ndarray | None
    counts: np.ndarray
    seconds: float  # the whole pipeline, building the mechanism included
    build_seconds: float  # of which building the mechanism
    estimates: dict[str, np.ndarray]  # "inversion", "clip", "projection"
    n: int
    support: np.ndarray | None = None


def _one_pipeline(
    mechanism: Mechanism | OUE, values: np.ndarray, k: int, generator: np.random.Generator
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """(reports, counts, unbiased, projected): the timed part of our pipeline after building
    the mechanism."""
    if isinstance(mechanism, OUE):
        # The exact law of the per-bit sums of n users' reports, drawn in O(k) from the
        # users' value counts (simulate.sampling.oue_ones): no user's k bits are materialised.
        ones = oue_ones(mechanism, np.bincount(values, minlength=k), generator)
        unbiased, _ = oue_estimate(mechanism, ones, len(values))
        return None, ones, unbiased, project_to_simplex(unbiased)
    reports = sample(mechanism, values, generator)
    counts = np.bincount(reports, minlength=mechanism.n_outputs)
    fitted = MatrixInversion(postprocess="projection").fit(counts, channel_for(mechanism))
    return reports, counts, np.asarray(fitted.unbiased_), fitted.frequencies_


def our_pipeline(
    name: str, values: np.ndarray, k: int, epsilon: float, seed: int, repeats: int = 3
) -> OurRun:
    """Perturb every user, count the reports and estimate, timed from the mechanism's
    construction to the projected estimate (median of ``repeats`` runs on the same draws)."""
    labels(k)
    times, builds = [], []
    for _ in range(repeats):
        generator = np.random.default_rng([seed, 1])
        started = time.perf_counter()
        mechanism = our_mechanism(name, k, epsilon)
        built = time.perf_counter()
        reports, counts, unbiased, projected = _one_pipeline(mechanism, values, k, generator)
        times.append(time.perf_counter() - started)
        builds.append(built - started)
    unbiased = np.asarray(unbiased, dtype=float)
    estimates = {
        "inversion": unbiased,
        "clip": clip_and_normalise(unbiased),
        "projection": np.asarray(projected, dtype=float),
    }
    support = OLHChannel(mechanism).gather(counts) if isinstance(mechanism, OLH) else None
    return OurRun(
        reports,
        counts,
        statistics.median(times),
        statistics.median(builds),
        estimates,
        len(values),
        support,
    )


# --- peers ----------------------------------------------------------------------------------


def optional(module: str) -> Any | None:
    """Import a peer's module, or say that its rows are left out."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as exc:
        print(f"{module} does not import ({exc}); its rows are left out. Install: {PEER_INSTALL}")
        return None


def seed_peers(seed: int) -> None:
    """The peers draw from ``random`` and numpy's legacy global generator."""
    random.seed(seed)
    np.random.seed(seed % 2**32)


def identity(value: int) -> int:
    return value


@dataclass
class Peer:
    """One peer protocol and how to run it.

    ``pipeline(values, k, epsilon, seed)`` is the peer's whole pipeline, returning frequencies;
    ``on_ours(run, k, epsilon)`` its estimator on our reports (None where its reports are not
    ours); ``postprocess`` the post-processing of ours it matches; ``report_bytes(n, k)`` the
    memory its reports take at once (0 when it aggregates user by user).
    """

    mechanism: str
    library: str
    protocol: str
    postprocess: str
    pipeline: Callable[[np.ndarray, int, float, int], np.ndarray]
    on_ours: Callable[[OurRun, int, float], np.ndarray | None] | None = None
    report_bytes: Callable[[int, int], int] = lambda n, k: 0
    warmup: Callable[[int, float], None] | None = None
    notes: list[str] = field(default_factory=list)


def run_pure_ldp(client, server, values: np.ndarray, k: int) -> np.ndarray:
    """pure-ldp's own pipeline: every value privatised by ``client``, aggregated by
    ``server``, then its estimate of every value as a frequency."""
    for value in values.tolist():
        server.aggregate(client.privatise(value))
    return pure_ldp_estimate(server, None, len(values), k)


def pure_ldp_estimate(server, aggregated: Any, n: int, k: int) -> np.ndarray:
    """A pure-ldp server's estimate of every value as a frequency, over ``n`` reports; given
    ``aggregated``, from that aggregate (our reports) instead of its own."""
    if aggregated is not None:
        server.aggregated_data = aggregated
        server.n = n
    return np.asarray(server.estimate_all(range(k), suppress_warnings=True)) / n


def pure_ldp_peers() -> list[Peer]:
    oracles = optional("pure_ldp.frequency_oracles")
    if oracles is None:
        return []

    def de_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        client = oracles.DEClient(epsilon, k, index_mapper=identity)
        server = oracles.DEServer(epsilon, k, index_mapper=identity)
        return run_pure_ldp(client, server, values, k)

    def de_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        server = oracles.DEServer(epsilon, k, index_mapper=identity)
        return pure_ldp_estimate(server, run.counts.astype(float), int(run.counts.sum()), k)

    def hr_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        server = oracles.HadamardResponseServer(epsilon, k, index_mapper=identity)
        client = oracles.HadamardResponseClient(
            epsilon, k, server.get_hash_funcs(), index_mapper=identity
        )
        return run_pure_ldp(client, server, values, k)

    def hr_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray | None:
        if epsilon > 1:  # pure-ldp switches to its blocked variant: other reports
            return None
        server = oracles.HadamardResponseServer(epsilon, k, index_mapper=identity)
        return pure_ldp_estimate(server, run.reports, len(run.reports), k)

    def ue_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        client = oracles.UEClient(epsilon, k, use_oue=True, index_mapper=identity)
        server = oracles.UEServer(epsilon, k, use_oue=True, index_mapper=identity)
        return run_pure_ldp(client, server, values, k)

    def ue_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        server = oracles.UEServer(epsilon, k, use_oue=True, index_mapper=identity)
        return pure_ldp_estimate(server, run.counts.astype(float), run.n, k)

    def lh_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        client = oracles.LHClient(epsilon, k, use_olh=True, index_mapper=identity)
        server = oracles.LHServer(epsilon, k, use_olh=True, index_mapper=identity)
        return run_pure_ldp(client, server, values, k)

    def lh_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        server = oracles.LHServer(epsilon, k, use_olh=True, index_mapper=identity)
        return pure_ldp_estimate(server, np.asarray(run.support, dtype=float), run.n, k)

    def flh_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        server = oracles.FastLHServer(epsilon, k, POOL, use_olh=True, index_mapper=identity)
        client = oracles.FastLHClient(epsilon, k, POOL, use_olh=True, index_mapper=identity)
        return run_pure_ldp(client, server, values, k)

    return [
        Peer(
            "OUE",
            "pure-ldp",
            "UE (use_oue)",
            "inversion",
            ue_pipeline,
            ue_on_ours,
            notes=[
                "pure-ldp OUE: `UEClient.privatise` draws the k bits with `np.random.choice` per "
                "user, `UEServer.aggregate` adds each user's vector; on our reports its server "
                "gets our per-bit counts of 1s and is compared with our unbiased estimate."
            ],
        ),
        Peer(
            "OLH",
            "pure-ldp",
            "LH (use_olh)",
            "inversion",
            lh_pipeline,
            lh_on_ours,
            notes=[
                "pure-ldp OLH (`LHClient`/`LHServer`, use_olh): a fresh hash seed per user "
                "(`random.randint(0, sys.maxsize)`, xxhash32 of the value's decimal text), so "
                "the server hashes every value for every report (n k hashes in Python); ours "
                f"draws from a fixed pool of {POOL} seeds. Same g = round(e^epsilon) + 1. On our "
                "reports it gets our support counts (which its own hashes cannot recompute: the "
                "hash families differ) and is compared with our estimate as served, which also removes "
                "the pool's collision bias from the heavy values (so the ratio is not 1 there)."
            ],
        ),
        Peer(
            "OLH",
            "pure-ldp",
            f"FastLH (pool {POOL})",
            "inversion",
            flh_pipeline,
            notes=[
                f"pure-ldp FastLH: a pool of {POOL} xxhash seeds, like ours; its server hashes "
                "the whole pool x domain table in Python when built (twice: its constructor and "
                "its update_params both build it) and sums each value's support over the pool "
                "with `np.apply_along_axis`."
            ],
        ),
        Peer(
            "k-RR",
            "pure-ldp",
            "DE (direct encoding)",
            "inversion",
            de_pipeline,
            de_on_ours,
            notes=[
                "pure-ldp DE: `DEClient.privatise` per user (`random`), `DEServer.aggregate` per "
                "report, unbiased estimate (`estimate_all`, no normalisation); on our reports its "
                "server gets our counts and is compared with our unbiased inversion."
            ],
        ),
        Peer(
            "Hadamard response",
            "pure-ldp",
            "HR",
            "inversion",
            hr_pipeline,
            hr_on_ours,
            notes=[
                "pure-ldp HR: for epsilon <= 1 the same mechanism as ours (row x + 1 of the "
                "Sylvester matrix, K the power of two above k), so it decodes our reports and is "
                "compared with our unbiased inversion; for epsilon > 1 it switches to the blocked "
                "variant for general epsilon (a random permutation, blocks of outputs: another "
                "mechanism, with other reports), so only the separate pipelines compare there. "
                "Encoding is per user in Python (bit strings); decoding one recursive "
                "Walsh-Hadamard transform (per block above epsilon 1), no normalisation."
            ],
        ),
    ]


def multi_freq_peers() -> list[Peer]:
    grr = optional("multi_freq_ldpy.pure_frequency_oracles.GRR")
    ue = optional("multi_freq_ldpy.pure_frequency_oracles.UE")
    lh = optional("multi_freq_ldpy.pure_frequency_oracles.LH")
    estimators = optional("multi_freq_ldpy.estimators.Histogram_estimator")
    if grr is None or ue is None or lh is None or estimators is None:
        return []

    def grr_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        reports = [grr.GRR_Client(value, k, epsilon) for value in values.tolist()]
        return np.asarray(grr.GRR_Aggregator_MI(reports, k, epsilon))

    def grr_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        # GRR_Aggregator_MI counts the reports in a Python loop, then calls MI on the counts.
        p = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
        q = (1 - p) / (k - 1)
        return np.asarray(estimators.MI(run.counts.astype(float), int(run.counts.sum()), p, q))

    def grr_warmup(k: int, epsilon: float) -> None:
        grr.GRR_Client(0, k, epsilon)  # numba compiles on the first call: not timed

    def ue_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        reports = [ue.UE_Client(value, k, epsilon, True) for value in values.tolist()]
        return np.asarray(ue.UE_Aggregator_MI(reports, epsilon, True))

    def ue_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        q = 1 / (math.exp(epsilon) + 1)
        return np.asarray(estimators.MI(run.counts.astype(float), run.n, 0.5, q))

    def ue_warmup(k: int, epsilon: float) -> None:
        ue.UE_Client(0, k, epsilon, True)

    def lh_pipeline(values: np.ndarray, k: int, epsilon: float, seed: int) -> np.ndarray:
        seed_peers(seed)
        reports = [lh.LH_Client(value, k, epsilon, True) for value in values.tolist()]
        return np.asarray(lh.LH_Aggregator_MI(reports, k, epsilon, True))

    def lh_on_ours(run: OurRun, k: int, epsilon: float) -> np.ndarray:
        g = round(math.exp(epsilon)) + 1
        p = math.exp(epsilon) / (math.exp(epsilon) + g - 1)
        support = np.asarray(run.support, dtype=float)
        return np.asarray(estimators.MI(support, run.n, p, 1 / g))

    def lh_warmup(k: int, epsilon: float) -> None:
        lh.LH_Client(0, k, epsilon, True)

    return [
        Peer(
            "OUE",
            "multi-freq-ldpy",
            "UE (optimal)",
            "clip",
            ue_pipeline,
            ue_on_ours,
            report_bytes=lambda n, k: 8 * n * k,
            warmup=ue_warmup,
            notes=[
                "multi-freq-ldpy OUE: `UE_Client` per user (numba) returns k float64s, all kept "
                "in a list until `UE_Aggregator_MI` sums them (so not run where n k 8 bytes "
                f"exceed {REPORT_MEMORY_CAP / 2**30:g} GiB: '> memory'); estimate clipped and "
                "renormalised. On our reports its `MI` gets our per-bit counts."
            ],
        ),
        Peer(
            "OLH",
            "multi-freq-ldpy",
            "LH (optimal)",
            "clip",
            lh_pipeline,
            lh_on_ours,
            warmup=lh_warmup,
            notes=[
                "multi-freq-ldpy OLH: a fresh seed per user (`np.random.randint(0, "
                "sys.maxsize)`), `LH_Aggregator_MI` hashes every value for every report in "
                "Python (n k xxhash32 calls), then clips and renormalises; on our reports its "
                "`MI` gets our support counts (ours: the served estimate, clipped)."
            ],
        ),
        Peer(
            "k-RR",
            "multi-freq-ldpy",
            "GRR",
            "clip",
            grr_pipeline,
            grr_on_ours,
            warmup=grr_warmup,
            notes=[
                "multi-freq-ldpy GRR: `GRR_Client` per user (numba-compiled, compiled before "
                "timing; it draws the other value with `np.random.choice` over the k - 1 other "
                "values, O(k) a user), `GRR_Aggregator_MI` (counts in a Python loop, unbiased "
                "estimate clipped at 0 and renormalised); on our reports its `MI` gets our counts "
                "and is compared with our inversion + clip."
            ],
        ),
    ]


def all_peers() -> list[Peer]:
    return pure_ldp_peers() + multi_freq_peers()


# --- running --------------------------------------------------------------------------------


def run_with_budget(fn: Callable[[], np.ndarray], budget: float) -> tuple[float, np.ndarray] | str:
    """``fn()`` in a forked process, timed there: (seconds, result), or why there is none."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child() -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                started = time.perf_counter()
                result = np.asarray(fn(), dtype=float)
                sender.send((time.perf_counter() - started, result))
        except Exception as exc:  # the peer's failure is a row, not a crash
            sender.send(f"error: {type(exc).__name__}: {exc}")

    process = context.Process(target=child)
    process.start()
    try:
        outcome = receiver.recv() if receiver.poll(budget) else "> budget"
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()
    return outcome


def mse(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean((np.asarray(estimate, dtype=float) - truth) ** 2))


def zipf_values(k: int, n: int, seed: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, k + 1) ** ZIPF_S
    generator = np.random.default_rng([seed, k, 0])
    return generator.choice(k, size=n, p=weights / weights.sum())


@dataclass
class Row:
    mechanism: str
    k: int
    epsilon: float
    library: str
    protocol: str
    ours_mse: float
    ours_seconds: float
    ours_build_seconds: float
    same_ratio: float | None = None  # median over seeds of MSE ours / peer on our reports
    peer_mse: float | None = None  # mean over seeds, its own pipeline
    peer_seconds: float | None = None
    ours_matching_mse: float | None = None  # ours, the peer's post-processing, same seeds
    ours_projection_mse: float | None = None  # ours, projected, same seeds
    status: str = ""  # "> budget", "> memory", "skipped", an error


@dataclass
class Grid:
    mechanisms: Sequence[str]
    ks: Sequence[int]
    epsilons: Sequence[float]
    users: int
    seeds: int
    budget: float
    peer_seeds: int


def bench(grid: Grid, mechanisms: Sequence[str], peers: list[Peer]) -> list[Row]:
    rows = []
    for mechanism in mechanisms:
        mine = [peer for peer in peers if peer.mechanism == mechanism]
        for epsilon in grid.epsilons:
            given_up: set[str] = set()
            for k in grid.ks:
                values = [zipf_values(k, grid.users, seed) for seed in range(grid.seeds)]
                truths = [np.bincount(v, minlength=k) / grid.users for v in values]
                ours = [
                    our_pipeline(mechanism, v, k, epsilon, seed) for seed, v in enumerate(values)
                ]
                our_mses = [
                    mse(run.estimates["projection"], t) for run, t in zip(ours, truths, strict=True)
                ]
                our_seconds = statistics.median(run.seconds for run in ours)
                our_build = statistics.median(run.build_seconds for run in ours)
                print(
                    f"{mechanism} k={k} eps={epsilon:g}: ours {our_seconds:.3f} s, "
                    f"MSE {statistics.fmean(our_mses):.3g}",
                    file=sys.stderr,
                    flush=True,
                )
                for peer in mine:
                    row = Row(
                        mechanism,
                        k,
                        epsilon,
                        peer.library,
                        peer.protocol,
                        statistics.fmean(our_mses),
                        our_seconds,
                        our_build,
                    )
                    rows.append(row)
                    if peer.on_ours is not None:
                        ratios = []
                        for run, truth in zip(ours, truths, strict=True):
                            theirs = peer.on_ours(run, k, epsilon)
                            if theirs is not None:
                                ratios.append(
                                    mse(run.estimates[peer.postprocess], truth) / mse(theirs, truth)
                                )
                        row.same_ratio = statistics.median(ratios) if ratios else None
                    if peer.library + peer.protocol in given_up:
                        row.status = "> budget"
                        continue
                    if peer.report_bytes(grid.users, k) > REPORT_MEMORY_CAP:
                        row.status = "> memory"
                        continue
                    if peer.warmup is not None:
                        peer.warmup(k, epsilon)
                    seconds, errors = [], []
                    peer_draws = zip(values, truths, strict=True)
                    for seed, (v, truth) in enumerate(
                        itertools.islice(peer_draws, grid.peer_seeds)
                    ):
                        outcome = run_with_budget(
                            functools.partial(peer.pipeline, v, k, epsilon, seed), grid.budget
                        )
                        if isinstance(outcome, str):
                            row.status = outcome
                            if outcome == "> budget":
                                given_up.add(peer.library + peer.protocol)
                            break
                        seconds.append(outcome[0])
                        errors.append(mse(outcome[1], truth))
                    if seconds:
                        row.peer_seconds = statistics.median(seconds)
                        row.peer_mse = statistics.fmean(errors)
                        used = zip(ours[: len(errors)], truths[: len(errors)], strict=True)
                        row.ours_matching_mse = statistics.fmean(
                            mse(run.estimates[peer.postprocess], t) for run, t in used
                        )
                        row.ours_projection_mse = statistics.fmean(our_mses[: len(errors)])
                    print(
                        f"  {peer.library} {peer.protocol}: "
                        f"{row.status or f'{row.peer_seconds:.2f} s'}",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def pool_rows(grid: Grid, k: int, pools: Sequence[int]) -> list[tuple[float, list[float], float]]:
    """OLH's bounded pool against fresh seeds: per epsilon, our estimate's mean MSE at ``k``
    values, for each pool size the linear support estimate and the served one (the pool's
    collision bias peeled off the heavy values), and the closed-form MSE with a fresh hash
    function per user (the peers' LH), all against the users' frequencies."""
    out = []
    for epsilon in grid.epsilons:
        errors: list[list[float]] = [[] for _ in range(2 * len(pools))]
        fresh = []
        for seed in range(grid.seeds):
            values = zipf_values(k, grid.users, seed)
            truth = np.bincount(values, minlength=k) / grid.users
            for i, pool in enumerate(pools):
                mechanism = OLH(epsilon=epsilon, domain_size=k, pool_size=pool)
                reports = sample(mechanism, values, np.random.default_rng([seed, 1]))
                counts = np.bincount(reports, minlength=mechanism.n_outputs)
                channel = channel_for(mechanism)
                linear, _ = channel.solve_with_info(counts / grid.users)
                served, _ = channel.solve_counts(counts)
                errors[2 * i].append(mse(linear, truth))
                errors[2 * i + 1].append(mse(served, truth))
            excess = mechanism.p_keep - 1 / mechanism.g
            share = 1 / mechanism.g + truth * excess
            fresh.append(float(np.mean(share * (1 - share) / (grid.users * excess**2))))
        out.append((epsilon, [statistics.fmean(e) for e in errors], statistics.fmean(fresh)))
    return out


def big_rows(grid: Grid, users: int) -> list[tuple[str, int, float, float, float]]:
    """(mechanism, k, epsilon, median seconds, mean MSE) of our pipeline at ``users`` users."""
    out = []
    for mechanism in grid.mechanisms:
        for epsilon in grid.epsilons:
            for k in grid.ks:
                runs, errors = [], []
                for seed in range(grid.seeds):
                    values = zipf_values(k, users, seed)
                    run = our_pipeline(mechanism, values, k, epsilon, seed)
                    runs.append(run.seconds)
                    errors.append(
                        mse(run.estimates["projection"], np.bincount(values, minlength=k) / users)
                    )
                out.append(
                    (mechanism, k, epsilon, statistics.median(runs), statistics.fmean(errors))
                )
    return out


# --- the table ------------------------------------------------------------------------------


def ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def time_ratio(row: Row, budget: float) -> tuple[float, bool] | None:
    """(peer / ours, whether it is only a lower bound), or None without a figure."""
    if row.peer_seconds is not None:
        return row.peer_seconds / row.ours_seconds, False
    if row.status == "> budget":
        return budget / row.ours_seconds, True
    return None


def time_ratio_text(row: Row, budget: float) -> str:
    ratio = time_ratio(row, budget)
    if ratio is None:
        return "—"
    return f"{'> ' if ratio[1] else ''}{ratio[0]:,.0f}x"


def own_ratio(row: Row) -> float | None:
    if row.peer_mse is None or row.ours_matching_mse is None:
        return None
    return row.ours_matching_mse / row.peer_mse


def span(values: Sequence[float], digits: int = 2) -> str:
    return "—" if not values else f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def summary(rows: list[Row], budget: float, big_k: int = 10_000) -> list[str]:
    """One line a mechanism: the ranges of the MSE ratios and the smallest time ratio at
    ``k >= big_k``, against the goal (MSE no worse, time at least 10x better)."""
    lines = []
    for mechanism in dict.fromkeys(row.mechanism for row in rows):
        mine = [row for row in rows if row.mechanism == mechanism]
        same = [row.same_ratio for row in mine if row.same_ratio is not None]
        own = [(r, row) for row in mine if (r := own_ratio(row)) is not None]
        own_text = span([r for r, _ in own])
        if own:
            _, at = max(own, key=lambda pair: pair[0])
            own_text += f" (largest: {at.library} {at.protocol}, k = {at.k:,}, eps {at.epsilon:g})"
        timed = [(row, time_ratio(row, budget)) for row in mine if row.k >= big_k]
        ratios = [(ratio, row) for row, ratio in timed if ratio is not None]
        missing = [row for row, ratio in timed if ratio is None]
        if not ratios:
            time_text = f"no peer figure at k >= {big_k:,}"
        else:
            (slowest, bound), at = min(ratios, key=lambda pair: pair[0][0])
            met = "met" if slowest >= 10 else "**not met**"
            time_text = (
                f"time peer / ours at k >= {big_k:,}: at least {'> ' if bound else ''}"
                f"{slowest:,.0f}x (10x goal {met}; {at.library} {at.protocol}, k = {at.k:,})"
            )
            rest = [
                (budget if row.peer_seconds is None else row.peer_seconds)
                / max(row.ours_seconds - row.ours_build_seconds, 1e-9)
                for (_, _), row in ratios
            ]
            if any(row.ours_build_seconds > 0.2 * row.ours_seconds for _, row in ratios):
                time_text += f", {min(rest):,.0f}x leaving out building our mechanism"
        if missing:
            time_text += f"; {len(missing)} peer runs there without a figure ('> memory')"
        lines.append(
            f"- {mechanism}: MSE ours / peer on the same reports {span(same, 3)}, own pipelines "
            f"{own_text}; {time_text}."
        )
    return lines


def markdown(
    rows: list[Row],
    big: list,
    grid: Grid,
    big_users: int,
    peers: list[Peer],
    notes: Sequence[str],
    pools: list | None = None,
) -> str:
    lines = [
        f"Zipf({ZIPF_S:g}) truth, n = {grid.users:,} users, {grid.seeds} seeds (peers' own "
        f"pipelines: the first {grid.peer_seeds}); a peer's run is "
        f"cut after {grid.budget:g} s ('> budget': larger k at that epsilon not tried). "
        "Ours: vectorised simulation sampler + counts + unbiased inversion + projection onto "
        "the simplex, timed from building the mechanism (from its labels, or its domain size "
        "where it takes one) to the estimate. Peers: their own per-user "
        "clients and servers, from constructing them to the estimate. MSE ratio < 1: ours is "
        "better; time ratio: peer / ours (median over seeds).",
        "",
        *summary(rows, grid.budget),
        "",
        "| mechanism | k | epsilon | peer | MSE ratio, same reports | MSE ratio, own pipelines "
        "| MSE ratio, ours projected | ours (s) | of which building the mechanism (s) | peer (s) "
        "| time peer / ours |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = own_ratio(row)
        if ratio is None:
            own = projected = "—"
        else:
            own = f"{ratio:.2f}"
            projected = f"{(row.ours_projection_mse or math.nan) / row.peer_mse:.2f}"
        peer_seconds = row.status or (
            "—" if row.peer_seconds is None else f"{row.peer_seconds:.2f}"
        )
        lines.append(
            f"| {row.mechanism} | {row.k:,} | {row.epsilon:g} | {row.library} {row.protocol} | "
            f"{ratio_text(row.same_ratio)} | {own} | {projected} | {row.ours_seconds:.4f} | "
            f"{row.ours_build_seconds:.4f} | {peer_seconds} | "
            f"{time_ratio_text(row, grid.budget)} |"
        )
    if big:
        lines += [
            "",
            f"Ours alone at n = {big_users:,} users (same pipeline, {grid.seeds} seeds):",
            "",
            "| mechanism | k | epsilon | seconds (median) | MSE (projection, mean) |",
            "|---|---:|---:|---:|---:|",
        ]
        for mechanism, k, epsilon, seconds, error in big:
            lines.append(f"| {mechanism} | {k:,} | {epsilon:g} | {seconds:.3f} | {error:.3g} |")
    if pools:
        lines += [
            "",
            f"OLH's bounded pool against a fresh hash function per user (the peers' LH): our "
            f"estimate's MSE at k = {POOL_K} values, n = {grid.users:,}, {grid.seeds} seeds, "
            "by pool size, as the linear support estimate and as served (`solve_counts`: "
            "the pool's collision bias peeled off the heavy values), and the closed-form MSE "
            "with fresh seeds (in brackets: MSE / that):",
            "",
            "| epsilon | "
            + " | ".join(f"pool {pool:,}, {kind}" for pool in POOL_SIZES for kind in KINDS)
            + " | fresh seeds (closed form) |",
            "|---:|" + "---:|" * (2 * len(POOL_SIZES) + 1),
        ]
        for epsilon, errors, fresh in pools:
            cells = " | ".join(f"{error:.3g} ({error / fresh:.2f}x)" for error in errors)
            lines.append(f"| {epsilon:g} | {cells} | {fresh:.3g} |")
    lines += ["", "Notes:", ""]
    for peer in peers:
        lines += [f"- {note}" for note in peer.notes]
    lines += [
        "- MSE ratios are ours / peer. 'Same reports': the peer's estimator on the reports our "
        "sampler drew, against ours with the same post-processing (median over seeds of the "
        "ratio); 1.00 means the two estimators agree. 'Own pipelines': each side's estimate from "
        "its own sampler's reports (different randomness), ours with the peer's post-processing, "
        "mean MSE over seeds: near 1 when the mechanisms are the same. 'Ours projected': our "
        "pipeline's output (projection onto the simplex) against the peer's own output.",
        "- Ours is the simulation's vectorised numpy sampler; a device perturbs its one value "
        "with the exact CSPRNG sampler (`shared.rng`), which is not what is timed here.",
        *(
            [
                "- Ours on OUE draws no user's bits: the per-bit counts of 1s come from their "
                "exact law given the users' value counts (`simulate.sampling.oue_ones`, O(k) "
                "whatever n), where the peers build every user's k bits; its time ratio compares "
                "those pipelines, not per-user encoders."
            ]
            if any(row.mechanism == "OUE" for row in rows)
            else []
        ),
        *(
            [
                f"- Ours on OLH: the default pool of {POOL} hash functions (multiply-add-shift), "
                "the support counts by `OLHChannel` (numba-compiled with the fast extra). A "
                "fixed pool adds an error that does not shrink with n, largest on a "
                "concentrated law over few values: see the pool table."
            ]
            if any(row.mechanism == "OLH" for row in rows)
            else []
        ),
        *[f"- {note}" for note in notes],
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", action="append", choices=MECHANISMS)
    parser.add_argument("--k", type=int, action="append", help=f"domain sizes (default {KS})")
    parser.add_argument("--epsilon", type=float, action="append", help=f"default {EPSILONS}")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--big-users", type=int, default=1_000_000, help="0: no such table")
    parser.add_argument("--seeds", type=int, default=3, help="draws of the users, ours runs all")
    parser.add_argument(
        "--peer-seeds", type=int, help="of these, how many each peer runs (default: all)"
    )
    parser.add_argument("--budget", type=float, default=60.0, help="seconds a peer's run may take")
    parser.add_argument(
        "--no-pools",
        dest="pools",
        action="store_false",
        help="leave out OLH's pool-size table",
    )
    parser.add_argument("--note", action="append", default=[], help="a line under the table")
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    grid = Grid(
        mechanisms=args.mechanism or MECHANISMS,
        ks=sorted(args.k or KS),
        epsilons=args.epsilon or EPSILONS,
        users=args.users,
        seeds=args.seeds,
        budget=args.budget,
        peer_seeds=min(args.peer_seeds or args.seeds, args.seeds),
    )
    peers = all_peers()
    rows: list[Row] = []
    for done, mechanism in enumerate(grid.mechanisms, start=1):
        rows += bench(grid, [mechanism], peers)
        if not args.no_write and done < len(grid.mechanisms):  # a long run keeps what it has
            partial = ["- Partial: the run was still going when this was written."]
            used = [peer for peer in peers if peer.mechanism in grid.mechanisms[:done]]
            text = markdown(rows, [], grid, 0, used, [*args.note, *partial])
            write_section(SECTION, text)
    big = big_rows(grid, args.big_users) if args.big_users else []
    pools = pool_rows(grid, POOL_K, POOL_SIZES) if "OLH" in grid.mechanisms and args.pools else []
    used = [peer for peer in peers if peer.mechanism in grid.mechanisms]
    text = markdown(rows, big, grid, args.big_users, used, args.note, pools)
    print(text)
    if not args.no_write:
        print(f"wrote {write_section(SECTION, text)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())

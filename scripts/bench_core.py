"""Core benchmarks: estimator and sampler speed, peer libraries on identical data, IBU stopping.

One run measures every row and writes section ``core`` of ``BENCHMARKS.md``
(through ``scripts/benchlib.py``) with the machine, the command and the date:

* planar Laplace IBU on a 40 x 40 grid, 300 iterations, against qif's dense
  channel and IBU on the same counts (time ratio and total-variation distance);
* planar Laplace IBU on a 256 x 256 grid, 1,000 iterations, time and peak
  resident memory, measured in a fresh subprocess;
* k-RR IBU with k = 100,000, 1,000 iterations;

  these three on both estimation paths: the default install's (``scipy.fft``,
  numpy) and the ``fast`` extra's (FFTW and numba-compiled loops), where it is
  installed;
* k-RR perturbation: vectorised (10^7 users, k = 100) and the scalar secure
  on-device sampler (``secrets.SystemRandom``), per report;
* peers on k-RR (multi-freq-ldpy GRR with MI and IBU, pure-ldp direct
  encoding): time and MSE on the same noisy reports;
* the IBU stopping rule on a synthetic clustered city: earth mover's distance
  (metres) of the default cross-validated ``IBU()`` against the best fixed
  iteration count chosen in hindsight, and against 100 and 1,000 iterations.

Times are medians over repeats. ``--quick`` shrinks every size for a smoke run
and only prints. Run from the repository root::

    python scripts/bench_core.py           # full run (about 10 minutes on 2 cores)
    python scripts/bench_core.py --quick   # smoke run (well under a minute)

Peers are optional (``pip install qif pure-ldp multi-freq-ldpy``, plus
``scikit-learn statsmodels``, which pure-ldp imports without declaring them): a peer that
cannot be imported is reported and its rows are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtr

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import (  # noqa: E402
    IBU,
    MatrixInversion,
    MaximumLikelihood,
    channel_for,
    channels,
    fftw,
)
from scripts.benchlib import write_section  # noqa: E402
from shared.geo import EARTH_RADIUS_M, Grid, Region  # noqa: E402
from shared.mechanisms import KRR, PlanarLaplace  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "core"
SECTIONS = ("qif", "big-grid", "krr-ibu", "perturb", "peers", "stopping")
# pure-ldp imports scikit-learn and statsmodels without declaring them.
PEER_INSTALL = "pip install qif pure-ldp multi-freq-ldpy scikit-learn statsmodels"

# Planar Laplace setting shared by every planar row: level ln 2 within 100 m, 50 m cells.
EPSILON_PER_M = math.log(2) / 100
CELL_M = 50.0
# The city's hotspots (as simulate's clustered city): Gaussian, Zipf weights.
HOTSPOTS = 8
HOTSPOT_SPREAD_M = (100.0, 500.0)
BACKGROUND = 0.1
# A default stopping rule within this factor of the hindsight-best EMD meets the target.
STOPPING_TARGET = 1.10
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
NO_TARGET = "—"
# Alternating rounds of ours and qif's IBU (40x40 against qif); the median ratio is reported.
IBU_ROUNDS = 15
# The estimation paths: what the default install runs, and what the fast extra adds.
PATH_NAMES = {
    "default": "default path (scipy.fft, numpy)",
    "fast": "fast extra (FFTW, numba-compiled)",
}


@dataclass(frozen=True)
class Config:
    """Sizes of one run; :meth:`full` is the run that the targets are stated for."""

    quick: bool
    repeats: int
    qif_grid: int
    qif_users: int
    qif_iterations: int
    big_grid: int
    big_users: int
    big_iterations: int
    big_repeats: int
    krr_k: int
    krr_users: int
    krr_iterations: int
    perturb_users: int
    scalar_batch: int
    peer_k: int
    peer_epsilon: float
    peer_users: int
    peer_repeats: int
    stop_grid: int
    stop_users: tuple[int, ...]
    stop_seeds: tuple[int, ...]
    stop_iterations: tuple[int, ...]

    @classmethod
    def full(cls, repeats: int = 5) -> Config:
        return cls(
            quick=False,
            repeats=repeats,
            qif_grid=40,
            qif_users=100_000,
            qif_iterations=300,
            big_grid=256,
            big_users=1_000_000,
            big_iterations=1000,
            big_repeats=3,
            krr_k=100_000,
            krr_users=1_000_000,
            krr_iterations=1000,
            perturb_users=10_000_000,
            scalar_batch=2000,
            peer_k=100,
            peer_epsilon=2.0,
            peer_users=100_000,
            peer_repeats=repeats,
            stop_grid=64,
            stop_users=(5_000, 20_000, 100_000),
            stop_seeds=(0, 1, 2),
            stop_iterations=(2, 3, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000),
        )

    @classmethod
    def smoke(cls, repeats: int = 2) -> Config:
        return cls(
            quick=True,
            repeats=repeats,
            qif_grid=16,
            qif_users=20_000,
            qif_iterations=50,
            big_grid=64,
            big_users=100_000,
            big_iterations=50,
            big_repeats=1,
            krr_k=10_000,
            krr_users=100_000,
            krr_iterations=100,
            perturb_users=1_000_000,
            scalar_batch=500,
            peer_k=20,
            peer_epsilon=2.0,
            peer_users=10_000,
            peer_repeats=repeats,
            stop_grid=24,
            stop_users=(5_000,),
            stop_seeds=(0,),
            stop_iterations=(5, 20, 100, 300),
        )


@dataclass
class Report:
    """What a run measured: the target rows and one markdown block per section."""

    targets: list[tuple[str, str, str, str]] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def target(self, benchmark: str, measured: str, target: str, met: bool | None) -> None:
        if target == NO_TARGET:
            verdict = NO_TARGET
        else:
            verdict = "n/a (quick run)" if met is None else ("yes" if met else "**NO**")
        self.targets.append((benchmark, measured, target, verdict))
        print(f"  {benchmark}: {measured} (target {target}: {verdict})", flush=True)

    def markdown(self) -> str:
        parts = [
            "### Targets",
            "",
            table(("benchmark", "measured", "target", "met"), self.targets),
            *self.blocks,
        ]
        if self.notes:
            parts += ["", "Notes:", "", *(f"- {note}" for note in self.notes)]
        return "\n".join(parts) + "\n"


def seconds_text(seconds: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def median_seconds(
    fn: Callable[[], Any], repeats: int, *, warmup: bool = False
) -> tuple[float, Any]:
    """The median wall-clock time of ``fn()`` over ``repeats`` calls, and the last result."""
    if warmup:
        fn()
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def estimation_paths() -> list[str]:
    """The paths this environment can run: the default one, and the fast extra's if installed."""
    installed = all(importlib.util.find_spec(name) for name in ("pyfftw", "numba"))
    return ["default", "fast"] if installed else ["default"]


@contextlib.contextmanager
def estimation_path(path: str) -> Iterator[None]:
    """Channels built and fitted within run on ``path``: "default" hides the fast extra's
    compiled code, as in an install without it; "fast" insists on it."""
    saved = fftw.load, channels._krr_loops
    if path == "default":
        fftw.load = lambda: None
        channels._krr_loops = lambda: None
    elif fftw.load() is None or channels._krr_loops() is None:
        raise RuntimeError("the fast extra (pyFFTW, numba) is not installed")
    try:
        yield
    finally:
        fftw.load, channels._krr_loops = saved


def optional_peer(module: str) -> Any | None:
    """Import a peer library, or say clearly that its rows are skipped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as exc:
        print(f"  {module} is not importable ({exc}); skipping its rows. Install: {PEER_INSTALL}")
        return None


def square_grid(cells: int, cell_size_m: float = CELL_M) -> Grid:
    """A ``cells x cells`` report grid of ``cell_size_m`` cells, built from a lat/lon region."""
    side = cells * cell_size_m
    m_per_deg_lat = EARTH_RADIUS_M * math.pi / 180
    lat_min, lon_min = 45.0, 7.0
    lat_max = lat_min + side / m_per_deg_lat
    lat_mid = math.radians((lat_min + lat_max) / 2)
    lon_max = lon_min + side / (m_per_deg_lat * math.cos(lat_mid))
    grid = Grid(Region(lat_min, lat_max, lon_min, lon_max), cell_size_m)
    if (grid.rows, grid.cols) != (cells, cells):
        raise RuntimeError(f"expected a {cells}x{cells} grid, got {grid.rows}x{grid.cols}")
    return grid


def clustered_city(grid: Grid, seed: int) -> np.ndarray:
    """Cell probabilities of a synthetic city: Gaussian hotspots over a uniform background.

    ``HOTSPOTS`` centres uniform in the grid, standard deviations uniform in
    ``HOTSPOT_SPREAD_M``, Zipf weights (the j-th has weight 1/j, shuffled);
    each cell gets the mixture's exact mass (normal CDF), and a fraction
    ``BACKGROUND`` of the mass is spread uniformly.
    """
    generator = np.random.default_rng(seed)
    width, height = grid.width_m, grid.height_m
    centres_x = generator.uniform(0, width, HOTSPOTS)
    centres_y = generator.uniform(0, height, HOTSPOTS)
    sigmas = generator.uniform(*HOTSPOT_SPREAD_M, HOTSPOTS)
    weights = 1.0 / np.arange(1, HOTSPOTS + 1)
    weights = generator.permutation(weights / weights.sum())
    x_edges = np.arange(grid.cols + 1) * grid.cell_size_m
    y_edges = np.arange(grid.rows + 1) * grid.cell_size_m
    mass = np.zeros((grid.rows, grid.cols))
    for cx, cy, sigma, weight in zip(centres_x, centres_y, sigmas, weights, strict=True):
        mass += weight * np.outer(
            np.diff(ndtr((y_edges - cy) / sigma)), np.diff(ndtr((x_edges - cx) / sigma))
        )
    mass = (1 - BACKGROUND) * mass / mass.sum() + BACKGROUND / mass.size
    return mass.ravel() / mass.sum()


def planar_data(cells: int, users: int, seed: int) -> tuple[PlanarLaplace, np.ndarray, np.ndarray]:
    """The mechanism, the true histogram and the report counts of a clustered city."""
    mechanism = PlanarLaplace(epsilon=EPSILON_PER_M, grid=square_grid(cells))
    generator = np.random.default_rng(1000 + seed)
    probabilities = clustered_city(mechanism.grid, seed)
    truth = generator.choice(probabilities.size, size=users, p=probabilities)
    reports = sample(mechanism, truth, generator)
    n_cells = mechanism.grid.n_cells
    return (
        mechanism,
        np.bincount(truth, minlength=n_cells).astype(float),
        np.bincount(reports, minlength=n_cells).astype(float),
    )


def zipf(k: int, s: float = 1.1) -> np.ndarray:
    weights = 1.0 / np.arange(1, k + 1) ** s
    return weights / weights.sum()


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


# --- planar Laplace IBU against qif -------------------------------------------------------


def qif_child(cells: int, users: int, iterations: int, repeats: int, path: str) -> dict[str, Any]:
    """Run in a fresh process (so BLAS threads can be set): ours on ``path`` and qif on the
    same counts."""
    with estimation_path(path):
        return qif_compare(cells, users, iterations, repeats)


def qif_compare(cells: int, users: int, iterations: int, repeats: int) -> dict[str, Any]:
    mechanism, truth, counts = planar_data(cells, users, seed=0)
    fixed = MaximumLikelihood(tol=0.0, max_iter=iterations)
    # The first estimate of a fresh process pays for loading the compiled loops and for
    # planning the transforms; later channels of the same shape reuse both.
    start = time.perf_counter()
    fitted = fixed.fit(counts, channel_for(mechanism))
    cold_ours = time.perf_counter() - start
    build_ours, channel = median_seconds(lambda: channel_for(mechanism), repeats)
    ours = fitted.frequencies_.copy()
    assert fitted.n_iter_ == iterations, fitted.n_iter_
    result: dict[str, Any] = {
        "cold_ours": cold_ours,
        "build_ours": build_ours,
        "tv_ours": total_variation(ours, truth),
        "qif": False,
    }
    qif = optional_peer("qif")
    if qif is None:
        result["ibu_ours"] = median_seconds(lambda: fixed.fit(counts, channel), repeats)[0]
        return result
    # qif's planar_laplace_grid(width, height, step, epsilon): inputs and outputs numbered
    # row-major (y * width + x) like ours, epsilon per unit of step (metres here), outputs
    # remapped to the nearest cell; cell masses are integrated by Monte Carlo.
    build_qif, matrix = median_seconds(
        lambda: qif.mechanism.geo_ind.planar_laplace_grid(cells, cells, CELL_M, EPSILON_PER_M),
        max(1, repeats // 2),
    )
    frequencies = counts / counts.sum()

    def qif_ibu():
        return qif.channel.iterative_bayesian_update(
            matrix, frequencies, max_diff=0.0, max_iter=iterations
        )

    # The two IBUs alternate, round by round, so that both see the same state of a noisy
    # machine; the ratio reported is the median of the rounds' ratios.
    rounds = []
    for _ in range(IBU_ROUNDS):
        ours_s = median_seconds(lambda: fixed.fit(counts, channel), 1)[0]
        theirs_s, (theirs, qif_iter) = median_seconds(qif_ibu, 1)
        rounds.append((ours_s, theirs_s))
    result["ibu_ours"] = statistics.median(r[0] for r in rounds)
    ibu_qif = statistics.median(r[1] for r in rounds)
    result["ibu_ratio"] = statistics.median(r[1] / r[0] for r in rounds)
    assert qif_iter == iterations, qif_iter
    result.update(
        qif=True,
        build_qif=build_qif,
        ibu_qif=ibu_qif,
        tv_qif=total_variation(theirs, truth),
        gap=total_variation(ours, theirs),
        channel_gap=float(0.5 * np.abs(channel.to_dense() - matrix).sum(axis=1).max()),
    )
    return result


def bench_qif(cfg: Config, report: Report) -> None:
    g, iterations = cfg.qif_grid, cfg.qif_iterations
    print(f"planar Laplace IBU, {g}x{g}, {iterations} iterations, ours vs qif", flush=True)
    # Our FFTs run on one thread; qif's dense products use its bundled OpenBLAS, threaded by
    # default. Like for like is one thread each; the default threading is shown as well.
    runs = {}
    for path in estimation_paths():
        for label, threads in (("1 thread", "1"), ("default threads", None)):
            env = dict(os.environ)
            for variable in BLAS_THREAD_VARIABLES:
                env.pop(variable, None)
                if threads is not None:
                    env[variable] = threads
            arguments = [str(a) for a in (g, cfg.qif_users, iterations, cfg.repeats, path)]
            completed = subprocess.run(
                [sys.executable, __file__, "--child-qif", *arguments],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            )
            *messages, last = completed.stdout.strip().splitlines()
            for message in messages:  # e.g. that qif is missing
                print(message)
            runs[path, label] = json.loads(last)
    single = runs["default", "1 thread"]
    rows = [
        (
            f"ours, {PATH_NAMES[path]}, {label}",
            f"{run['build_ours']:.3f}",
            f"{run['ibu_ours']:.3f}",
            f"{run['build_ours'] + run['ibu_ours']:.3f}",
            f"{run['cold_ours']:.3f}",
            f"{run['tv_ours']:.4f}",
        )
        for (path, label), run in runs.items()
    ]
    if not single["qif"]:
        report.target(f"planar IBU {g}x{g}, {iterations} it vs qif", "qif missing", ">= 10x", False)
        report.blocks += ["", f"### Planar IBU vs qif ({g}x{g})", "", "qif not installed."]
        return
    rows += [
        (
            f"qif (dense matrix, C++), {label}, alongside ours on the {path} path",
            f"{run['build_qif']:.3f}",
            f"{run['ibu_qif']:.3f}",
            f"{run['build_qif'] + run['ibu_qif']:.3f}",
            "",
            f"{run['tv_qif']:.4f}",
        )
        for (path, label), run in runs.items()
    ]
    full = not cfg.quick
    for (path, label), run in runs.items():
        ratio_ibu = run["ibu_ratio"]
        ratio_total = (run["build_qif"] + run["ibu_qif"]) / (run["build_ours"] + run["ibu_ours"])
        ratio_cold = (run["build_qif"] + run["ibu_qif"]) / run["cold_ours"]
        what = f"planar IBU {g}x{g}, {iterations} it, {path} path: qif time / ours"
        report.target(
            f"{what}, IBU only, BLAS {label}",
            f"{ratio_ibu:.1f}x ({run['ibu_ours'] * 1e3:.0f} ms vs {run['ibu_qif'] * 1e3:.0f} ms)",
            ">= 10x",
            ratio_ibu >= 10 if full else None,
        )
        report.target(
            f"{what}, channel + IBU, BLAS {label}",
            f"{ratio_total:.1f}x",
            ">= 10x",
            ratio_total >= 10 if full else None,
        )
        report.target(
            f"{what}, channel + IBU with our first in a fresh process, BLAS {label}",
            f"{ratio_cold:.1f}x ({run['cold_ours']:.2f} s)",
            NO_TARGET,
            None,
        )
    report.blocks += [
        "",
        f"### Planar Laplace IBU vs qif ({g}x{g} grid, {CELL_M:g} m cells, "
        f"epsilon ln2/100 per m, {cfg.qif_users:,} users of a clustered city, "
        f"{iterations} iterations, same counts)",
        "",
        "Each configuration runs in its own process; '1 thread' sets "
        f"{', '.join(BLAS_THREAD_VARIABLES)} to 1 (our FFTs are single-threaded either way). "
        f"The two IBUs alternate over {IBU_ROUNDS} rounds; IBU times are the rounds' medians and "
        "the IBU ratios in the targets the median of the rounds' ratios. 'channel' is the "
        "median of repeated builds; on the fast path the first build of a process also loads "
        "the compiled loops (numba's on-disk cache) and plans the transforms by timing them "
        "(FFTW_MEASURE), which is what the fresh-process column adds.",
        "",
        table(
            (
                "implementation",
                "channel (s)",
                "IBU (s)",
                "total (s)",
                "first channel + IBU in a fresh process (s)",
                "TV to true histogram",
            ),
            rows,
        ),
        "",
        f"Total-variation distance between the two reconstructions (default path): "
        f"{single['gap']:.2e} (largest row TV between qif's Monte Carlo channel and ours: "
        f"{single['channel_gap']:.1e}).",
    ]


# --- 256 x 256 planar grid, in a subprocess for its peak memory ---------------------------


def planar_child(cells: int, users: int, iterations: int, path: str) -> dict[str, float]:
    """Run in a fresh process: build the channel, run IBU on ``path``, report times and peak
    RSS."""
    mechanism, _, counts = planar_data(cells, users, seed=0)
    with estimation_path(path):
        start = time.perf_counter()
        channel = channel_for(mechanism)
        built = time.perf_counter()
        fitted = MaximumLikelihood(tol=0.0, max_iter=iterations).fit(counts, channel)
        done = time.perf_counter()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "build_seconds": built - start,
        "ibu_seconds": done - built,
        "n_iter": fitted.n_iter_,
        "peak_rss_mib": peak_kib / 1024,
    }


def bench_big_grid(cfg: Config, report: Report) -> None:
    g, iterations = cfg.big_grid, cfg.big_iterations
    for path in estimation_paths():
        print(f"planar Laplace IBU, {g}x{g}, {iterations} iterations, {path} path", flush=True)
        runs = []
        for _ in range(cfg.big_repeats):
            arguments = [str(a) for a in (g, cfg.big_users, iterations, path)]
            completed = subprocess.run(
                [sys.executable, __file__, "--child-planar", *arguments],
                check=True,
                capture_output=True,
                text=True,
            )
            runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        assert all(run["n_iter"] == iterations for run in runs), runs
        ibu = statistics.median(run["ibu_seconds"] for run in runs)
        build = statistics.median(run["build_seconds"] for run in runs)
        peak = max(run["peak_rss_mib"] for run in runs)
        full = not cfg.quick
        report.target(
            f"planar IBU {g}x{g}, {iterations} it, {path} path: time",
            f"{seconds_text(ibu)} (+ {seconds_text(build)} channel)",
            "< 60 s",
            ibu + build < 60 if full else None,
        )
        report.target(
            f"planar IBU {g}x{g}, {iterations} it, {path} path: peak RSS (whole process)",
            f"{peak:.0f} MiB",
            "< 2 GB",
            peak * 2**20 < 2e9 if full else None,
        )


# --- k-RR ---------------------------------------------------------------------------------


def krr_mechanism(k: int, epsilon: float) -> KRR:
    return KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)])


def bench_krr_ibu(cfg: Config, report: Report) -> None:
    k, iterations = cfg.krr_k, cfg.krr_iterations
    print(f"k-RR IBU, k = {k:,}, {iterations} iterations", flush=True)
    mechanism = krr_mechanism(k, 1.0)
    generator = np.random.default_rng(0)
    truth = generator.choice(k, size=cfg.krr_users, p=zipf(k))
    counts = np.bincount(sample(mechanism, truth, generator), minlength=k).astype(float)
    channel = channel_for(mechanism)
    fixed = MaximumLikelihood(tol=0.0, max_iter=iterations)
    for path in estimation_paths():
        with estimation_path(path):
            seconds, fitted = median_seconds(lambda: fixed.fit(counts, channel), cfg.repeats)
        assert fitted.n_iter_ == iterations, fitted.n_iter_
        report.target(
            f"k-RR IBU, k = {k:,}, {iterations} it ({cfg.krr_users:,} users, epsilon 1), "
            f"{path} path",
            seconds_text(seconds),
            "< 5 s",
            seconds < 5 if not cfg.quick else None,
        )


def scalar_perturb_us(mechanism: Any, values: Sequence[Any], repeats: int) -> float:
    """Median over repeats of the mean time of one on-device ``perturb`` (secure default RNG)."""
    rng = secrets.SystemRandom()
    perturb = mechanism.perturb

    def batch() -> None:
        for value in values:
            perturb(value, rng)

    seconds, _ = median_seconds(batch, repeats, warmup=True)
    return seconds / len(values) * 1e6


def bench_perturb(cfg: Config, report: Report) -> None:
    print("k-RR perturbation: vectorised and scalar secure", flush=True)
    k = 100
    mechanism = krr_mechanism(k, 1.0)
    generator = np.random.default_rng(0)
    users = generator.integers(0, k, size=cfg.perturb_users)
    seconds, _ = median_seconds(lambda: sample(mechanism, users, generator), cfg.repeats)
    report.target(
        f"vectorised k-RR perturbation, {cfg.perturb_users:,} users, k = {k}",
        seconds_text(seconds),
        "< 2 s",
        seconds < 2 if not cfg.quick else None,
    )
    labels = [mechanism.domain[i] for i in generator.integers(0, k, size=cfg.scalar_batch)]
    micro = scalar_perturb_us(mechanism, labels, max(cfg.repeats, 5))
    report.target(
        f"scalar secure k-RR perturb (SystemRandom), k = {k}, per report",
        f"{micro:.1f} µs",
        "< 20 µs",
        micro < 20,
    )
    planar = PlanarLaplace(epsilon=EPSILON_PER_M, grid=square_grid(64))
    points = [
        {"lat": lat, "lon": lon}
        for lat, lon in (planar.grid.centre(int(i)) for i in generator.integers(0, 4096, 500))
    ]
    planar_micro = scalar_perturb_us(planar, points, max(cfg.repeats, 5))
    report.target(
        "scalar secure planar Laplace perturb (SystemRandom), 64x64 grid, per report",
        f"{planar_micro:.1f} µs",
        NO_TARGET,
        None,
    )


# --- peers on k-RR ------------------------------------------------------------------------


def bench_peers(cfg: Config, report: Report) -> None:
    k, epsilon, n = cfg.peer_k, cfg.peer_epsilon, cfg.peer_users
    print(f"peers on k-RR: k = {k}, epsilon = {epsilon:g}, n = {n:,}", flush=True)
    grr = optional_peer("multi_freq_ldpy.pure_frequency_oracles.GRR")
    direct = optional_peer("pure_ldp.frequency_oracles.direct_encoding")
    mechanism = krr_mechanism(k, epsilon)
    channel = channel_for(mechanism)

    fitted: dict[str, Any] = {}  # our estimators by row name, to read their iteration counts

    def ours(name: str, estimator: Any) -> tuple[str, str, Callable[[list[int]], np.ndarray]]:
        def run(reports: list[int]) -> np.ndarray:
            counts = np.bincount(np.asarray(reports), minlength=k).astype(float)
            return estimator.fit(counts, channel).frequencies_

        fitted[name] = estimator
        return ("ours", name, run)

    estimators: list[tuple[str, str, Callable[[list[int]], np.ndarray]]] = [
        ours("inversion (unbiased)", MatrixInversion()),
        ours("inversion + clip", MatrixInversion(postprocess="clip")),
        ours("inversion + simplex projection", MatrixInversion(postprocess="projection")),
        ours("IBU, default (cross-validated stop)", IBU()),
        ours("IBU, tol 1e-12 / 10,000 it", MaximumLikelihood(tol=1e-12)),
    ]
    if grr is not None:
        estimators += [
            (
                "multi-freq-ldpy",
                "GRR MI (clip + renormalise)",
                lambda r: grr.GRR_Aggregator_MI(r, k, epsilon),
            ),
            (
                "multi-freq-ldpy",
                "GRR IBU (defaults: tol 1e-12 / 10,000 it)",
                lambda r: grr.GRR_Aggregator_IBU(r, k, epsilon),
            ),
        ]
    if direct is not None:

        def pure_ldp(normalization: int) -> Callable[[list[int]], np.ndarray]:
            def run(reports: list[int]) -> np.ndarray:
                server = direct.DEServer(epsilon, k, index_mapper=lambda v: v)
                server.aggregate_all(reports)
                counts = server.estimate_all(
                    range(k), suppress_warnings=True, normalization=normalization
                )
                return np.asarray(counts, dtype=float) / n

            return run

        estimators += [
            ("pure-ldp", "DE (unbiased)", pure_ldp(0)),
            ("pure-ldp", "DE + simplex projection", pure_ldp(2)),
        ]
    times: dict[int, list[float]] = {i: [] for i in range(len(estimators))}
    errors: dict[int, list[float]] = {i: [] for i in range(len(estimators))}
    iterations: dict[int, list[int]] = {i: [] for i in range(len(estimators))}
    for repeat in range(cfg.peer_repeats):
        generator = np.random.default_rng(500 + repeat)
        truth = generator.choice(k, size=n, p=zipf(k))
        reports = sample(mechanism, truth, generator).tolist()
        true_frequencies = np.bincount(truth, minlength=k) / n
        for i, (_, _, run) in enumerate(estimators):
            if repeat == 0:
                run(reports[:1000])  # warm-up (numba compiles on first call)
            start = time.perf_counter()
            estimate = run(reports)
            times[i].append(time.perf_counter() - start)
            errors[i].append(float(np.mean((np.asarray(estimate) - true_frequencies) ** 2)))
            n_iter = getattr(fitted.get(estimators[i][1]), "n_iter_", None)
            if n_iter is not None:
                iterations[i].append(n_iter)
    baseline = statistics.fmean(errors[0])
    estimate_rows = [
        (
            library,
            name,
            f"{statistics.median(times[i]) * 1e3:.1f}",
            f"{statistics.fmean(errors[i]):.3e}",
            f"{statistics.fmean(errors[i]) / baseline:.2f}",
            f"{statistics.median(iterations[i]):.0f}" if iterations[i] else "—",
        )
        for i, (library, name, _) in enumerate(estimators)
    ]

    # Client-side perturbation, per report.
    generator = np.random.default_rng(7)
    batch = generator.choice(k, size=cfg.scalar_batch, p=zipf(k))
    labels = [mechanism.domain[i] for i in batch]
    perturb_rows = [
        (
            "ours",
            "`KRR.perturb` (exact integer weights)",
            "secrets.SystemRandom",
            f"{scalar_perturb_us(mechanism, labels, max(cfg.repeats, 5)):.2f}",
        )
    ]
    many = generator.choice(k, size=max(n, 10**6), p=zipf(k))
    vector_seconds, _ = median_seconds(lambda: sample(mechanism, many, generator), cfg.repeats)
    perturb_rows.append(
        (
            "ours",
            "`simulate.sampling.sample` (vectorised, simulation only)",
            "numpy PCG64",
            f"{vector_seconds / many.size * 1e6:.3f}",
        )
    )
    values = batch.tolist()
    if grr is not None:
        client = grr.GRR_Client

        def grr_batch() -> None:
            for value in values:
                client(value, k, epsilon)

        seconds, _ = median_seconds(grr_batch, max(cfg.repeats, 5), warmup=True)
        perturb_rows.append(
            (
                "multi-freq-ldpy",
                "`GRR_Client` (numba)",
                "numpy legacy MT19937",
                f"{seconds / len(values) * 1e6:.2f}",
            )
        )
    if direct is not None:
        de_client = direct.DEClient(epsilon, k, index_mapper=lambda v: v)

        def de_batch() -> None:
            for value in values:
                de_client.privatise(value)

        seconds, _ = median_seconds(de_batch, max(cfg.repeats, 5), warmup=True)
        perturb_rows.append(
            (
                "pure-ldp",
                "`DEClient.privatise`",
                "random (MT19937)",
                f"{seconds / len(values) * 1e6:.2f}",
            )
        )
    report.blocks += [
        "",
        f"### Peers on k-RR (k = {k}, epsilon = {epsilon:g}, n = {n:,} users, Zipf(1.1) truth, "
        f"{cfg.peer_repeats} repeats)",
        "",
        "Every estimator gets the same noisy reports (drawn with our `simulate.sampling.sample`) as a list of "
        "category indices, and its time includes counting them. MSE is the mean over categories "
        "of the squared error against the users' true frequencies, averaged over repeats; time "
        "is the median, and so is our IBU's iteration count (the peers do not report theirs).",
        "",
        table(
            ("library", "estimator", "time (ms)", "MSE", "MSE / ours inversion", "iterations"),
            estimate_rows,
        ),
        "",
        "Perturbation, one user's report (median over repeats of a batch's mean):",
        "",
        table(("library", "sampler", "randomness", "µs per report"), perturb_rows),
    ]


# --- IBU stopping rule --------------------------------------------------------------------


def cell_distances(grid: Grid) -> np.ndarray:
    """Euclidean distances in metres between all cell centres."""
    rows, cols = np.divmod(np.arange(grid.n_cells), grid.cols)
    centres = np.stack([(cols + 0.5) * grid.cell_size_m, (rows + 0.5) * grid.cell_size_m], axis=1)
    return np.sqrt(((centres[:, None, :] - centres[None, :, :]) ** 2).sum(axis=-1))


def earth_movers(truth: np.ndarray, estimate: np.ndarray, distances: np.ndarray) -> float:
    """Exact EMD (POT's network simplex) in metres between two histograms on the grid."""
    import ot

    a = truth / truth.sum()
    b = np.maximum(estimate, 0.0)
    b = b / b.sum()
    value, log = ot.emd2(a, b, distances, numItermax=50_000_000, log=True)
    if log.get("warning"):
        raise RuntimeError(f"POT did not solve the transport problem: {log['warning']}")
    return float(value)


def bench_stopping(cfg: Config, report: Report) -> None:
    g = cfg.stop_grid
    print(f"IBU stopping rule, {g}x{g} clustered city", flush=True)
    distances = cell_distances(square_grid(g))
    rows = []
    summary = []
    for users in cfg.stop_users:
        ratios = []
        for seed in cfg.stop_seeds:
            mechanism, truth, counts = planar_data(g, users, seed=seed)
            channel = channel_for(mechanism)
            default = IBU().fit(counts, channel)
            emd_default = earth_movers(truth, default.frequencies_, distances)
            fixed = {
                n_iter: earth_movers(
                    truth,
                    MaximumLikelihood(tol=0.0, max_iter=n_iter).fit(counts, channel).frequencies_,
                    distances,
                )
                for n_iter in cfg.stop_iterations
            }
            best_iter = min(fixed, key=fixed.get)
            ratio = emd_default / fixed[best_iter]
            ratios.append(ratio)
            rows.append(
                (
                    f"{users:,}",
                    seed,
                    f"{emd_default:.1f}",
                    default.n_iter_,
                    f"{fixed[best_iter]:.1f}",
                    best_iter,
                    f"{fixed.get(100, float('nan')):.1f}",
                    f"{fixed.get(1000, float('nan')):.1f}",
                    f"{ratio:.3f}",
                )
            )
            print(f"  n={users} seed={seed}: " + " | ".join(str(c) for c in rows[-1]), flush=True)
        met = sum(r <= STOPPING_TARGET for r in ratios)
        summary.append((users, statistics.median(ratios), max(ratios), met, len(ratios)))
        report.target(
            f"IBU() EMD / hindsight-best fixed EMD, {g}x{g}, n = {users:,}",
            f"median {statistics.median(ratios):.3f}, worst {max(ratios):.3f} "
            f"({len(ratios)} seeds)",
            f"<= {STOPPING_TARGET:.2f}",
            met == len(ratios) if not cfg.quick else None,
        )
    report.blocks += [
        "",
        f"### IBU stopping rule ({g}x{g} grid, {CELL_M:g} m cells, epsilon ln2/100 per m, "
        f"clustered city: {HOTSPOTS} Gaussian hotspots, sd {HOTSPOT_SPREAD_M[0]:g}-"
        f"{HOTSPOT_SPREAD_M[1]:g} m, {BACKGROUND:.0%} uniform background)",
        "",
        "Earth mover's distance (metres, exact, POT) between the users' true histogram and the "
        "reconstruction. `IBU()` is the default cross-validated stopping rule; the hindsight "
        "best is the smallest EMD over fixed iteration counts "
        f"{', '.join(str(i) for i in cfg.stop_iterations)} (which needs the truth, so no "
        "estimator can use it).",
        "",
        table(
            (
                "n",
                "seed",
                "IBU() EMD",
                "IBU() iterations",
                "best fixed EMD",
                "best fixed count",
                "EMD @100",
                "EMD @1000",
                "IBU() / best",
            ),
            rows,
        ),
    ]


# --- driver -------------------------------------------------------------------------------

RUNNERS = {
    "qif": bench_qif,
    "big-grid": bench_big_grid,
    "krr-ibu": bench_krr_ibu,
    "perturb": bench_perturb,
    "peers": bench_peers,
    "stopping": bench_stopping,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, print only")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (median)")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only these parts (repeatable); BENCHMARKS.md is written only by a full run",
    )
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        help="a note on the run for the section (repeatable), e.g. that the machine was shared",
    )
    parser.add_argument("--child-planar", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-qif", nargs=5, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_planar:
        *sizes, path = args.child_planar
        print(json.dumps(planar_child(*map(int, sizes), path)))
        return 0
    if args.child_qif:
        *sizes, path = args.child_qif
        print(json.dumps(qif_child(*map(int, sizes), path)))
        return 0
    if args.repeats is not None and args.repeats < 1:
        print("Error: --repeats must be >= 1", file=sys.stderr)
        return 2
    cfg = Config.smoke(args.repeats or 2) if args.quick else Config.full(args.repeats or 5)
    report = Report(notes=list(args.note))
    started = time.perf_counter()
    for name in args.only or SECTIONS:
        RUNNERS[name](cfg, report)
    markdown = report.markdown()
    print()
    print(markdown)
    print(f"(ran in {time.perf_counter() - started:.0f} s)")
    if args.quick or args.only or args.no_write:
        print("BENCHMARKS.md not written (quick, partial or --no-write run).")
    else:
        path = write_section(SECTION, markdown)
        print(f"wrote section {SECTION!r} of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

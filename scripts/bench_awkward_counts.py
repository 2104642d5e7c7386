"""Benchmark of the default estimate on report counts no honest population produces.

Flooded or broken clients can leave counts that no distribution of true values makes likely
under the campaign's mechanism: every report on one category, reports piled on a few values
where the noise spreads each report over the whole range. The estimate of such counts means
little, but it must come back (or stop with a clear answer) within the service's limits, and
not fail. Each case runs the estimate API's default method (or the one named) with its
intervals, under the service's default work cap and time limit (``LDP_ESTIMATE_MAX_WORK``,
``LDP_ESTIMATE_TIMEOUT_S``), median of ``--repeats`` runs after a warm-up on honest-looking
counts; the outcome is ``200`` (an estimate), ``422`` (over the work cap), ``503`` (over the
time limit) or ``500`` (the estimate failed), as the API would answer.

Writes the section ``awkward-counts`` of BENCHMARKS.md (``--no-write``: print only)::

    python scripts/bench_awkward_counts.py
"""

from __future__ import annotations

import argparse
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

from aggregator.estimation import budget, channel_for, estimate  # noqa: E402
from aggregator.http.estimates import DEFAULT_MAX_WORK, DEFAULT_TIMEOUT_S  # noqa: E402
from scripts.benchlib import equator_grid, write_section  # noqa: E402
from shared.mechanisms import (  # noqa: E402
    KRR,
    ExponentialGrid,
    Geometric,
    HadamardResponse,
    Mechanism,
    PlanarLaplace,
)

SECTION = "awkward-counts"
SEED = 1


# Awkward shapes of report counts (awkward_counts); the benchmark's cases take three of them,
# tests/aggregator/test_estimation_fuzz.py all.
SHAPES = ("one", "few", "even", "piled", "huge", "random")


def awkward_counts(outputs: int, shape: str, size: int, seed: int = SEED) -> np.ndarray:
    """Report counts over ``outputs`` of one of :data:`SHAPES`: ``size`` reports on one output
    (``one``), 0-2 on each (``few``), ``size`` spread evenly (``even``), ``size`` piled on a few
    outputs with shares drawn from Dirichlet(0.1) (``piled``), 10^12 on one (``huge``), up to
    10^9 on each (``random``); seeded, never all zero."""
    generator = np.random.default_rng(seed)
    counts = np.zeros(outputs)
    if shape == "one":
        counts[generator.integers(outputs)] = size
    elif shape == "few":
        counts = generator.integers(0, 3, outputs).astype(float)
    elif shape == "even":
        counts[:] = max(round(size / outputs), 1)
    elif shape == "piled":
        shares = generator.dirichlet(np.full(outputs, 0.1))
        counts = generator.multinomial(size, shares).astype(float)
    elif shape == "huge":
        counts[generator.integers(outputs)] = 10**12
    elif shape == "random":
        counts = generator.integers(0, 10**9, outputs).astype(float)
    else:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    if not counts.any():
        counts[0] = 1
    return counts


@dataclass(frozen=True)
class Case:
    name: str
    mechanism: Mechanism
    shape: str  # of awkward_counts
    size: int
    method: str | None = None


def cases() -> list[Case]:
    return [
        Case(
            "k-RR, 1,000 categories, epsilon 8: 10^7 reports on one",
            KRR(epsilon=8.0, domain=[f"c{i}" for i in range(1000)]),
            "one",
            10**7,
        ),
        Case(
            "k-RR, 3 categories, epsilon 0.01: 3,000 reports on one",
            KRR(epsilon=0.01, domain=["a", "b", "c"]),
            "one",
            3000,
        ),
        Case(
            "geometric, 11 values at 0.01 / unit: 1,000 reports piled",
            Geometric(epsilon=0.01, lo=0, hi=10),
            "piled",
            1000,
        ),
        Case(
            "geometric, 301 values at 0.01 / unit: 10^5 reports piled",
            Geometric(epsilon=0.01, lo=0, hi=300),
            "piled",
            100_000,
        ),
        Case(
            "planar, 3 x 1 cells of 100 m at 0.01 / 100 m: 10^4 reports even",
            PlanarLaplace(epsilon=1e-4, grid=equator_grid(3, 1, 100.0)),
            "even",
            10_000,
        ),
        Case(
            "exponential (Manhattan), 2 x 3 cells at 0.01 / 100 m: 1,000 piled",
            ExponentialGrid(epsilon=1e-4, grid=equator_grid(2, 3, 100.0), metric="manhattan"),
            "piled",
            1000,
        ),
        Case(
            "Hadamard response, 100 values, epsilon 0.01, method=ibu: 1,000 piled",
            HadamardResponse(epsilon=0.01, domain_size=100),
            "piled",
            1000,
            method="ibu",
        ),
    ]


def run(case: Case, repeats: int) -> tuple[str, float, str]:
    """(outcome, median seconds, what ran) of ``case``."""
    channel = channel_for(case.mechanism)
    outputs = case.mechanism.n_outputs
    estimate(case.mechanism, np.ones(outputs), method=case.method, channel=channel)  # warm-up
    counts = awkward_counts(outputs, case.shape, case.size)
    seconds, outcome, ran = [], "200", ""
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            with budget.limited(max_work=DEFAULT_MAX_WORK, timeout_s=DEFAULT_TIMEOUT_S):
                result = estimate(case.mechanism, counts, method=case.method, channel=channel)
            ran = result.estimator
        except budget.WorkLimitExceeded:
            outcome, ran = "422", "over the work cap"
        except budget.EstimateTimedOut:
            outcome, ran = "503", "over the time limit"
        except Exception as exc:  # what the API would answer with a 500
            outcome, ran = "500", f"failed: {type(exc).__name__}: {exc}"
        seconds.append(time.perf_counter() - started)
    return outcome, statistics.median(seconds), ran


def markdown(rows: list[tuple[Case, str, float, str]], repeats: int) -> str:
    lines = [
        "The default estimate with its intervals on report counts no honest population "
        "produces, under the service's default limits (a work cap of "
        f"{DEFAULT_MAX_WORK:,} units and {DEFAULT_TIMEOUT_S:g} s); median of {repeats} runs "
        "after a warm-up, on the estimate's default threads:",
        "",
        "| counts | answer | seconds | what ran |",
        "|---|---|---:|---|",
    ]
    for case, outcome, seconds, ran in rows:
        short = ran if len(ran) <= 110 else ran[:107] + "..."
        lines.append(f"| {case.name} | {outcome} | {seconds:.2f} | {short} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case")
    parser.add_argument("--only", help="the cases whose name contains this; print only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    rows = []
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        outcome, seconds, ran = run(case, args.repeats)
        print(f"{case.name}: {outcome} in {seconds:.2f} s", file=sys.stderr)
        rows.append((case, outcome, seconds, ran))
    text = markdown(rows, args.repeats)
    print(text)
    if not args.no_write and not args.only:
        print(f"wrote {write_section(SECTION, text)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

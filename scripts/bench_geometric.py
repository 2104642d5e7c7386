"""Benchmark of the geometric mechanism's estimates: cost by range size, and the inversion's
error against its closed-form variance.

Cost: 200,000 reports of 100 adjacent true values at 0.5 per unit, perturbed by the vectorised
sampler; each method of the estimate API (with its intervals, as the service computes them),
median of ``--repeats`` runs after one warm-up, on one thread.

Error: users drawn i.i.d. from a discretised normal over a range of 100 values, the unbiased
inversion's summed squared error over ``--seeds`` seeds, divided by the summed closed-form
variance (docs/mechanisms.md); a ratio near 1 says the formula (and the banded inverse) hold.

Writes the section ``geometric`` of BENCHMARKS.md and of docs/mechanisms.md (``--no-write``:
print only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for, estimate  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.mechanisms import Geometric  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "geometric"
DOC = ROOT / "docs" / "mechanisms.md"
SIZES = (1_000, 10_000, 100_000)
METHODS = ("inversion", "projection", "ibu")
REPORTS = 200_000
EPSILON = 0.5
ERROR_EPSILONS = (0.25, 0.5, 1.0)
ERROR_USERS = 100_000
ERROR_RANGE = 100


def cost_rows(repeats: int) -> list[tuple[int, str, float, int | None]]:
    """(m, method, median seconds, IBU iterations) per range size and method."""
    rows = []
    for m in SIZES:
        mechanism = Geometric(epsilon=EPSILON, lo=0, hi=m - 1)
        generator = np.random.default_rng(m)
        start = m * 2 // 5
        truth = generator.integers(start, start + 100, size=REPORTS)
        counts = np.bincount(sample(mechanism, truth, generator), minlength=m)
        channel = channel_for(mechanism)
        for method in METHODS:
            estimate(mechanism, counts, method=method, channel=channel)  # warm-up
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                result = estimate(mechanism, counts, method=method, channel=channel)
                seconds.append(time.perf_counter() - started)
            rows.append((m, method, statistics.median(seconds), result.n_iter))
            print(f"m={m} {method}: {statistics.median(seconds):.3f} s", file=sys.stderr)
    return rows


def error_rows(seeds: int) -> list[tuple[float, float, float]]:
    """(epsilon, mean summed squared error, summed closed-form variance) of the inversion."""
    values = np.arange(ERROR_RANGE)
    truth = np.exp(-0.5 * ((values - 45) / 12) ** 2)
    truth /= truth.sum()
    rows = []
    for epsilon in ERROR_EPSILONS:
        mechanism = Geometric(epsilon=epsilon, lo=0, hi=ERROR_RANGE - 1)
        channel = channel_for(mechanism)
        q = channel.forward(truth)
        second = channel.inversion_second_moment(q)
        closed = float(np.sum(second - truth**2) / ERROR_USERS)
        errors = []
        for seed in range(seeds):
            generator = np.random.default_rng([seed, int(epsilon * 100)])
            users = generator.choice(ERROR_RANGE, size=ERROR_USERS, p=truth)
            counts = np.bincount(sample(mechanism, users, generator), minlength=ERROR_RANGE)
            unbiased, _ = channel.solve_with_info(counts / ERROR_USERS)
            errors.append(float(np.sum((unbiased - truth) ** 2)))
        rows.append((epsilon, float(np.mean(errors)), closed))
    return rows


def markdown(costs: list, errors: list, repeats: int, seeds: int) -> str:
    lines = [
        f"Cost of one estimate with its intervals: {REPORTS:,} reports of 100 adjacent values at "
        f"{EPSILON} per unit, one thread, median of {repeats} runs after a warm-up (the machine "
        "is shared, so these are noisy):",
        "",
        "| values m | method | seconds | IBU iterations |",
        "|---:|---|---:|---:|",
    ]
    for m, method, seconds, n_iter in costs:
        lines.append(f"| {m:,} | {method} | {seconds:.4f} | {'-' if n_iter is None else n_iter} |")
    lines += [
        "",
        f"Unbiased inversion against its closed-form variance: {ERROR_USERS:,} users i.i.d. "
        f"from a discretised normal (mean 45, sd 12) over {ERROR_RANGE} values, {seeds} seeds:",
        "",
        "| epsilon per unit | mean summed squared error | closed form | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for epsilon, measured, closed in errors:
        lines.append(f"| {epsilon:g} | {measured:.4g} | {closed:.4g} | {measured / closed:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case")
    parser.add_argument("--seeds", type=int, default=200, help="seeds of the error check")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    text = markdown(cost_rows(args.repeats), error_rows(args.seeds), args.repeats, args.seeds)
    print(text)
    if not args.no_write:
        print(f"wrote {write_section(SECTION, text)}", file=sys.stderr)
        print(f"wrote {write_section(SECTION, text, path=DOC)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the large-domain frequency oracles (OLH, OUE, Hadamard response).

Four parts, all at epsilon = 1 (OLH: g = 4 buckets, S = 1024 seeds):

1. **Cost at a million values.** k = 10^6 values, n = 10^6 users from a Zipf(1.1) law; the
   estimate as the service computes it (with its analytic intervals) for OLH and Hadamard
   response, OUE's estimate from its per-bit counts; median seconds of ``--repeats`` runs after
   a warm-up, and the peak of memory allocated during one estimate (``tracemalloc``, which sees
   numpy's buffers).
2. **Error against the closed form.** k = 10^4, n = 10^5, the unbiased estimate's summed
   squared error over ``--seeds`` seeds divided by the summed closed-form variance
   ``sum_x pi_x (1 - pi_x) / (n (p - q*)^2)``. OLH: the estimate served (pool correction on),
   the plain support estimate with the fixed pool, and the plain one with a fresh pool each
   seed (which makes the pool's collisions part of the randomness).
3. **The seed pool's cost.** The plain support estimate's error ratio for pools of 64 to 4096
   seeds, for a flat (Zipf 1.1) and a concentrated (Zipf 1.5: 40% on one value) law, beside
   the pool-corrected estimate's, and the cost of one pass over the pool at k = 10^6.
4. **Post-processing.** The unbiased estimate, clipped and renormalised (Norm), projected onto
   the simplex (Norm-Sub: the same projection), and IBU (as an operator over the pool, a fixed
   number of iterations: cross-validating it costs ten times as much), MSE and TV against the
   users' true distribution, k = 10^4 and k = 10^6.

Writes the section ``oracles`` of BENCHMARKS.md and of docs/mechanisms.md (``--no-write``:
print only).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import IBU, channel_for, estimate  # noqa: E402
from aggregator.estimation.inversion import clip_and_normalise, project_to_simplex  # noqa: E402
from aggregator.estimation.oracles import oue_estimate  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.mechanisms import HadamardResponse  # noqa: E402
from shared.oracles import OLH, OUE, hash_parameters  # noqa: E402
from simulate.sampling import oue_ones, sample  # noqa: E402

SECTION = "oracles"
DOC = ROOT / "docs" / "mechanisms.md"
EPSILON = 1.0
BIG = 1_000_000
ERROR_K, ERROR_N = 10_000, 100_000
POOLS = (64, 256, 1024, 4096)
IBU_ITERATIONS = 200


def zipf(k: int, s: float) -> np.ndarray:
    weights = np.arange(1, k + 1, dtype=float) ** -s
    return weights / weights.sum()


def users(truth: np.ndarray, n: int, generator: np.random.Generator) -> np.ndarray:
    return generator.choice(truth.size, size=n, p=truth)


def fresh_pool(mechanism: OLH, offset: int) -> OLH:
    """The mechanism with another pool of hash functions (simulation only: seeds shifted)."""
    start = offset * mechanism.pool_size + 1_000_000
    mechanism.__dict__["pool"] = tuple(
        hash_parameters(start + s) for s in range(mechanism.pool_size)
    )
    return mechanism


def timed(function, repeats: int) -> tuple[float, float, object]:
    """(median seconds, peak MiB allocated in one run, last result) after a warm-up."""
    function()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - started)
    tracemalloc.start()
    function()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return statistics.median(seconds), peak, result


def cost_rows(repeats: int) -> list[tuple[str, str, float, float, float]]:
    """(mechanism, method, seconds, peak MiB, MSE) at k = n = 10^6."""
    generator = np.random.default_rng(1)
    truth = zipf(BIG, 1.1)
    drawn = users(truth, BIG, generator)
    empirical = np.bincount(drawn, minlength=BIG) / BIG
    rows = []
    for mechanism in (
        OLH(epsilon=EPSILON, domain_size=BIG),
        HadamardResponse(epsilon=EPSILON, domain_size=BIG),
    ):
        counts = np.bincount(sample(mechanism, drawn, generator), minlength=mechanism.n_outputs)
        channel = channel_for(mechanism)
        for method in ("inversion", "projection"):

            def run(mechanism=mechanism, counts=counts, channel=channel, method=method):
                return estimate(mechanism, counts, method=method, channel=channel)

            seconds, peak, result = timed(run, repeats)
            mse = float(np.mean((result.frequencies - empirical) ** 2))  # type: ignore[attr-defined]
            rows.append((mechanism.name, method, seconds, peak, mse))
            print(f"{mechanism.name} {method}: {seconds:.2f} s {peak:.0f} MiB", file=sys.stderr)
    oue = OUE(epsilon=EPSILON, domain_size=BIG)
    ones = oue_ones(oue, np.bincount(drawn, minlength=BIG), generator)
    for method in ("inversion", "projection"):

        def run_oue(method=method):
            unbiased, _ = oue_estimate(oue, ones, BIG)
            return unbiased if method == "inversion" else project_to_simplex(unbiased)

        seconds, peak, frequencies = timed(run_oue, repeats)
        rows.append(
            ("oue", method, seconds, peak, float(np.mean((frequencies - empirical) ** 2)))  # type: ignore[operator]
        )
    return rows


def olh_closed_form(mechanism: OLH, truth: np.ndarray, n: int) -> float:
    excess = mechanism.p_keep - 1 / mechanism.g
    pi = 1 / mechanism.g + truth * excess
    return float(np.sum(pi * (1 - pi)) / (n * excess**2))


def error_rows(seeds: int) -> list[tuple[str, float, float]]:
    """(estimator, mean summed squared error, closed form) at k = 10^4, n = 10^5."""
    truth = zipf(ERROR_K, 1.1)
    olh = OLH(epsilon=EPSILON, domain_size=ERROR_K)
    channel = channel_for(olh)
    oue = OUE(epsilon=EPSILON, domain_size=ERROR_K)
    hadamard = HadamardResponse(epsilon=EPSILON, domain_size=ERROR_K)
    hr_channel = channel_for(hadamard)
    errors: dict[str, list[float]] = {
        "olh, served (pool correction)": [],
        "olh, plain support estimate": [],
        "olh, plain, fresh pool each seed": [],
        "oue": [],
        "hadamard_response": [],
    }
    for seed in range(seeds):
        generator = np.random.default_rng([seed, 7])
        drawn = users(truth, ERROR_N, generator)
        counts = np.bincount(sample(olh, drawn, generator), minlength=olh.n_outputs)
        errors["olh, served (pool correction)"].append(
            float(np.sum((channel.solve_counts(counts)[0] - truth) ** 2))
        )
        errors["olh, plain support estimate"].append(
            float(np.sum((channel.support_estimate(counts / ERROR_N) - truth) ** 2))
        )
        fresh = fresh_pool(OLH(epsilon=EPSILON, domain_size=ERROR_K), seed)
        fresh_counts = np.bincount(sample(fresh, drawn, generator), minlength=fresh.n_outputs)
        estimate_fresh = channel_for(fresh).support_estimate(fresh_counts / ERROR_N)  # type: ignore[attr-defined]
        errors["olh, plain, fresh pool each seed"].append(
            float(np.sum((estimate_fresh - truth) ** 2))
        )
        ones = oue_ones(oue, np.bincount(drawn, minlength=ERROR_K), generator)
        errors["oue"].append(float(np.sum((oue_estimate(oue, ones, ERROR_N)[0] - truth) ** 2)))
        hr_counts = np.bincount(sample(hadamard, drawn, generator), minlength=hadamard.n_outputs)
        errors["hadamard_response"].append(
            float(np.sum((hr_channel.solve(hr_counts / ERROR_N) - truth) ** 2))
        )
    olh_closed = olh_closed_form(olh, truth, ERROR_N)
    oue_pi = oue.q + truth * (oue.p - oue.q)
    oue_closed = float(np.sum(oue_pi * (1 - oue_pi)) / (ERROR_N * (oue.p - oue.q) ** 2))
    q = hr_channel.forward(truth)
    hr_closed = float(np.sum(hr_channel.inversion_second_moment(q) - truth**2) / ERROR_N)
    closed = {"oue": oue_closed, "hadamard_response": hr_closed}
    return [(name, float(np.mean(v)), closed.get(name, olh_closed)) for name, v in errors.items()]


def pool_rows(seeds: int) -> list[tuple[float, int, float, float, float]]:
    """(zipf s, S, plain ratio, corrected ratio, seconds of one pass at k = 10^6)."""
    rows = []
    for pool in POOLS:
        started = time.perf_counter()
        channel_for(OLH(epsilon=EPSILON, domain_size=BIG, pool_size=pool)).gather(  # type: ignore[attr-defined]
            np.ones(pool * 4)
        )
        pass_seconds = time.perf_counter() - started
        for s in (1.1, 1.5):
            truth = zipf(ERROR_K, s)
            mechanism = OLH(epsilon=EPSILON, domain_size=ERROR_K, pool_size=pool)
            channel = channel_for(mechanism)
            closed = olh_closed_form(mechanism, truth, ERROR_N)
            plain, corrected = [], []
            for seed in range(seeds):
                generator = np.random.default_rng([seed, pool])
                drawn = users(truth, ERROR_N, generator)
                counts = np.bincount(
                    sample(mechanism, drawn, generator), minlength=mechanism.n_outputs
                )
                plain.append(
                    float(np.sum((channel.support_estimate(counts / ERROR_N) - truth) ** 2))
                )  # type: ignore[attr-defined]
                corrected.append(float(np.sum((channel.solve_counts(counts)[0] - truth) ** 2)))
            rows.append(
                (s, pool, np.mean(plain) / closed, np.mean(corrected) / closed, pass_seconds)
            )
            print(f"pool {pool} zipf {s}: {rows[-1][2]:.2f} {rows[-1][3]:.2f}", file=sys.stderr)
    return rows


def postprocess_rows() -> list[tuple[str, int, str, float, float, float]]:
    """(mechanism, k, method, MSE, TV, seconds) against the users' own distribution."""
    rows = []
    for k, n in ((ERROR_K, ERROR_N), (BIG, BIG)):
        generator = np.random.default_rng([k, 3])
        drawn = users(zipf(k, 1.1), n, generator)
        empirical = np.bincount(drawn, minlength=k) / n
        oracles = (
            OLH(epsilon=EPSILON, domain_size=k),
            HadamardResponse(epsilon=EPSILON, domain_size=k),
        )
        for mechanism in oracles:
            channel = channel_for(mechanism)
            counts = np.bincount(sample(mechanism, drawn, generator), minlength=mechanism.n_outputs)
            started = time.perf_counter()
            unbiased = channel.solve_counts(counts)[0]
            base = time.perf_counter() - started
            candidates = {
                "unbiased": (unbiased, base),
                "clip (Norm)": None,
                "projection (Norm-Sub)": None,
            }
            started = time.perf_counter()
            candidates["clip (Norm)"] = (
                clip_and_normalise(unbiased),
                base + time.perf_counter() - started,
            )
            started = time.perf_counter()
            candidates["projection (Norm-Sub)"] = (
                project_to_simplex(unbiased),
                base + time.perf_counter() - started,
            )
            if k == ERROR_K:
                started = time.perf_counter()
                fitted = IBU(tol=0.0).fit(counts, channel, n_iter=IBU_ITERATIONS)
                candidates[f"IBU, {IBU_ITERATIONS} iterations"] = (
                    fitted.frequencies_,
                    time.perf_counter() - started,
                )
            for method, (frequencies, seconds) in candidates.items():  # type: ignore[misc]
                mse = float(np.mean((frequencies - empirical) ** 2))
                tv = float(0.5 * np.abs(frequencies - empirical).sum())
                rows.append((mechanism.name, k, method, mse, tv, seconds))
                print(f"{mechanism.name} k={k} {method}: {mse:.3g} {tv:.3f}", file=sys.stderr)
    return rows


def max_rss_mib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def markdown(
    costs, rss: float, errors, pools, posts, repeats: int, seeds: int, pool_seeds: int
) -> str:
    lines = [
        f"Epsilon {EPSILON:g} (OLH: g = 4 buckets, S = 1,024 seeds). Cost of one estimate "
        f"with its intervals at k = n = 10^6 (Zipf 1.1), median of {repeats} runs after a "
        "warm-up, peak memory allocated during one estimate (the machine is shared: times are "
        "noisy):",
        "",
        "| mechanism | method | seconds | peak MiB | MSE |",
        "|---|---|---:|---:|---:|",
    ]
    for name, method, seconds, peak, mse in costs:
        lines.append(f"| {name} | {method} | {seconds:.2f} | {peak:.0f} | {mse:.3g} |")
    lines += [
        "",
        f"The whole process (the users, the reports, every channel and estimate above) peaked at "
        f"{rss:,.0f} MiB resident.",
        "",
        f"Unbiased estimates against their closed-form variance, k = {ERROR_K:,}, "
        f"n = {ERROR_N:,}, Zipf 1.1, {seeds} seeds:",
        "",
        "| estimator | mean summed squared error | closed form | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, measured, closed in errors:
        lines.append(f"| {name} | {measured:.4g} | {closed:.4g} | {measured / closed:.3f} |")
    lines += [
        "",
        f"The seed pool's cost: OLH's error over its closed form by pool size S (k = {ERROR_K:,}, "
        f"n = {ERROR_N:,}, {pool_seeds} seeds), and one pass over the pool at k = 10^6:",
        "",
        "| Zipf s | S | plain support estimate | with the pool correction | one pass, k = 10^6 (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s, pool, plain, corrected, seconds in pools:
        lines.append(f"| {s:g} | {pool:,} | {plain:.2f} | {corrected:.2f} | {seconds:.2f} |")
    lines += [
        "",
        "Post-processing the unbiased estimate, against the users' own distribution (Zipf 1.1; "
        "k = 10^4 with n = 10^5, k = 10^6 with n = 10^6):",
        "",
        "| mechanism | k | method | MSE | TV | seconds |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, k, method, mse, tv, seconds in posts:
        lines.append(f"| {name} | {k:,} | {method} | {mse:.3g} | {tv:.3f} | {seconds:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cost case")
    parser.add_argument("--seeds", type=int, default=100, help="seeds of the error check")
    parser.add_argument("--pool-seeds", type=int, default=30, help="seeds per pool size")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    costs = cost_rows(args.repeats)
    rss = max_rss_mib()
    text = markdown(
        costs,
        rss,
        error_rows(args.seeds),
        pool_rows(args.pool_seeds),
        postprocess_rows(),
        args.repeats,
        args.seeds,
        args.pool_seeds,
    )
    print(text)
    if not args.no_write:
        print(f"wrote {write_section(SECTION, text)}", file=sys.stderr)
        print(f"wrote {write_section(SECTION, text, path=DOC)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where k-RR stops being the best frequency oracle, from the advisor's closed forms, and a check
of those forms against the real samplers.

For each epsilon: Wang et al.'s approximate crossover ``3 e^eps + 2``; the exact smallest ``k``
at which OUE, OLH and Hadamard response have a lower ``E ||f_hat - f||^2`` than k-RR
(:func:`aggregator.estimation.advice.crossover_k`); and at the OUE crossover, the mean summed
squared error of the unbiased inversion over ``--trials`` draws of 500 fixed users (Zipf-like),
divided by the closed form: k-RR and Hadamard response through their vectorised samplers, OUE
through a simulation of its support counts (per-bit binomials, as ``simulate.sampling.oue_ones``
draws them).

Writes the section ``advisor`` of docs/mechanisms.md (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for  # noqa: E402
from aggregator.estimation.advice import OLH, OUE, crossover_k, oracle_mse  # noqa: E402
from aggregator.estimation.oracles import HadamardChannel  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.mechanisms import HADAMARD_RESPONSE, KRR, HadamardResponse  # noqa: E402
from simulate.sampling import sample  # noqa: E402

SECTION = "advisor"
DOC = ROOT / "docs" / "mechanisms.md"
EPSILONS = (0.5, 1.0, 2.0, 4.0)
USERS = 500


def fixed_users(k: int, seed: int) -> np.ndarray:
    """``USERS`` fixed values over ``k``, Zipf-like (the pure oracles' sums do not depend on it)."""
    weights = 1.0 / np.arange(1, k + 1)
    return np.random.default_rng(seed).choice(k, size=USERS, p=weights / weights.sum())


def sampled_mse(mechanism, channel, k: int, trials: int, seed: int) -> float:
    """Mean over ``trials`` draws of ``||f_hat - f||^2`` (the unbiased inversion) for the same
    ``USERS`` users."""
    x = fixed_users(k, seed)
    truth = np.bincount(x, minlength=k) / USERS
    generator = np.random.default_rng(seed + 1)
    reports = sample(mechanism, np.tile(x, trials), generator).reshape(trials, USERS)
    offsets = np.arange(trials)[:, None] * channel.n_outputs
    counts = np.bincount((reports + offsets).ravel(), minlength=trials * channel.n_outputs)
    q = counts.reshape(trials, channel.n_outputs) / USERS
    estimates = np.stack([channel.solve(row) for row in q])
    return float(np.mean(np.sum((estimates - truth) ** 2, axis=1)))


def support_count_mse(p_star: float, q_star: float, k: int, trials: int, seed: int) -> float:
    """A reference simulation of a pure oracle's support counts (OUE, OLH over random hashes).

    For fixed users a report supports its own value with probability ``p*`` and
    another value with ``q*``, independently across users; the count of value
    ``v`` is ``Binomial(n_v, p*) + Binomial(n - n_v, q*)``.
    """
    x = fixed_users(k, seed)
    own = np.bincount(x, minlength=k)
    generator = np.random.default_rng(seed + 2)
    counts = generator.binomial(own, p_star, size=(trials, k))
    counts += generator.binomial(USERS - own, q_star, size=(trials, k))
    estimates = (counts / USERS - q_star) / (p_star - q_star)
    return float(np.mean(np.sum((estimates - own / USERS) ** 2, axis=1)))


def rows(trials: int) -> list[tuple]:
    out = []
    for epsilon in EPSILONS:
        k = crossover_k(epsilon, OUE)
        labels = [f"v{i}" for i in range(k)]
        krr = KRR(epsilon=epsilon, domain=labels)
        hadamard = HadamardResponse(epsilon=epsilon, domain=labels)
        krr_ratio = sampled_mse(krr, channel_for(krr), k, trials, k) / oracle_mse(
            "krr", k, epsilon, USERS
        )
        hr_ratio = sampled_mse(hadamard, HadamardChannel(hadamard), k, trials, k) / oracle_mse(
            HADAMARD_RESPONSE, k, epsilon, USERS
        )
        oue = support_count_mse(0.5, 1 / (math.exp(epsilon) + 1), k, trials, k)
        oue_ratio = oue / oracle_mse(OUE, k, epsilon, USERS)
        out.append(
            (
                epsilon,
                3 * math.exp(epsilon) + 2,
                k,
                crossover_k(epsilon, OLH),
                crossover_k(epsilon, HADAMARD_RESPONSE),
                krr_ratio,
                hr_ratio,
                oue_ratio,
            )
        )
    return out


def markdown(table: list[tuple], trials: int) -> str:
    lines = [
        "Smallest k at which each oracle's expected squared error is below k-RR's (closed "
        f"forms), and at the OUE crossover the measured error over {trials:,} draws of "
        f"{USERS} users divided by the closed form:",
        "",
        "| epsilon | 3e^eps + 2 | k vs OUE | k vs OLH | k vs Hadamard | k-RR measured / closed "
        "| Hadamard measured / closed | OUE measured / closed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for epsilon, approx, oue, olh, hr, krr_ratio, hr_ratio, oue_ratio in table:
        lines.append(
            f"| {epsilon:g} | {approx:.1f} | {oue} | {olh} | {hr} | {krr_ratio:.3f} | "
            f"{hr_ratio:.3f} | {oue_ratio:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000, help="draws per measured figure")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    text = markdown(rows(args.trials), args.trials)
    print(text)
    if not args.no_write:
        print(f"wrote {write_section(SECTION, text, path=DOC)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

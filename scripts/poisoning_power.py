"""Power and false alarms of the poisoning check against the maximal-gain attack.

k-RR with k = 100, epsilon = 1, n = 100,000 honest users drawn from several
populations, plus 1%, 2% or 5% fake users who all report the least popular
category (Cao, Jia and Gong, USENIX Security 2021). Each cell counts the runs
flagged out of ``--runs`` seeded runs at the check's false-alarm rate 0.001.

    python scripts/poisoning_power.py            # 40 runs per cell, about 3 minutes
    python scripts/poisoning_power.py --no-write

Writes section ``poisoning-power`` of RELIABILITY.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aggregator.estimation import poisoning  # noqa: E402
from shared.mechanisms import KRR  # noqa: E402
from simulate.sampling import sample  # noqa: E402

K, N = 100, 100_000
FAKE_SHARES = (0.01, 0.02, 0.05)


def populations() -> dict[str, np.ndarray]:
    ranks = np.arange(1, K + 1, dtype=float)
    return {
        "Zipf s=1": 1 / ranks / np.sum(1 / ranks),
        "Zipf s=1.5": ranks**-1.5 / np.sum(ranks**-1.5),
        "Zipf s=2": ranks**-2 / np.sum(ranks**-2),
        "10 equally popular, 90 unused": np.r_[np.full(10, 0.1), np.zeros(90)],
        "30 equally popular, 70 unused": np.r_[np.full(30, 1 / 30), np.zeros(70)],
        "uniform over all 100": np.full(K, 1 / K),
        "everyone holds one value": np.eye(K)[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    mechanism = KRR(epsilon=1.0, domain=[f"c{i}" for i in range(K)])
    generator = np.random.default_rng(args.seed)
    header = " | ".join(f"{share:.0%} fake users" for share in FAKE_SHARES)
    lines = [
        f"| honest population | honest runs flagged | {header} |",
        "|---|---|" + "---|" * len(FAKE_SHARES),
    ]
    for name, population in populations().items():
        flags = dict.fromkeys((0.0, *FAKE_SHARES), 0)
        for _ in range(args.runs):
            true_values = generator.choice(K, size=N, p=population)
            counts = np.bincount(sample(mechanism, true_values, generator), minlength=K)
            for share in flags:
                poisoned = counts.copy()
                poisoned[K - 1] += round(share * N)
                flags[share] += bool(poisoning.check(mechanism, poisoned).flagged)
        cells = " | ".join(f"{flags[share]}/{args.runs}" for share in (0.0, *FAKE_SHARES))
        lines.append(f"| {name} | {cells} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    if not args.no_write:
        from benchlib import write_section

        text = (
            "### Poisoning check: runs flagged (k = 100, epsilon = 1, n = 100,000, "
            f"false-alarm rate 0.001)\n\n{table}"
        )
        write_section("poisoning-power", text, path=ROOT / "RELIABILITY.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

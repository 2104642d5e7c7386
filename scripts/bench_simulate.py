"""Benchmark of the in-process simulation: users perturbed per second, and memory, up to 10^7.

    python scripts/bench_simulate.py [--sizes 1e6,1e7] [--no-write]

For each mechanism and size it times :func:`simulate.runner.perturb`
(drawing the users, the vectorised sampler, bincount; chunks of 10^6) and the
peak of memory allocated meanwhile (``tracemalloc``, which sees numpy's
buffers). Prints a markdown table and writes the ``simulate`` section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from scripts.benchlib import write_section  # noqa: E402
from shared.geo import Grid, Region  # noqa: E402
from shared.mechanisms import KRR, PlanarLaplace  # noqa: E402
from simulate.populations import Population, cell_labels  # noqa: E402
from simulate.runner import perturb  # noqa: E402

GRID = Grid(Region(37.7723373, 37.7993168, -122.4233913, -122.3892533), 150.0)
BIG_GRID = Grid(Region(37.70, 37.80, -122.50, -122.38), 100.0)


def cases():
    zipf = Population.zipf(100, 1.1)
    city = Population.clustered_city(GRID, hotspots=8, seed=0)
    big_city = Population.clustered_city(BIG_GRID, hotspots=20, seed=0)
    yield "k-RR, k = 100", zipf, KRR(epsilon=1.0, domain=zipf.labels)
    yield "k-RR over 400 cells", city, KRR(epsilon=math.log(8), domain=cell_labels(GRID))
    yield "planar Laplace, 20 x 20", city, PlanarLaplace(epsilon=math.log(2) / 100, grid=GRID)
    yield (
        f"planar Laplace, {BIG_GRID.rows} x {BIG_GRID.cols}",
        big_city,
        PlanarLaplace(epsilon=0.01, grid=BIG_GRID),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e6,1e7")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    lines = [
        "| mechanism | users | seconds | users / s | peak memory (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, population, mechanism in cases():
        for n in sizes:
            tracemalloc.start()
            started = time.perf_counter()
            true_counts, _ = perturb(
                population,
                mechanism,
                n,
                np.random.default_rng(0),
                np.random.default_rng(1),
                progress=False,
            )
            seconds = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert true_counts.sum() == n
            lines.append(
                f"| {name} | {n:,} | {seconds:.2f} | {n / seconds:,.0f} | {peak / 2**20:.0f} |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if not args.no_write:
        write_section(
            "simulate",
            "### In-process simulation (`ldp-simulate`)\n\n"
            "Drawing the users, perturbing them with the vectorised sampler and counting "
            "(`simulate.runner.perturb`, chunks of 10^6 users); estimation is not "
            "included. Peak memory is what numpy allocated during the call (tracemalloc).\n\n"
            + table,
        )


if __name__ == "__main__":
    main()

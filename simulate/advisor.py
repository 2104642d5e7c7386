"""The mechanism advisor: rank the mechanisms for a domain by expected error, best first.

Categories and integer ranges are ranked by the closed forms of
:mod:`aggregator.estimation.advice` (``E ||f_hat - f||^2`` summed over the
domain, for ``n`` users). A region has no closed form for the error of its
estimate, so its mechanisms are compared by a short simulation, bounded in
time and seeded:

* the users are a synthetic clustered city (:meth:`Population.clustered_city`,
  8 hotspots, ``seed``) on the region's grid, or, on a grid of more than
  :data:`WINDOW_CELLS` cells on a side, on a window of that many cells of the
  same size at the region's south-west corner (the basis says so);
* for each of ``trials`` draws, ``n`` users report through each mechanism's
  vectorised sampler and the service's default estimator (IBU stopped by
  cross-validation) reconstructs their distribution; the score is the earth
  mover's distance in metres to the users' own distribution, and the summed
  squared error, each averaged over the trials.

The mechanisms on a grid run at parameters that leave no pair of cells less
protected than planar Laplace at ``epsilon`` per metre does: k-RR and OLH over the
cells at ``epsilon * cell`` (the two nearest cells' distance; their estimate is the
service's default for them, Norm-Sub smoothed over neighbouring cells), the Manhattan
exponential mechanism at ``epsilon / sqrt(2)`` per Manhattan metre (a
Manhattan distance is at most ``sqrt(2)`` times the straight one), and a
Euclidean exponential mechanism at ``epsilon`` where one is available.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from aggregator.estimation import channel_for, point_estimate
from aggregator.estimation.advice import (
    Option,
    hosted,
    rank_categorical,
    rank_range,
)
from shared.geo import EARTH_RADIUS_M, Grid, Region
from shared.mechanisms import EXPONENTIAL_GRID, KRR, ExponentialGrid, Mechanism, PlanarLaplace
from shared.oracles import OLH
from shared.spec import EUCLIDEAN, OLH_NAME, PLANAR_LAPLACE
from shared.spec import KRR as KRR_NAME
from simulate.metrics import earth_movers_distance
from simulate.populations import Population
from simulate.sampling import sample

# The simulation's grid has at most this many cells along each side.
WINDOW_CELLS = 24
DEFAULT_TRIALS = 2
DEFAULT_SEED = 0


def advise(
    *,
    epsilon: float,
    users: int,
    domain_size: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
    region: Region | None = None,
    cell_size_m: float | None = None,
    trials: int = DEFAULT_TRIALS,
    seed: int = DEFAULT_SEED,
) -> list[Option]:
    """The mechanisms for one domain, best first; give exactly one of the three domains."""
    given = [
        name
        for name, present in (
            ("domain size", domain_size is not None),
            ("range", lo is not None or hi is not None),
            ("region", region is not None or cell_size_m is not None),
        )
        if present
    ]
    if len(given) != 1:
        raise ValueError(
            "give one domain: a domain size, a range lo..hi, or a region with a cell size"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    if domain_size is not None:
        return rank_categorical(domain_size, epsilon, users)
    if lo is not None or hi is not None:
        if lo is None or hi is None:
            raise ValueError("a range needs both lo and hi")
        return rank_range(lo, hi, epsilon, users)
    if region is None or cell_size_m is None:
        raise ValueError("a region needs its cell size, and a cell size its region")
    return rank_grid(Grid(region, cell_size_m), epsilon, users, trials=trials, seed=seed)


def simulation_grid(grid: Grid) -> Grid:
    """``grid``, or its south-west window of :data:`WINDOW_CELLS` cells a side if larger."""
    if grid.rows <= WINDOW_CELLS and grid.cols <= WINDOW_CELLS:
        return grid
    region = grid.region
    side = WINDOW_CELLS * grid.cell_size_m * (1 - 1e-9)  # metres; a hair under, for the ceiling
    per_degree = EARTH_RADIUS_M * math.pi / 180
    lat_max = min(region.lat_max, region.lat_min + side / per_degree)
    middle = math.radians((region.lat_min + lat_max) / 2)
    lon_max = min(region.lon_max, region.lon_min + side / (per_degree * math.cos(middle)))
    window = Region(
        lat_min=region.lat_min, lat_max=lat_max, lon_min=region.lon_min, lon_max=lon_max
    )
    return Grid(window, grid.cell_size_m)


def _candidates(grid: Grid, epsilon: float) -> list[tuple[str, Mechanism, str, dict[str, Any]]]:
    """(wire name, mechanism, why, details) for each mechanism simulated on ``grid``."""
    found: list[tuple[str, Mechanism, str, dict[str, Any]]] = [
        (
            PLANAR_LAPLACE,
            PlanarLaplace(epsilon=epsilon, grid=grid),
            "continuous noise snapped to cells; nearby places hard to tell apart",
            {},
        )
    ]
    cell = grid.cell_size_m
    for name, build, why in (
        (
            KRR_NAME,
            lambda e: KRR(epsilon=e, grid=grid),
            "k-RR over the cells at epsilon * cell: every pair of cells as protected as the "
            "two nearest; the error grows with the number of cells",
        ),
        (
            OLH_NAME,
            lambda e: OLH(epsilon=e, grid=grid),
            "OLH over the cells at epsilon * cell: every pair of cells as protected as the "
            "two nearest; better than k-RR once the cells outnumber 3 e^epsilon + 2",
        ),
    ):
        try:
            mechanism = build(epsilon * cell)
        except ValueError:
            continue  # beyond the integer sampler's limits: no protection worth simulating
        found.append((name, mechanism, why, {"as_cells": True}))
    found.append(
        (
            EXPONENTIAL_GRID,
            ExponentialGrid(epsilon=epsilon / math.sqrt(2), grid=grid),
            "the exponential mechanism over cells, Manhattan distance, at epsilon / sqrt(2) "
            "per metre",
            {"metric": "manhattan"},
        )
    )
    found.append(
        (
            EXPONENTIAL_GRID,
            ExponentialGrid(epsilon=epsilon, grid=grid, metric=EUCLIDEAN),
            "the exponential mechanism over cells, Euclidean distance",
            {"metric": EUCLIDEAN},
        )
    )
    return found


def rank_grid(
    grid: Grid,
    epsilon: float,
    users: int,
    *,
    trials: int = DEFAULT_TRIALS,
    seed: int = DEFAULT_SEED,
) -> list[Option]:
    """The grid's mechanisms by simulated EMD, best first (see the module docstring)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if users < 1 or trials < 1:
        raise ValueError("the number of users and of trials must be at least 1")
    simulated = simulation_grid(grid)
    population = Population.clustered_city(simulated, seed=seed)
    where = (
        f"{simulated.rows} x {simulated.cols} cells"
        if simulated is grid
        else f"a {simulated.rows} x {simulated.cols}-cell window of the {grid.rows} x "
        f"{grid.cols} grid"
    )
    basis = f"simulation, {trials} trials of {users:,} users (clustered city, seed {seed}, {where})"
    options = []
    for index, (name, mechanism, why, details) in enumerate(_candidates(simulated, epsilon)):
        started = time.perf_counter()
        channel = channel_for(mechanism)
        emds, errors = [], []
        for trial in range(trials):
            generator = np.random.default_rng([seed, trial, index])
            x = generator.choice(simulated.n_cells, size=users, p=population.probabilities)
            truth = np.bincount(x, minlength=simulated.n_cells) / users
            counts = np.bincount(sample(mechanism, x, generator), minlength=simulated.n_cells)
            estimate = point_estimate(mechanism, counts, seed=seed, channel=channel)
            emd = earth_movers_distance(truth, estimate, simulated)
            emds.append(math.nan if emd is None else emd)
            errors.append(float(np.sum((estimate - truth) ** 2)))
        options.append(
            Option(
                mechanism=name,
                expected_mse=float(np.mean(errors)),
                epsilon=mechanism.epsilon,
                basis=basis,
                why=why,
                hosted=hosted(name),
                expected_emd_m=float(np.mean(emds)),
                details={
                    **details,
                    "expected_emd_se_m": float(np.std(emds, ddof=1) / math.sqrt(trials))
                    if trials > 1
                    else None,
                    "seconds": round(time.perf_counter() - started, 3),
                },
            )
        )
    return sorted(options, key=lambda o: (o.expected_emd_m, not o.hosted))


def recommendation(options: list[Option]) -> str:
    """One line: the best mechanism, and the best the service hosts if that differs."""
    best = options[0]
    line = f"recommended: {best.mechanism} ({best.why})"
    if len(options) > 1 and best.expected_emd_m is not None:
        second = options[1]
        errors = [o.details.get("expected_emd_se_m") or 0.0 for o in (best, second)]
        gap = (second.expected_emd_m or 0.0) - best.expected_emd_m
        if gap <= 2 * math.hypot(*errors):
            line += (
                f"; {second.mechanism} is within twice the simulation's standard error "
                f"({gap:.1f} m apart): more --trials to tell them apart"
            )
    if not best.hosted:
        served = next((o for o in options if o.hosted), None)
        line += "; not hosted by this service yet"
        if served is not None:
            line += f"; the best it hosts: {served.mechanism}"
    return line


def format_advice(options: list[Option]) -> str:
    """The ranking as a table, then the recommendation."""
    grid = any(o.expected_emd_m is not None for o in options)
    header = ["#", "mechanism", "epsilon", "expected_mse"]
    header += ["expected_emd_m"] if grid else []
    header += ["hosted", "basis"]
    rows = []
    for rank, option in enumerate(options, 1):
        name = option.mechanism
        if "metric" in option.details:
            name += f" ({option.details['metric']})"
        if option.details.get("as_cells"):
            name += " (over the cells)"
        if option.details.get("as_labels"):
            name += " (over the values)"
        row = [
            str(rank),
            name,
            f"{option.epsilon:.4g}",
            "-" if option.expected_mse is None else f"{option.expected_mse:.4g}",
        ]
        if grid:
            row.append("-" if option.expected_emd_m is None else f"{option.expected_emd_m:.1f}")
        row += ["yes" if option.hosted else "no", option.basis]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return "\n".join([*(line.rstrip() for line in lines), recommendation(options)])

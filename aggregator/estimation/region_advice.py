"""A region's mechanisms ranked by a short simulation of their estimates, best first.

A region has no closed form for the error of its estimate: it depends on where the users are.
So the mechanisms are compared by a simulation, seeded and small enough for a request:

* the users are a synthetic clustered city (:func:`clustered_city`, 8 hotspots, ``seed``) on
  the region's grid, or, on a grid of more than :data:`WINDOW_CELLS` cells on a side, on a
  window of that many cells of the same size at the region's south-west corner (the basis
  says so);
* in each of ``trials`` draws, ``users`` users are drawn from the city, their reports drawn
  through each mechanism's channel (per cell, so the cost does not grow with the number of
  users), and the service's default estimator for the mechanism reconstructs their
  distribution; the score is the earth mover's distance in metres to the users' own
  distribution, and the summed squared error, each averaged over the trials.

The mechanisms over the cells run at parameters that leave no pair of cells less protected
than planar Laplace at ``epsilon`` per metre does: k-RR and OLH over the cells at
``epsilon * cell`` (the two nearest cells' distance), the Manhattan exponential mechanism at
``epsilon / sqrt(2)`` per Manhattan metre (a Manhattan distance is at most ``sqrt(2)`` times
the straight one), and the Euclidean exponential mechanism at ``epsilon``. Not simulated: an
exponential mechanism whose step per cell its spec refuses, and OLH where the closed forms
give k-RR over the region's cells the smaller error (few cells or a large epsilon per cell:
OLH's hashes then buy nothing, and its channel grows as ``e^epsilon``).

``POST /campaigns`` without a mechanism and ``ldp-simulate advise --region`` both rank a
region here, with the same seed, so they give the same ranking.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.special import ndtr

from aggregator.estimation.advice import Option, hosted, oracle_mse, oracles_take
from aggregator.estimation.channels import Channel, KRRChannel
from aggregator.estimation.compute import point_estimate
from aggregator.estimation.distance import earth_movers_distance
from aggregator.estimation.factory import channel_for
from shared.geo import EARTH_RADIUS_M, Grid, Region
from shared.mechanisms import KRR, ExponentialGrid, Mechanism, PlanarLaplace
from shared.oracles import OLH
from shared.spec import (
    EUCLIDEAN,
    EXPONENTIAL_GRID,
    MANHATTAN,
    OLH_NAME,
    PLANAR_LAPLACE,
    grid_step_accepted,
)
from shared.spec import KRR as KRR_NAME

# The simulation's grid has at most this many cells along each side.
WINDOW_CELLS = 24
DEFAULT_TRIALS = 2
DEFAULT_SEED = 0


def region_extent_m(grid: Grid) -> tuple[float, float]:
    """Width and height of the region in metres (the grid may reach a little beyond it)."""
    region = grid.region
    return grid.to_xy(region.lat_max, region.lon_max)


def cell_edges_m(grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Cell edges in metres along x and y, the last ones cut at the region's edge."""
    width, height = region_extent_m(grid)
    x_edges = np.minimum(np.arange(grid.cols + 1) * grid.cell_size_m, width)
    y_edges = np.minimum(np.arange(grid.rows + 1) * grid.cell_size_m, height)
    return x_edges, y_edges


def clustered_city(
    grid: Grid,
    *,
    hotspots: int = 8,
    background: float = 0.1,
    spread_m: tuple[float, float] = (100.0, 500.0),
    seed: int = 0,
) -> np.ndarray:
    """A synthetic city's share of users in each cell: Gaussian hotspots over a uniform
    background, inside the region.

    Hotspot centres are uniform in the region, their standard deviations uniform in
    ``spread_m`` and their weights Zipf-like (the ``j``-th has weight ``1 / j``), all drawn
    from ``seed``. A cell's share is the mixture's mass over the part of the cell inside the
    region (exact, from the normal CDF), renormalised to the region. The arguments are
    trusted (``simulate.populations.Population.clustered_city`` checks a user's).
    """
    generator = np.random.default_rng(seed)
    width, height = region_extent_m(grid)
    centres_x = generator.uniform(0, width, hotspots)
    centres_y = generator.uniform(0, height, hotspots)
    sigmas = generator.uniform(spread_m[0], spread_m[1], hotspots)
    weights = 1.0 / np.arange(1, hotspots + 1)
    weights = generator.permutation(weights / weights.sum())
    x_edges, y_edges = cell_edges_m(grid)
    mass = np.zeros((grid.rows, grid.cols))
    for cx, cy, sigma, w in zip(centres_x, centres_y, sigmas, weights, strict=True):
        px = np.diff(ndtr((x_edges - cx) / sigma))
        py = np.diff(ndtr((y_edges - cy) / sigma))
        mass += w * np.outer(py, px)
    area = np.outer(np.diff(y_edges), np.diff(x_edges))
    if not (mass.sum() > 0 and area.sum() > 0):  # a region too small to measure in metres
        return np.full(grid.n_cells, 1.0 / grid.n_cells)
    mass = (1 - background) * mass / mass.sum() + background * area / area.sum()
    return mass.ravel() / mass.sum()


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


def draw_reports(channel: Channel, users: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """Report counts of ``users[x]`` users with input ``x``, drawn through ``channel``.

    The reports of the users of one input are multinomial over that input's row of the
    channel, so the work is a row per input that has users, whatever their number (k-RR's
    channel draws in O(k) as a mixture, :meth:`KRRChannel.draw_reports`).
    """
    users = np.asarray(users, dtype=np.int64)
    if isinstance(channel, KRRChannel):
        return channel.draw_reports(users, generator)
    counts = np.zeros(channel.n_outputs)
    unit = np.zeros(channel.n_inputs)
    for x in np.flatnonzero(users):
        unit[x] = 1.0
        row = np.maximum(channel.forward(unit), 0.0)
        unit[x] = 0.0
        counts += generator.multinomial(users[x], row / row.sum())
    return counts


def _candidates(
    grid: Grid, epsilon: float, cells: int
) -> list[tuple[str, Mechanism, str, dict[str, Any]]]:
    """(wire name, mechanism, why, details) for each mechanism simulated on ``grid``, the
    window of a grid of ``cells`` cells; one its sampler refuses at these parameters (its
    spec would too) is left out."""
    cell = grid.cell_size_m
    per_cell = epsilon * cell
    # Where the categorical specs refuse the epsilon neither oracle over the cells can be a
    # campaign; where k-RR's error is the smaller by the closed forms, OLH's hashes buy nothing.
    oracles = cells >= 2 and oracles_take(per_cell, cells)
    olh_helps = oracles and oracle_mse(OLH_NAME, cells, per_cell, 1) < oracle_mse(
        KRR_NAME, cells, per_cell, 1
    )
    options: list[tuple[str, Callable[[], Mechanism], str, dict[str, Any], bool]] = [
        (
            PLANAR_LAPLACE,
            functools.partial(PlanarLaplace, epsilon=epsilon, grid=grid),
            "continuous noise snapped to cells; nearby places hard to tell apart",
            {},
            True,
        ),
        (
            KRR_NAME,
            functools.partial(KRR, epsilon=per_cell, grid=grid),
            "k-RR over the cells at epsilon * cell: every pair of cells as protected as the "
            "two nearest; the error grows with the number of cells",
            {"as_cells": True},
            oracles,
        ),
        (
            OLH_NAME,
            functools.partial(OLH, epsilon=per_cell, grid=grid),
            "OLH over the cells at epsilon * cell: every pair of cells as protected as the "
            "two nearest; better than k-RR once the cells outnumber 3 e^epsilon + 2",
            {"as_cells": True},
            olh_helps,
        ),
    ]
    for metric, per_metre, why in (
        (
            MANHATTAN,
            epsilon / math.sqrt(2),
            "the exponential mechanism over cells, Manhattan distance, at epsilon / sqrt(2) "
            "per metre",
        ),
        (EUCLIDEAN, epsilon, "the exponential mechanism over cells, Euclidean distance"),
    ):
        options.append(
            (
                EXPONENTIAL_GRID,
                functools.partial(ExponentialGrid, epsilon=per_metre, grid=grid, metric=metric),
                why,
                {"metric": metric},
                # A step the spec refuses is not tried: below it the lattice sums run for
                # minutes.
                grid_step_accepted(per_metre, cell),
            )
        )
    found = []
    for name, build, why, details, wanted in options:
        if not wanted:
            continue
        try:
            mechanism = build()
        except ValueError:
            continue
        found.append((name, mechanism, why, details))
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
    city = clustered_city(simulated, seed=seed)
    where = (
        f"{simulated.rows} x {simulated.cols} cells"
        if simulated is grid
        else f"a {simulated.rows} x {simulated.cols}-cell window of the {grid.rows} x "
        f"{grid.cols} grid"
    )
    basis = f"simulation, {trials} trials of {users:,} users (clustered city, seed {seed}, {where})"
    options = []
    for index, (name, mechanism, why, details) in enumerate(
        _candidates(simulated, epsilon, grid.n_cells)
    ):
        channel = channel_for(mechanism)
        emds: list[float | None] = []
        errors = []
        for trial in range(trials):
            generator = np.random.default_rng([seed, trial, index])
            drawn = generator.multinomial(users, city)
            truth = drawn / users
            counts = draw_reports(channel, drawn, generator)
            estimate = point_estimate(mechanism, counts, seed=seed, channel=channel)
            emd = earth_movers_distance(truth, estimate, simulated)
            emds.append(emd)
            errors.append(float(np.sum((estimate - truth) ** 2)))
        # None where an estimate was no distribution (the EMD is then undefined): ranked last.
        measured = None if None in emds else [float(e) for e in emds if e is not None]
        options.append(
            Option(
                mechanism=name,
                expected_mse=float(np.mean(errors)),
                epsilon=mechanism.epsilon,
                basis=basis,
                why=why,
                hosted=hosted(name),
                expected_emd_m=None if measured is None else float(np.mean(measured)),
                details={
                    **details,
                    "expected_emd_se_m": float(np.std(measured, ddof=1) / math.sqrt(trials))
                    if measured is not None and trials > 1
                    else None,
                },
            )
        )
    return sorted(
        options,
        key=lambda o: (o.expected_emd_m is None, o.expected_emd_m or 0.0, not o.hosted),
    )

"""Vectorised samplers of the mechanisms, for simulating many users at once.

These draw from a numpy ``Generator`` and are for simulation only: a device
perturbs its one value with the mechanism's own exact, CSPRNG-driven
``perturb``. Each sampler has the same distribution as ``perturb`` up to
floating-point rounding (tests/shared/test_shared_mechanisms.py checks both
against the channel).
"""

from __future__ import annotations

import functools

import numpy as np

from aggregator.estimation.oracles import olh_buckets
from shared.mechanisms import (
    KRR,
    ExponentialGrid,
    Geometric,
    HadamardResponse,
    Mechanism,
    PlanarLaplace,
)
from shared.oracles import OLH, OUE
from shared.spec import MANHATTAN


@functools.singledispatch
def sample(mechanism: Mechanism, x: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """Output indices for an integer array of input indices ``x``."""
    raise TypeError(f"no vectorised sampler for {type(mechanism).__name__}")


@sample.register
def _krr(mechanism: KRR, x: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    keep = generator.random(x.shape) < mechanism.p_keep
    # Another label, uniformly: draw from k - 1 and skip over the true one.
    other = generator.integers(0, mechanism.k - 1, size=x.shape, dtype=np.int64)
    other += other >= x
    return np.where(keep, x, other)


@sample.register
def _planar(mechanism: PlanarLaplace, x: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    grid = mechanism.grid
    cell = grid.cell_size_m
    row, col = np.divmod(x, grid.cols)
    # Planar Laplace in polar form: a Gamma(2, 1/epsilon) radius and a uniform angle.
    radius = generator.gamma(2.0, 1.0 / mechanism.epsilon, size=x.shape)
    theta = generator.uniform(0.0, 2.0 * np.pi, size=x.shape)
    px = (col + 0.5) * cell + radius * np.cos(theta)
    py = (row + 0.5) * cell + radius * np.sin(theta)
    out_col = np.clip(np.floor(px / cell), 0, grid.cols - 1).astype(np.int64)
    out_row = np.clip(np.floor(py / cell), 0, grid.rows - 1).astype(np.int64)
    return out_row * grid.cols + out_col


def _clamped_geometric(
    x: np.ndarray, epsilon: float, m: int, generator: np.random.Generator
) -> np.ndarray:
    """``x`` plus two-sided geometric noise ``P(z) ~ exp(-epsilon |z|)``, clamped into ``[0, m)``.

    The noise is the difference of two one-sided geometrics (failures before a
    success of probability ``1 - exp(-epsilon)``), as on the device up to float rounding.
    """
    success = -np.expm1(-epsilon)
    noise = generator.geometric(success, size=x.shape) - generator.geometric(success, size=x.shape)
    return np.clip(x + noise, 0, m - 1)


@sample.register
def _geometric(mechanism: Geometric, x: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return _clamped_geometric(x, mechanism.epsilon, mechanism.n_outputs, generator)


def _euclidean_offsets(
    step: float, size: int, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Lattice offsets with probability proportional to ``exp(-step * sqrt(di^2 + dj^2))``.

    The device's rejection sampler in floats: two-sided geometrics of step
    ``step / sqrt(2)`` per axis, accepted with probability
    ``exp(-(step * d_E - step * d_M / sqrt(2)))``, redrawn where rejected.
    """
    di = np.zeros(size, dtype=np.int64)
    dj = np.zeros(size, dtype=np.int64)
    pending = np.arange(size)
    proposal = step / np.sqrt(2.0)
    success = -np.expm1(-proposal)
    while pending.size:
        n = pending.size
        i = generator.geometric(success, n) - generator.geometric(success, n)
        j = generator.geometric(success, n) - generator.geometric(success, n)
        excess = step * np.hypot(i, j) - proposal * (np.abs(i) + np.abs(j))
        accept = generator.random(n) < np.exp(-np.maximum(excess, 0.0))
        di[pending[accept]] = i[accept]
        dj[pending[accept]] = j[accept]
        pending = pending[~accept]
    return di, dj


@sample.register
def _exponential_grid(
    mechanism: ExponentialGrid, x: np.ndarray, generator: np.random.Generator
) -> np.ndarray:
    grid = mechanism.grid
    row, col = np.divmod(np.asarray(x, dtype=np.int64), grid.cols)
    step = float(mechanism.step_epsilon)
    if mechanism.metric == MANHATTAN:
        row = _clamped_geometric(row, step, grid.rows, generator)
        col = _clamped_geometric(col, step, grid.cols, generator)
    else:
        di, dj = _euclidean_offsets(step, row.size, generator)
        row = np.clip(row + di.reshape(row.shape), 0, grid.rows - 1)
        col = np.clip(col + dj.reshape(col.shape), 0, grid.cols - 1)
    return row * grid.cols + col


@sample.register
def _hadamard(
    mechanism: HadamardResponse, x: np.ndarray, generator: np.random.Generator
) -> np.ndarray:
    row = np.asarray(x, dtype=np.int64) + 1
    inside = generator.random(row.shape) < mechanism.p_in
    y = generator.integers(0, mechanism.size, size=row.shape, dtype=np.int64)
    # Flip y into the wanted half by toggling the lowest set bit of the row (it changes the
    # parity of popcount(row & y)); a uniform y stays uniform within the half it lands in.
    bits = row & y
    for shift in (32, 16, 8, 4, 2, 1):  # fold the bits' parity into the lowest bit
        bits ^= bits >> shift
    parity = (bits & 1) == 0
    wrong = parity != inside
    y[wrong] ^= row[wrong] & -row[wrong]
    return y


@sample.register
def _olh(mechanism: OLH, x: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    g = mechanism.g
    seed = generator.integers(0, mechanism.pool_size, size=x.shape, dtype=np.int64)
    pool = np.array(mechanism.pool, dtype=np.uint64).reshape(-1, 2)
    hashed = olh_buckets(pool[seed, 0], pool[seed, 1], x.astype(np.uint64), g).astype(np.intp)
    keep = generator.random(x.shape) < mechanism.p_keep
    other = generator.integers(0, g - 1, size=x.shape, dtype=np.int64)
    other += other >= hashed
    return seed * g + np.where(keep, hashed, other)


def oue_ones(mechanism: OUE, true_counts: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """Per bit, the number of OUE reports with that bit set, for ``true_counts[x]`` users of
    value ``x``: ``Binomial(n_x, 1/2) + Binomial(n - n_x, q)``, exactly the law of the sum of
    the users' independent bits, in O(k)."""
    true_counts = np.asarray(true_counts, dtype=np.int64)
    n = int(true_counts.sum())
    own = generator.binomial(true_counts, mechanism.p)
    others = generator.binomial(n - true_counts, mechanism.q)
    return own + others

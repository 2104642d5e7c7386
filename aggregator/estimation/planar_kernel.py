"""The planar Laplace channel on a report grid, computed by quadrature.

For noise centred on a cell centre, the probability of landing in the cell
at offset ``(di, dj)`` is the integral of the planar Laplace density over that
square. All such masses come from one function,

    S(a, b) = P(X >= a, Y >= b)   for a, b >= 0,

the mass of a quadrant whose corner is ``(a, b)``. In polar coordinates a ray
at angle ``theta`` enters the quadrant at ``r0(theta) = max(a / cos, b / sin)``
and the radial integral of the density from ``r0`` to infinity is
``(1 + eps r0) exp(-eps r0) / (2 pi)`` per unit angle, so ``S`` is a smooth
one-dimensional integral, evaluated by composite Gauss-Legendre quadrature
on the two angular pieces.

By symmetry the kernel's quadrant ``di, dj >= 0`` is the inclusion-exclusion
of ``S`` over the cell edges ``0, c/2, 3c/2, ...``; the outermost offset on
each axis holds the whole tail beyond it, which is exactly where the
remapping into the grid sends it (see ``grid_channels.PlanarLaplaceChannel``).
The kernel's total is ``4 S(0, 0) = 1`` up to rounding, so every row of the
channel sums to 1 within about 1e-15.
"""

from __future__ import annotations

import numpy as np

# Composite Gauss-Legendre: panels packed towards the peak of the integrand.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(20)
_PANELS = 8
_CHUNK = 4096


def _radial_tail(rho: np.ndarray) -> np.ndarray:
    """``(1 + rho) exp(-rho)``: the mass beyond radius ``rho / eps`` per radian, times 2 pi."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = (1.0 + rho) * np.exp(-rho)
    return np.where(np.isfinite(rho), out, 0.0)


def _edge_piece(distance: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``int_start^(pi/2) g(d / cos t) dt`` with ``g(r) = (1 + r) exp(-r)``.

    ``t`` is the angle from the normal of an edge at (dimensionless) distance
    ``d``, which a ray meets at radius ``d / cos t``. With ``d / cos t = d cosh v``
    the integral becomes ``int_v0^inf g(d cosh v) / cosh v dv`` with
    ``v0 = arccosh(1 / cos start)``: smooth at both ends for every ``d`` (the
    ``t`` form has a boundary layer of width ``d`` at ``pi/2``). It is cut
    where the integrand has fallen below ``exp(-40)`` of the whole, and
    integrated by composite Gauss-Legendre with panels packed towards ``v0``,
    where it falls fastest for large ``d``.
    """
    total = np.pi / 2 - start  # the value at d = 0
    positive = distance > 0
    d = distance[positive]
    sec0 = 1.0 / np.cos(start[positive])
    v0 = np.arccosh(np.maximum(sec0, 1.0))
    v_end = np.arccosh(np.maximum(sec0 + 50.0 / d, 40.0 / d))
    span = v_end - v0
    acc = np.zeros(d.shape)
    for p in range(_PANELS):
        a = v0 + span * (p / _PANELS) ** 2
        b = v0 + span * ((p + 1) / _PANELS) ** 2
        half = ((b - a) / 2)[:, None]
        v = ((a + b) / 2)[:, None] + half * _NODES[None, :]
        cosh = np.cosh(v)
        values = _radial_tail(d[:, None] * cosh) / cosh
        acc += (values * _WEIGHTS[None, :] * half).sum(axis=1)
    total = np.array(total, dtype=float)
    total[positive] = acc
    return total


def quadrant_mass(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``S(a, b) = P(X >= a, Y >= b)`` for the unit planar Laplace (``alpha = eps a``, ``beta = eps b``).

    Both arguments are >= 0 and may be ``inf`` (mass 0). For a ray at angle
    ``theta``, the quadrant starts at ``max(alpha / cos, beta / sin)``; the
    switch is at ``theta* = atan2(beta, alpha)``, which splits the integral
    into one piece per edge.
    """
    alpha, beta = np.broadcast_arrays(np.asarray(alpha, float), np.asarray(beta, float))
    out = np.zeros(alpha.shape)
    finite = np.isfinite(alpha) & np.isfinite(beta)
    a = alpha[finite]
    b = beta[finite]
    result = np.empty(a.shape)
    for lo in range(0, a.size, _CHUNK):
        aa = a[lo : lo + _CHUNK]
        bb = b[lo : lo + _CHUNK]
        corner = np.arctan2(bb, aa)
        # Beyond the vertical edge x = a for theta in [corner, pi/2]; beyond the
        # horizontal edge y = b for theta in [0, corner], i.e. t = pi/2 - theta.
        total = _edge_piece(aa, corner) + _edge_piece(bb, np.pi / 2 - corner)
        result[lo : lo + _CHUNK] = total / (2 * np.pi)
    out[finite] = result
    return out


def kernel(epsilon: float, cell_size_m: float, rows: int, cols: int) -> np.ndarray:
    """The noise kernel of the remapped, snapped planar Laplace on a ``rows x cols`` grid.

    ``K[di + rows, dj + cols]`` is the probability that noise added at a cell
    centre lands ``di`` rows and ``dj`` columns away, for ``|di| < rows`` and
    ``|dj| < cols``; ``K[0, :]``, ``K[-1, :]``, ``K[:, 0]`` and ``K[:, -1]``
    hold everything at or beyond ``rows`` (``cols``) cells, which from any
    cell of the grid is remapped to the grid's edge.
    """
    unit = epsilon * cell_size_m
    # Edges of the quadrant's cells, in units of 1/epsilon: 0, c/2, 3c/2, ..., inf.
    edges_y = np.concatenate([[0.0], (np.arange(rows) + 0.5) * unit, [np.inf]])
    edges_x = np.concatenate([[0.0], (np.arange(cols) + 0.5) * unit, [np.inf]])
    s = quadrant_mass(edges_y[:, None], edges_x[None, :])
    quadrant = s[:-1, :-1] - s[1:, :-1] - s[:-1, 1:] + s[1:, 1:]
    # Offset 0 is the centre cell, twice the half-cell next to the axis.
    quadrant[0, :] *= 2
    quadrant[:, 0] *= 2
    full = np.empty((2 * rows + 1, 2 * cols + 1))
    full[rows:, cols:] = quadrant
    full[rows:, :cols] = quadrant[:, :0:-1]
    full[:rows, :] = full[:rows:-1, :]
    return full

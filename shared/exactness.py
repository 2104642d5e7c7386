"""For which epsilon the on-device samplers are exact, derived from their arithmetic.

k-RR and randomized response draw one uniform integer below
``keep + (k - 1) * unit`` (``unit = 2**64``) and compare it with the integer
weights. Planar Laplace draws a radius ``(E1 + E2) / epsilon`` from two
exponentials ``E = -log(U)`` of full-resolution uniforms ``U`` (positive
doubles, see :mod:`shared.rng`) and an angle of 53 bits, adds the offset to a
cell centre and finds the cell by floor division. The functions below say for
which epsilon that arithmetic realises the mechanism's law, and raise
:class:`ValueError` naming the constraint otherwise. The mechanisms'
constructors call them, and the spec validation turns their errors into a
``422 invalid_spec`` on the ``epsilon`` field. docs/privacy.md states the
limits.
"""

from __future__ import annotations

import decimal
import math

from shared.geo import Grid

# The denominator unit of k-RR's integer weights: probabilities are resolved to 2**-64.
WEIGHT_UNIT = 1 << 64
# Decimal digits computed beyond the integer part of exp(epsilon) * unit.
_GUARD_DIGITS = 40
# The aggregator's float probabilities are within 2**-53 (relative) of the integer ones only
# while ``unit / total`` is a normal double, i.e. ``total <= unit * 2**1022``.
_NORMAL_EXPONENT = 1022
# exp(709) * unit is already above unit * 2**1022: no exp needs computing beyond it.
_KRR_EPSILON_CUTOFF = 709.0

# Planar Laplace. The largest exponential: -log of the smallest positive double, 2**-1074.
LARGEST_EXPONENTIAL = -math.log(math.ldexp(1.0, -1074))
# Uniforms from 2**-1022 up are normal doubles with a 52-bit fraction, so exponentials up to
# 1022 ln 2, and sums of two up to twice that, are finely resolved.
FINE_RADIUS_SUM = 2 * _NORMAL_EXPONENT * math.log(2)
# Every radius is within 2**-49 * max(1 / epsilon, radius) of an attainable one: this keeps the
# first term under a quarter cell ...
MIN_EPSILON_TIMES_CELL = 2.0**-47
# ... and this the second, for radii across the grid.
MAX_GRID_SPAN_CELLS = 2.0**47


def keep_weight(epsilon: float, unit: int = WEIGHT_UNIT) -> int:
    """``floor(exp(epsilon) * unit) - 1``, and at least ``unit``: so ``keep / unit <= exp(epsilon)``.

    ``exp`` is evaluated in decimal arithmetic from the exact binary value of
    ``epsilon``, with 40 digits beyond the integer part of the product, so its
    rounding error is far below one; taking one off then guarantees that the
    ratio of the integer weights never exceeds ``exp(epsilon)``.
    """
    integer_digits = len(str(unit)) + math.ceil(epsilon / math.log(10))
    with decimal.localcontext() as ctx:
        ctx.prec = integer_digits + _GUARD_DIGITS
        scaled = decimal.Decimal(epsilon).exp() * unit
    return max(unit, int(scaled) - 1)


def realized_epsilon(epsilon: float, keep: int, unit: int) -> float:
    """``ln(keep / unit)``, the privacy integer weights ``keep`` against ``unit`` actually give.

    It is below ``epsilon`` exactly (:func:`keep_weight`); a float log of the rounded ratio
    could land above it, so this takes ``log1p`` of the exact excess and caps the last-ulp
    rounding at ``epsilon``.
    """
    return min(epsilon, math.log1p((keep - unit) / unit))


def krr_weights(epsilon: float, k: int) -> int:
    """The keep weight of k-RR over ``k`` labels; :class:`ValueError` if the weights cannot realise it.

    Two limits, both exact integer tests on the weights:

    * ``keep > unit``: below ``epsilon = 2**-63`` the product ``exp(epsilon) * 2**64`` is
      below ``2**64 + 2``, the keep weight equals the unit, every label is reported with the
      same probability and the channel cannot be inverted;
    * ``keep + (k - 1) * unit <= unit * 2**1022``: beyond (about ``epsilon = 708.4``) the
      probability of another label is not a normal double, and the float channel the
      aggregator estimates with would no longer match the device's.
    """
    limit = WEIGHT_UNIT << _NORMAL_EXPONENT
    if (
        epsilon > _KRR_EPSILON_CUTOFF
        or (keep := keep_weight(epsilon)) + (k - 1) * WEIGHT_UNIT > limit
    ):
        raise ValueError(
            f"epsilon {epsilon!r} is too large for k-RR's integer weights: the probability of "
            f"another label, 1 / (e^epsilon + k - 1), must stay at least 2**-{_NORMAL_EXPONENT} "
            "(epsilon at most about 708)"
        )
    if keep == WEIGHT_UNIT:
        raise ValueError(
            f"epsilon {epsilon!r} is too small for k-RR's integer weights: e^epsilon * 2**64 "
            "rounds to the weight of another label, so every label would be equally likely "
            "(epsilon must be at least 2**-63, about 1.08e-19)"
        )
    return keep


def check_planar_epsilon(epsilon: float, grid: Grid) -> None:
    """Refuse an ``epsilon`` (per metre) for which the planar sampler on ``grid`` is not exact.

    Three conditions:

    * **resolution**: ``epsilon * cell_size_m >= 2**-47``. The attainable radii
      near zero are multiples of ``2**-52 / epsilon`` (the smallest exponential
      is ``-log(1 - 2**-53) = 2**-53``), and every radius is within
      ``2**-49 * max(1 / epsilon, radius)`` of an attainable one (the
      exponentials' resolution, the sum's and the division's rounding), every
      angle within ``2**-51`` radians; with this bound and a grid under
      ``2**47`` cells across, every point of the grid is within a quarter cell
      of an attainable noisy point, so every cell is reached from every cell
      with positive probability. Far below it the true cell itself is
      unreachable (``2**-52 / epsilon`` beyond half a cell).
    * **reach**: ``epsilon * hypot(rows, cols) * cell_size_m <= 2 * 1022 ln 2``
      (about 1416.8). Radii are finely resolved up to that sum over epsilon
      (beyond it the uniforms are subnormal and their exponentials coarse), so
      every cell is reached from every cell with positive probability.
    * **finite arithmetic**: the largest noisy coordinate, the farthest centre
      plus ``2 * 1074 ln 2 / epsilon``, and its floor division by the cell
      size are finite doubles. Otherwise the sampler meets an infinity and
      fails (``inf // cell`` is NaN); this binds only for cells of more than
      about 1e290 m, the resolution bound coming first for any other.
    """
    cell = grid.cell_size_m
    if not epsilon * cell >= MIN_EPSILON_TIMES_CELL:
        raise ValueError(
            f"epsilon {epsilon!r} per metre is too small for {cell:g} m cells: the sampler "
            "resolves radii only to 2**-52 / epsilon, so epsilon * cell_size_m must be at least "
            "2**-47 (about 7.1e-15)"
        )
    span_cells = math.hypot(grid.rows, grid.cols)
    if span_cells > MAX_GRID_SPAN_CELLS:
        raise ValueError("the grid must be under 2**47 cells across for the sampler to be exact")
    if epsilon * span_cells * cell > FINE_RADIUS_SUM:
        raise ValueError(
            f"epsilon {epsilon!r} per metre is too large for this grid: the sampler resolves "
            f"radii finely only up to {FINE_RADIUS_SUM:.6g} / epsilon, so epsilon times the "
            f"grid's diagonal must be at most {FINE_RADIUS_SUM:.6g} (here it is "
            f"{epsilon * span_cells * cell:.6g})"
        )
    # The sampler's own arithmetic at its extremes: both exponentials at their largest and the
    # angle 0 or pi (cos = +-1) from the farthest and the nearest centre.
    radius = (LARGEST_EXPONENTIAL + LARGEST_EXPONENTIAL) / epsilon
    farthest = (max(grid.rows, grid.cols) - 1 + 0.5) * cell
    extremes = (farthest + radius, 0.5 * cell - radius)
    if not all(math.isfinite(coordinate // cell) for coordinate in extremes):
        raise ValueError(
            f"epsilon {epsilon!r} per metre is too small: the sampler's largest radius, "
            f"{2 * LARGEST_EXPONENTIAL:.6g} / epsilon, plus the grid's extent must be a finite "
            "double"
        )

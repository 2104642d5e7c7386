"""Compiled loops over FFTW plans: the planar channel's convolution and its IBU steps.

:func:`convolve` runs one two-stage FFT convolution (see
:class:`aggregator.estimation.fftw.Convolution`); :func:`ibu_advance` runs IBU
steps on a :class:`aggregator.estimation.grid_channels.PlanarLaplaceChannel` with
the same arithmetic as its ``forward`` and ``backward`` (the docstring there
derives it), fused so that a step costs four transforms and a few passes over
the grid instead of some forty numpy calls. Everything is compiled once and
cached on disk by numba: FFTW is called through the address of
``fftw_execute``, passed in as an argument, so that the compiled code holds
no address of the process that compiled it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# error_model="numpy": a division by zero gives inf or nan as in numpy, with no check that
# would keep the loops from vectorising. Not fastmath: the arithmetic stays IEEE.
COMPILE = {"cache": True, "nogil": True, "error_model": "numpy"}


@intrinsic
def _call(typingctx, function, argument):
    """Call the C function ``void f(void *)`` at address ``function`` with ``argument``."""
    if not (isinstance(function, types.Integer) and isinstance(argument, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        pointer = ir.IntType(8).as_pointer()
        callee = ir.FunctionType(ir.VoidType(), [pointer]).as_pointer()
        builder.call(builder.inttoptr(args[0], callee), [builder.inttoptr(args[1], pointer)])
        return context.get_dummy_value()

    return types.void(function, argument), codegen


@njit(**COMPILE)  # type: ignore[call-overload]  # numba's overloads take no **dict[str, object]
def convolve(execute, plans, spectrum, kernel):
    """Transform the plans' image, multiply by ``kernel``'s spectrum, transform back."""
    _call(execute, plans[0])
    _call(execute, plans[1])
    for k in range(spectrum.shape[0]):
        for m in range(spectrum.shape[1]):
            spectrum[k, m] *= kernel[k, m]
    _call(execute, plans[2])
    _call(execute, plans[3])


@njit(**COMPILE)  # type: ignore[call-overload]  # numba's overloads take no **dict[str, object]
def ibu_forward(fft, kernels, edges, p, predicted, bordered):
    """``predicted = forward(p)`` for a distribution ``p`` (negative round-off cleared).

    ``fft`` is ``(execute, plans, image, spectrum, result)``, ``kernels`` the
    spectra ``(K, conj(K))``, ``edges`` the 1-D factors ``(last_row,
    last_col)`` and their transposes (contiguous); ``bordered`` has a zero
    first row and column.
    """
    execute, plans, image, spectrum, result = fft
    last_row, last_col = edges[0], edges[1]
    rows, cols = p.shape
    column_sums = np.zeros(cols)
    row_sums = np.zeros(rows)
    for i in range(rows):
        total = 0.0
        for j in range(cols):
            value = p[i, j]
            image[i, j] = value
            column_sums[j] += value
            total += value
        row_sums[i] = total
    convolve(execute, plans, spectrum, kernels[0])
    for i in range(rows - 1):
        for j in range(cols - 1):
            bordered[i + 1, j + 1] = result[i, j]
    # S's last row (its corner is the total mass) and last column: the remapped tails.
    last = bordered[rows, 1:]
    last[:] = 0.0
    for y in range(cols):
        weight = column_sums[y]
        for j in range(cols):
            last[j] += weight * last_row[y, j]
    tail = np.zeros(rows - 1)
    for x in range(rows):
        weight = row_sums[x]
        for i in range(rows - 1):
            tail[i] += weight * last_col[x, i]
    bordered[1:rows, cols] = tail
    for i in range(rows):
        for j in range(cols):
            value = bordered[i + 1, j + 1] - bordered[i, j + 1]
            value -= bordered[i + 1, j] - bordered[i, j]
            predicted[i, j] = max(value, 0.0)


@njit(**COMPILE)  # type: ignore[call-overload]  # numba's overloads take no **dict[str, object]
def ibu_update(fft, kernels, edges, counts, p, predicted, ratio, relaxed):
    """One EM update of ``p`` in place, over-relaxed if ``relaxed`` (the factor to the power
    1.75, as ``planar_steps.relax``); returns the largest change of a frequency.

    ``ratio`` has a zero last row and column (``u`` padded, as ``backward`` pads it).
    """
    execute, plans, image, spectrum, result = fft
    last_row_t, last_col_t = edges[2], edges[3]
    rows, cols = p.shape
    for i in range(rows):
        for j in range(cols):
            ratio[i, j] = counts[i, j] / predicted[i, j] if counts[i, j] > 0 else 0.0
    # backward(ratio): the transpose of forward's second differences, then of its products.
    row_weights = np.empty(cols)
    column_weights = np.empty(rows - 1)
    for i in range(rows - 1):
        for j in range(cols - 1):
            image[i, j] = (ratio[i + 1, j + 1] - ratio[i, j + 1]) - (ratio[i + 1, j] - ratio[i, j])
        image[i, cols - 1] = 0.0
        column_weights[i] = ratio[i, cols - 1] - ratio[i + 1, cols - 1]
    for j in range(cols):
        image[rows - 1, j] = 0.0
        row_weights[j] = ratio[rows - 1, j] - ratio[rows - 1, j + 1]
    # The products by the transposed factors, accumulated a row of them at a time (so that
    # the sums run across the vector, not down one long chain).
    along_rows = np.zeros(cols)
    for j in range(cols):
        weight = row_weights[j]
        for y in range(cols):
            along_rows[y] += weight * last_row_t[j, y]
    along_columns = np.zeros(rows)
    for i in range(rows - 1):
        weight = column_weights[i]
        for x in range(rows):
            along_columns[x] += weight * last_col_t[i, x]
    convolve(execute, plans, spectrum, kernels[1])
    column_totals = np.zeros(cols)
    for i in range(rows):
        for j in range(cols):
            # Non-negative in exact arithmetic: round-off below 0 would leave p at -1e-250.
            factor = max((along_rows[j] + along_columns[i]) + result[i, j], 0.0)
            if relaxed:
                factor *= np.sqrt(factor * np.sqrt(factor))
            value = p[i, j] * factor
            ratio[i, j] = value
            column_totals[j] += value
    total = column_totals.sum()
    changes = np.zeros(cols)
    for i in range(rows):
        for j in range(cols):
            value = ratio[i, j] / total
            changes[j] = max(changes[j], abs(value - p[i, j]))
            p[i, j] = value
    return changes.max()


@njit(**COMPILE)  # type: ignore[call-overload]  # numba's overloads take no **dict[str, object]
def ibu_advance(fft, kernels, edges, counts, p, predicted, steps, tol, done, relax_after):
    """Up to ``steps`` IBU steps, stopping after one that changes no frequency by more than
    ``tol``; ``p`` and ``predicted`` are updated in place. ``done`` steps were taken before;
    the steps after the first ``relax_after`` are over-relaxed. Returns the steps taken and
    the last step's largest change."""
    rows, cols = p.shape
    bordered = np.zeros((rows + 1, cols + 1))
    ratio = np.zeros((rows + 1, cols + 1))
    taken = 0
    change = np.inf
    while taken < steps:
        relaxed = done + taken >= relax_after
        change = ibu_update(fft, kernels, edges, counts, p, predicted, ratio, relaxed)
        taken += 1
        ibu_forward(fft, kernels, edges, p, predicted, bordered)
        if change <= tol:
            break
    return taken, change

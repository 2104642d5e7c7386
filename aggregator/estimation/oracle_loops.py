"""Compiled loops of OLH's channel: hash every value under every seed, without temporaries.

OLH's products run over all ``S`` seeds and all ``k`` values (``S k`` hash
evaluations, 10^9 at a million values and the default pool); numpy needs about
seven passes over ``k`` per seed, these loops one. Imported only where numba is
installed (the ``fast`` extra); :mod:`aggregator.estimation.oracles` falls back
to numpy otherwise, with the same results up to the order of sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_SHIFT = np.uint64(32)


# Values per block of the gather: one block is hashed under every seed by one thread.
BLOCK = 4096


@njit(cache=True, nogil=True)
def _gather_block(out, table, multipliers, offsets, g, start, stop):
    width = np.uint64(g)
    for s in range(multipliers.size):
        a = multipliers[s]
        b = offsets[s]
        row = table[s]
        for x in range(start, stop):
            h = (((a * np.uint64(x) + b) >> _SHIFT) * width) >> _SHIFT
            out[x] += row[h]


@njit(cache=True, nogil=True, parallel=True)
def _gather_parallel(table, multipliers, offsets, g, k):
    out = np.zeros(k)
    for block in prange((k + BLOCK - 1) // BLOCK):
        start = block * BLOCK
        _gather_block(out, table, multipliers, offsets, g, start, min(k, start + BLOCK))
    return out


@njit(cache=True, nogil=True)
def _gather_serial(table, multipliers, offsets, g, k):
    out = np.zeros(k)
    _gather_block(out, table, multipliers, offsets, g, 0, k)
    return out


def gather(table, multipliers, offsets, g, k):
    """``out[x] = sum_s table[s, H_s(x)]`` for ``x < k`` (``table`` is ``S x g``).

    In parallel over blocks of :data:`BLOCK` values; a single block runs without starting
    the thread pool (which cost 50-80 ms on a loaded machine, against 0.1 ms for the work).
    """
    if k <= BLOCK:
        return _gather_serial(table, multipliers, offsets, g, k)
    return _gather_parallel(table, multipliers, offsets, g, k)


@njit(cache=True, nogil=True)
def scatter(weights, multipliers, offsets, g):
    """``out[s, v] = sum_{x: H_s(x) = v} weights[x]`` (``S x g``)."""
    seeds = multipliers.size
    out = np.zeros((seeds, g))
    width = np.uint64(g)
    for s in range(seeds):
        a = multipliers[s]
        b = offsets[s]
        for x in range(weights.size):
            h = (((a * np.uint64(x) + b) >> _SHIFT) * width) >> _SHIFT
            out[s, h] += weights[x]
    return out

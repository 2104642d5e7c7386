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


@njit(cache=True, nogil=True, parallel=True)
def gather(table, multipliers, offsets, g, k):
    """``out[x] = sum_s table[s, H_s(x)]`` for ``x < k`` (``table`` is ``S x g``)."""
    out = np.zeros(k)
    seeds = multipliers.size
    width = np.uint64(g)
    blocks = (k + 4095) // 4096
    for block in prange(blocks):
        start = block * 4096
        stop = min(k, start + 4096)
        for s in range(seeds):
            a = multipliers[s]
            b = offsets[s]
            row = table[s]
            for x in range(start, stop):
                h = (((a * np.uint64(x) + b) >> _SHIFT) * width) >> _SHIFT
                out[x] += row[h]
    return out


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

"""A fast stand-in for the earth mover's distance between distributions on a grid.

The earth mover's distance, the mass times the distance it must move to turn one distribution
into the other, is how locations are judged (the simulator and the benchmarks, by an exact
solver); it takes a linear program. :func:`dyadic_transport` sums the differences in mass over
square blocks of 1, 2, 4, ... cells, each weighted by the block's side (the quadtree embedding
of Indyk and Thaper, "Fast image retrieval via embeddings", 2003): moving a block's surplus
into its parent block costs at most a few times its side, so the sum bounds the earth mover's
distance from above up to a constant factor. In linear time it ranks estimates of a
distribution as the exact distance does where their errors are local (a report moved by the
noise, an estimate blurred or sharpened).
"""

from __future__ import annotations

import numpy as np


def dyadic_transport(a: np.ndarray, b: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Half the sum over square blocks of ``1, 2, 4, ...`` cells, aligned on the grid's first
    cell and cut at its edges, up to one block covering the grid, of the block's side (in
    cells) times the absolute difference of ``a``'s and ``b``'s mass in it.

    ``a`` and ``b`` hold a distribution over the ``rows x cols`` cells (row-major) in their last
    axis; leading axes broadcast, and the result has them (a float for two single
    distributions).
    """
    difference = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    lead = difference.shape[:-1]
    if difference.shape[-1] != rows * cols:
        raise ValueError(f"expected {rows * cols} cells in the last axis, got {difference.shape}")
    blocks = difference.reshape(*lead, rows, cols)
    total = np.zeros(lead)
    side = 1
    while True:
        total += side * np.abs(blocks).sum(axis=(-2, -1))
        if blocks.shape[-2] == 1 and blocks.shape[-1] == 1:
            return total / 2
        # Pair up rows and columns (a lone last one is a block of its own).
        r, c = blocks.shape[-2], blocks.shape[-1]
        padded = np.zeros((*lead, r + r % 2, c + c % 2))
        padded[..., :r, :c] = blocks
        blocks = padded.reshape(*lead, (r + 1) // 2, 2, (c + 1) // 2, 2).sum(axis=(-3, -1))
        side *= 2

"""Channels of frequency oracles for large domains, as operators over fast transforms.

Hadamard response on ``k`` labels with ``K`` outputs (a power of two above
``k``): with ``a`` and ``b`` the probabilities of an output inside and outside
the true label's half, ``C[x, y] = (a + b) / 2 + (a - b) / 2 H[x + 1, y]`` for
the Sylvester Hadamard matrix ``H`` (symmetric, ``H H = K I``). So

    forward(p) = (a + b) / 2 sum(p) + (a - b) / 2 H p~        (p~: p moved to rows 1..k)
    backward(u)_x = (a + b) / 2 sum(u) + (a - b) / 2 (H u)_(x+1)

and the inverse of report frequencies ``q`` is ``p_x = 2 (H q)_(x+1) / ((a - b) K)``:
one fast Walsh-Hadamard transform, O(K log K), never the ``k x K`` matrix.
"""

from __future__ import annotations

import numpy as np

from aggregator.estimation.channels import Channel, SingularChannelError
from shared.mechanisms import HadamardResponse


def walsh_hadamard(values: np.ndarray) -> np.ndarray:
    """``H v`` for the Sylvester Hadamard matrix of the last axis's size (a power of two)."""
    out = np.array(values, dtype=float)
    size = out.shape[-1]
    if size & (size - 1):
        raise ValueError(f"the transform's length must be a power of two, got {size}")
    lead = out.shape[:-1]
    half = 1
    while half < size:
        blocks = out.reshape(*lead, size // (2 * half), 2, half)
        top, bottom = blocks[..., 0, :].copy(), blocks[..., 1, :]
        blocks[..., 0, :] += bottom
        blocks[..., 1, :] = top - bottom
        half *= 2
    return out


class HadamardChannel(Channel):
    """Hadamard response's channel: ``k`` inputs, ``K`` outputs."""

    def __init__(self, mechanism: HadamardResponse):
        self.n_inputs, self.n_outputs = mechanism.k, mechanism.size
        size = mechanism.size
        self.inside = 2 * mechanism.p_in / size
        self.outside = 2 * (1 - mechanism.p_in) / size

    def _padded(self, p: np.ndarray) -> np.ndarray:
        padded = np.zeros((*p.shape[:-1], self.n_outputs))
        padded[..., 1 : self.n_inputs + 1] = p
        return padded

    def forward(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        mean = (self.inside + self.outside) / 2
        spread = (self.inside - self.outside) / 2
        return mean * p.sum(axis=-1, keepdims=True) + spread * walsh_hadamard(self._padded(p))

    def backward(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        mean = (self.inside + self.outside) / 2
        spread = (self.inside - self.outside) / 2
        transformed = walsh_hadamard(u)[..., 1 : self.n_inputs + 1]
        return mean * u.sum(axis=-1, keepdims=True) + spread * transformed

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The unbiased inverse: the ``p`` whose forward is ``q`` wherever ``q`` has one."""
        spread = (self.inside - self.outside) / 2
        if spread <= 0:
            raise SingularChannelError(
                "Hadamard response with epsilon this small is not invertible"
            )
        transformed = walsh_hadamard(np.asarray(q, dtype=float))[..., 1 : self.n_inputs + 1]
        return transformed / (spread * self.n_outputs), True

"""The channel operator of each mechanism."""

from __future__ import annotations

from aggregator.estimation.channels import Channel, KRRChannel
from aggregator.estimation.grid_channels import (
    GridKernelChannel,
    ManhattanKernelChannel,
    PlanarLaplaceChannel,
)
from aggregator.estimation.grid_kernel import euclidean_kernel
from aggregator.estimation.oracles import HadamardChannel, OLHChannel
from aggregator.estimation.ordinal import GeometricChannel
from shared.mechanisms import (
    KRR,
    ExponentialGrid,
    Geometric,
    HadamardResponse,
    Mechanism,
    PlanarLaplace,
)
from shared.oracles import OLH
from shared.spec import MANHATTAN


def channel_for(mechanism: Mechanism) -> Channel:
    """The channel operator of a mechanism, with the probabilities its sampler realises."""
    if isinstance(mechanism, PlanarLaplace):
        grid = mechanism.grid
        return PlanarLaplaceChannel(
            epsilon=mechanism.epsilon, cell_size_m=grid.cell_size_m, rows=grid.rows, cols=grid.cols
        )
    if isinstance(mechanism, KRR):
        return KRRChannel(mechanism.k, mechanism.p_keep, mechanism.p_other)
    if isinstance(mechanism, Geometric):
        return GeometricChannel(mechanism)
    if isinstance(mechanism, ExponentialGrid):
        grid = mechanism.grid
        if mechanism.metric == MANHATTAN:
            return ManhattanKernelChannel(mechanism)
        kernel = euclidean_kernel(float(mechanism.step_epsilon), grid.rows, grid.cols)
        return GridKernelChannel(kernel, grid.rows, grid.cols)
    if isinstance(mechanism, HadamardResponse):
        return HadamardChannel(mechanism)
    if isinstance(mechanism, OLH):
        return OLHChannel(mechanism)
    raise TypeError(f"no channel for {type(mechanism).__name__}")

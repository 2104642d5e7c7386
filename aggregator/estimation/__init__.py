"""Estimators of the true distribution from perturbed reports."""

from aggregator.estimation.channels import (
    Channel,
    DenseChannel,
    GridKernelChannel,
    KRRChannel,
    ManhattanKernelChannel,
    PlanarLaplaceChannel,
    SingularChannelError,
    channel_for,
)
from aggregator.estimation.compute import METHODS, EstimateResult, estimate
from aggregator.estimation.estimators import IBU, MatrixInversion, project_to_simplex
from aggregator.estimation.oracles import HadamardChannel, OLHChannel, oue_estimate

__all__ = [
    "IBU",
    "METHODS",
    "Channel",
    "DenseChannel",
    "EstimateResult",
    "GridKernelChannel",
    "HadamardChannel",
    "KRRChannel",
    "ManhattanKernelChannel",
    "MatrixInversion",
    "OLHChannel",
    "PlanarLaplaceChannel",
    "SingularChannelError",
    "channel_for",
    "estimate",
    "oue_estimate",
    "project_to_simplex",
]

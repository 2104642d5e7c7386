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

__all__ = [
    "IBU",
    "METHODS",
    "Channel",
    "DenseChannel",
    "EstimateResult",
    "GridKernelChannel",
    "KRRChannel",
    "ManhattanKernelChannel",
    "MatrixInversion",
    "PlanarLaplaceChannel",
    "SingularChannelError",
    "channel_for",
    "estimate",
    "project_to_simplex",
]

"""Estimators of the true distribution from perturbed reports.

Which one runs by default for each mechanism is decided in one place,
:mod:`aggregator.estimation.decision`; :func:`estimate` runs it (or the method asked for)
and adds confidence intervals.
"""

from aggregator.estimation.channels import Channel, DenseChannel, KRRChannel, SingularChannelError
from aggregator.estimation.compute import EstimateResult, estimate, point_estimate
from aggregator.estimation.decision import DEFAULT_METHODS, METHODS, default_method
from aggregator.estimation.factory import channel_for
from aggregator.estimation.grid_channels import (
    GridKernelChannel,
    ManhattanKernelChannel,
    PlanarLaplaceChannel,
)
from aggregator.estimation.ibu import IBU
from aggregator.estimation.inversion import MatrixInversion, project_to_simplex
from aggregator.estimation.mle import MaximumLikelihood
from aggregator.estimation.oracles import HadamardChannel, OLHChannel, oue_estimate

__all__ = [
    "DEFAULT_METHODS",
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
    "MaximumLikelihood",
    "OLHChannel",
    "PlanarLaplaceChannel",
    "SingularChannelError",
    "channel_for",
    "default_method",
    "estimate",
    "oue_estimate",
    "point_estimate",
    "project_to_simplex",
]

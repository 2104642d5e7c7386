"""The on-device reporter: only perturbed reports leave the device.

Re-exports only; see :mod:`client.reporter` for the pipeline.
"""

from client.errors import (
    AlreadyReported,
    BudgetExceeded,
    CampaignClosed,
    CampaignNotFound,
    ClientError,
    EpsilonCapExceeded,
    PolicyError,
    ServerError,
    ServerRejected,
    ServerUnavailable,
    SpecChanged,
    StateError,
    UntrustedSpec,
)
from client.outbox import FlushResult
from client.policy import Policy
from client.reporter import Reporter, ReportResult
from client.state import default_state_dir

__all__ = [
    "AlreadyReported",
    "BudgetExceeded",
    "CampaignClosed",
    "CampaignNotFound",
    "ClientError",
    "EpsilonCapExceeded",
    "FlushResult",
    "Policy",
    "PolicyError",
    "ReportResult",
    "Reporter",
    "ServerError",
    "ServerRejected",
    "ServerUnavailable",
    "SpecChanged",
    "StateError",
    "UntrustedSpec",
    "default_state_dir",
]

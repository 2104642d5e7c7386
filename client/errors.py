"""Errors raised by the client library.

The tree (``LDPError`` and ``ReportError`` come from :mod:`shared.errors`)::

    LDPError
     ├── ValidationError
     │    └── ReportError            the true value does not fit the campaign (bad label,
     │                               location outside the region); nothing was spent or sent
     └── ClientError
          ├── PolicyError            refused on the device by the user's policy
          │    ├── EpsilonCapExceeded  the campaign's epsilon is above the per-report cap
          │    ├── BudgetExceeded      the report would take the ledger past the total budget
          │    └── SpecChanged         the server now serves another spec for a pinned campaign
          ├── AlreadyReported        another answer in a period this device already reported in
          │                          (the campaign counts a device once per period)
          ├── ServerError            the server answered, but not with something usable
          │    ├── CampaignNotFound    404
          │    ├── CampaignClosed      the campaign is closed (status or 409)
          │    ├── UntrustedSpec       malformed spec, or a hash that does not match it
          │    └── ServerRejected      any other 4xx answer
          ├── ServerUnavailable      no usable answer: refused connection, timeout, 5xx, 429
          └── StateError             the state directory is unusable (corrupt, permissions, full)

Every :class:`ClientError` has a stable ``code`` and ``to_dict()`` in the
same ``{"code", "message", "field"}`` shape the aggregator uses. No error
message ever contains the user's true value.
"""

from __future__ import annotations

from shared.errors import LDPError


class ClientError(LDPError):
    """Base class of the errors the client library raises itself."""

    code = "client_error"


class PolicyError(ClientError):
    """The user's policy, enforced on the device, refuses the report."""

    code = "refused_by_policy"


class EpsilonCapExceeded(PolicyError):
    code = "epsilon_cap_exceeded"


class BudgetExceeded(PolicyError):
    code = "budget_exceeded"


class SpecChanged(PolicyError):
    code = "spec_changed"


class AlreadyReported(ClientError):
    """The campaign has this device's report for the period, made with another answer.

    A campaign counts each device at most once per period (``once``: its whole
    life), so a changed answer waits for the next period; nothing was spent or sent.
    """

    code = "already_reported"


class ServerError(ClientError):
    """The server answered, but the answer cannot be used."""

    code = "server_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        field: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message, field=field, code=code)
        self.status = status


class CampaignNotFound(ServerError):
    code = "campaign_not_found"


class CampaignClosed(ServerError):
    code = "campaign_closed"


class UntrustedSpec(ServerError):
    code = "untrusted_spec"


class ServerRejected(ServerError):
    code = "rejected"


class ServerUnavailable(ClientError):
    """No usable answer; worth retrying later. ``retry_after`` is in seconds, if the server said."""

    code = "server_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class StateError(ClientError):
    code = "state_error"

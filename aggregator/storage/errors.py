"""What the store refuses, and telling Redis's own refusals apart.

A :class:`StoreError` is refused by the state of the data (not by bad input); the
HTTP layer answers each by its ``code``."""

from __future__ import annotations

import redis

from shared.errors import LDPError


def is_out_of_memory(error: redis.RedisError) -> bool:
    """Whether Redis refused a write at its ``maxmemory`` (directly or inside a script)."""
    return isinstance(error, redis.exceptions.OutOfMemoryError) or (
        isinstance(error, redis.ResponseError) and "OOM command not allowed" in str(error)
    )


class StoreError(LDPError):
    """A store operation refused by the state of the data (not by bad input)."""

    code = "store_error"

    def __init__(self, message: str, *, campaign_id: str):
        super().__init__(message)
        self.campaign_id = campaign_id


class CampaignNotFound(StoreError):
    code = "campaign_not_found"


class CampaignClosed(StoreError):
    code = "campaign_closed"


class CampaignExists(StoreError):
    code = "campaign_exists"


class EnrollmentRefused(StoreError):
    """A report's enrollment token was never issued for the campaign, or is spent."""

    code = "enrollment_refused"


class SpecChanged(StoreError):
    """The stored spec is not the one the reports were validated against (nothing stored)."""

    code = "spec_changed"


class RetryLater(StoreError):
    """A refusal that lifts with time; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, *, campaign_id: str, retry_after_s: int) -> None:
        super().__init__(message, campaign_id=campaign_id)
        self.retry_after_s = retry_after_s


class LayoutOutdated(RetryLater):
    """A campaign stored by an older version that has not been migrated yet."""

    code = "storage_unavailable"


class RateLimited(RetryLater):
    """The client has used up its submissions for the current window (nothing stored)."""

    code = "rate_limited"


class ReportBudgetExceeded(RateLimited):
    """The client's address has sent its reports for the current window (nothing stored)."""

    code = "report_budget_exceeded"


class CampaignFull(StoreError):
    """The campaign holds its quota of reports (nothing stored)."""

    code = "campaign_full"


class StorageFull(RetryLater):
    """The store is near its memory limit and takes no new reports for now (nothing stored)."""

    code = "storage_full"

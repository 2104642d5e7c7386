"""Retention of raw reports: stream entries expire, counts stay.

With ``RETENTION_DAYS`` (``LDP_RETENTION_DAYS``) set, every ingest trims the
campaign's report stream of entries older than that, in the same atomic
script that appends the new ones. A campaign that receives no more reports
keeps its old entries until :func:`trim_all` runs: from cron, as
``ldp-aggregator retention --days 30``. The counts, the hourly counts and the
estimates are untouched, so estimates do not change when raw reports expire.

No client address is ever stored with a report: the stream holds
``report_id``, ``y`` and ``value`` only. (The rate limiter's counters are
keyed by address and expire with their window; gunicorn's access log, if
kept, records addresses and paths but never report bodies.)
"""

from __future__ import annotations

import time
from typing import Any

from aggregator.storage.store import CampaignStore
from shared.schema import is_positive_finite

DAY_S = 86_400


def retention_seconds(days: Any) -> float | None:
    """Seconds to keep raw reports from a ``RETENTION_DAYS`` setting; None/0/"" keep them all."""
    if isinstance(days, bool):
        raise ValueError(f"RETENTION_DAYS must be a number of days, got {days!r}")
    if days is None or days == "" or days == 0:
        return None
    if not isinstance(days, (int, float)):
        try:
            days = float(days)
        except (TypeError, ValueError):
            raise ValueError(f"RETENTION_DAYS must be a number of days, got {days!r}") from None
    if not is_positive_finite(days):
        raise ValueError(f"RETENTION_DAYS must be a positive number of days, got {days!r}")
    return float(days) * DAY_S


def trim_all(store: CampaignStore, retention_s: float, *, now: float | None = None) -> dict:
    """Trim every campaign's stream of entries older than ``retention_s``; entries removed each."""
    cutoff = (time.time() if now is None else now) - retention_s
    return {
        campaign.spec.id: store.trim_reports(campaign.spec.id, older_than=cutoff)
        for campaign in store.list_campaigns()
    }

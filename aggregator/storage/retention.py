"""Retention: raw reports and counts per period expire, all-time counts stay.

With ``RETENTION_DAYS`` (``LDP_RETENTION_DAYS``, read by
:class:`aggregator.settings.Settings`) set, every ingest trims the
campaign's report stream of entries older than that, in the same atomic
script that appends the new ones. A campaign that receives no more reports
keeps its old entries until :func:`trim_all` runs: from cron, as
``ldp-aggregator retention --days 30``. The counts, the hourly counts and the
estimates are untouched, so estimates do not change when raw reports expire.

Counts per period (:mod:`aggregator.storage.periods`) are kept
``PERIOD_RETENTION_DAYS`` (``LDP_PERIOD_RETENTION_DAYS``, 400 by default) after
their period ends: every ingest sets their expiry (:func:`period_ttl_s`), so
Redis drops them on its own and no cron job is needed. A window reaching into
expired periods is estimated from the periods still kept, and says so. A
changed setting applies to the periods written after the change.

No client address is ever stored with a report: the stream holds
``report_id``, ``y`` and ``value`` only. (The rate limiter's counters are
keyed by address and expire with their window; gunicorn's access log, if
kept, records addresses and paths but never report bodies.)
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from aggregator.storage import periods

if TYPE_CHECKING:
    from aggregator.storage.store import CampaignStore

DAY_S = 86_400
# Counts per period are kept this long after their period ends: a year of windows and more.
DEFAULT_PERIOD_RETENTION_DAYS = 400.0


def trim_all(store: CampaignStore, retention_s: float, *, now: float | None = None) -> dict:
    """Trim every campaign's stream of entries older than ``retention_s``; entries removed each."""
    cutoff = (time.time() if now is None else now) - retention_s
    return {
        campaign.spec.id: store.trim_reports(campaign.spec.id, older_than=cutoff)
        for campaign in store.list_campaigns()
    }


def period_ttl_s(unit: str, key: str, retention_s: float | None, now: float) -> int:
    """Seconds from ``now`` until the counts of period ``key`` expire (0: never)."""
    if retention_s is None:
        return 0
    expires = periods.end_of(unit, key).timestamp() + retention_s
    return max(math.ceil(expires - now), 1)


def first_kept(unit: str, retention_s: float | None, now: float) -> str | None:
    """The oldest period whose counts are still kept at ``now`` (None: every period is)."""
    if retention_s is None:
        return None
    # The period holding now - retention ends after that moment: its counts are still there.
    return periods.key_at(unit, now - retention_s)

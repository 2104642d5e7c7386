"""Reporting periods: a campaign counts each device at most once per period.

A campaign's spec names its period: ``once`` (the campaign's whole life),
``day`` (the UTC date) or ``week`` (the ISO week, in UTC). A period is named by
a key, the same on every machine: ``"once"``, ``"2025-01-15"`` or
``"2025-W03"``. The device computes it from its own clock when it reports.

Standard library only: the client imports this through :mod:`shared.spec`.
"""

from __future__ import annotations

import datetime

ONCE = "once"
DAY = "day"
WEEK = "week"
PERIODS = (ONCE, DAY, WEEK)
DEFAULT_PERIOD = ONCE


def _utc(timestamp: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)


def period_key(period: str, timestamp: float) -> str:
    """The key of the period of ``period`` holding ``timestamp`` (seconds since the epoch)."""
    if period == ONCE:
        return ONCE
    moment = _utc(timestamp)
    if period == DAY:
        return moment.date().isoformat()
    if period == WEEK:
        year, week, _ = moment.isocalendar()
        return f"{year:04d}-W{week:02d}"
    raise ValueError(f"unknown period {period!r}; expected one of {', '.join(PERIODS)}")


def period_start(period: str, key: str) -> datetime.datetime:
    """When the ``day`` or ``week`` period named ``key`` begins (UTC)."""
    if period == DAY:
        day = datetime.date.fromisoformat(key)
    elif period == WEEK:
        year, week = key.split("-W")
        day = datetime.date.fromisocalendar(int(year), int(week), 1)
    else:
        raise ValueError(f"a {period!r} period has no start; expected day or week")
    return datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.UTC)


def next_period_start(period: str, key: str) -> datetime.datetime | None:
    """When the period after the one named ``key`` begins (UTC); None for ``once``."""
    if period == ONCE:
        return None
    if period not in PERIODS:
        raise ValueError(f"unknown period {period!r}; expected one of {', '.join(PERIODS)}")
    return period_start(period, key) + datetime.timedelta(days=1 if period == DAY else 7)

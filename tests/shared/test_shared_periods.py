"""Reporting periods: their keys in UTC (dates, ISO weeks) and when the next one begins."""

from __future__ import annotations

import datetime

import pytest

from shared.periods import PERIODS, next_period_start, period_key


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    ("moment", "day", "week"),
    [
        ("2025-01-15T00:00:00+00:00", "2025-01-15", "2025-W03"),
        ("2025-01-15T23:59:59.999+00:00", "2025-01-15", "2025-W03"),
        # UTC, whatever the device's time zone: still the 15th in UTC.
        ("2025-01-16T01:00:00+02:00", "2025-01-15", "2025-W03"),
        # ISO weeks cross years: Monday 30 December 2024 opens 2025's first week...
        ("2024-12-30T12:00:00+00:00", "2024-12-30", "2025-W01"),
        ("2024-12-29T23:59:59+00:00", "2024-12-29", "2024-W52"),
        # ...and 3 January 2021 closes 2020's 53rd.
        ("2021-01-03T12:00:00+00:00", "2021-01-03", "2020-W53"),
    ],
)
def test_period_keys_are_utc_dates_and_iso_weeks(moment, day, week):
    timestamp = at(moment)
    assert period_key("day", timestamp) == day
    assert period_key("week", timestamp) == week
    assert period_key("once", timestamp) == "once"


def test_the_next_period_begins_at_midnight_utc_and_on_monday():
    utc = datetime.UTC
    assert next_period_start("day", "2024-12-31") == datetime.datetime(2025, 1, 1, tzinfo=utc)
    assert next_period_start("week", "2025-W03") == datetime.datetime(2025, 1, 20, tzinfo=utc)
    assert next_period_start("week", "2020-W53") == datetime.datetime(2021, 1, 4, tzinfo=utc)
    assert next_period_start("once", "once") is None
    # The next period's key is the one after.
    start = next_period_start("week", "2024-W52").timestamp()
    assert period_key("week", start) == "2025-W01"
    assert period_key("week", start - 0.001) == "2024-W52"


def test_an_unknown_period_is_an_error():
    assert PERIODS == ("once", "day", "week")
    with pytest.raises(ValueError, match="unknown period 'month'"):
        period_key("month", 0.0)
    with pytest.raises(ValueError, match="unknown period 'month'"):
        next_period_start("month", "2025-01")

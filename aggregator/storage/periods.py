"""The periods a campaign's counts are kept by, and windows of them.

Besides its all-time counts, every shard of a campaign counts its reports per
period (:mod:`aggregator.storage.layout`): a report is counted in the period in
which the **server received it**, in UTC. A campaign whose spec's ``period`` is
``day`` or ``week`` is counted by that period (the UTC date, the ISO week); a
``once`` campaign, whose devices report once in its whole life, is counted by
UTC day, so that its reports can still be looked at by window. A period is
named by its key, the device's key for it (:func:`shared.periods.period_key`):
``2026-12-01`` or ``2026-W48``.

A :class:`Window` is the periods from ``since`` to ``until``, both included.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from shared.periods import DAY, ONCE, WEEK, next_period_start, period_key, period_start

# The units counts are kept by: a ``once`` campaign is counted by day.
UNITS = (DAY, WEEK)
_FORMATS = {
    DAY: (re.compile(r"\d{4}-\d{2}-\d{2}"), "an ISO date YYYY-MM-DD", "2026-12-01"),
    WEEK: (re.compile(r"\d{4}-W\d{2}"), "an ISO week YYYY-Www", "2026-W48"),
}
_NOUNS = {DAY: "day", WEEK: "week"}
# The years a window may name: any campaign's periods, with room to count back from them.
FIRST_YEAR, LAST_YEAR = 1970, 9000


def unit_of(period: str) -> str:
    """The unit a campaign of reporting period ``period`` is counted by."""
    if period == ONCE:
        return DAY
    if period not in UNITS:
        raise ValueError(f"unknown period {period!r}")
    return period


def key_at(unit: str, timestamp: float) -> str:
    """The key of the period of ``unit`` that holds ``timestamp`` (unix seconds, UTC)."""
    return period_key(unit, timestamp)


def start_of(unit: str, key: str) -> datetime.datetime:
    """When the period ``key`` begins (UTC)."""
    return period_start(unit, key)


def end_of(unit: str, key: str) -> datetime.datetime:
    """When the period after ``key`` begins (UTC)."""
    end = next_period_start(unit, key)
    assert end is not None
    return end


def shifted(unit: str, key: str, periods: int) -> str:
    """The key ``periods`` periods after ``key`` (before it if negative)."""
    step = datetime.timedelta(days=1 if unit == DAY else 7)
    return key_at(unit, (start_of(unit, key) + periods * step).timestamp())


def parse_key(unit: str, text: str, name: str) -> str:
    """``text`` as a period key of ``unit``; ValueError naming ``name`` and the format."""
    pattern, words, example = _FORMATS[unit]
    problem = None
    if not pattern.fullmatch(text):
        problem = f"must be {words} (e.g. {example})"
    elif not FIRST_YEAR <= int(text[:4]) <= LAST_YEAR:
        problem = f"must be {words} of a year from {FIRST_YEAR} to {LAST_YEAR}"
    else:
        try:
            end_of(unit, text)
        except ValueError:
            problem = f"must be {words} that exists (e.g. {example})"
    if problem is not None:
        raise ValueError(
            f"{name} {problem}: this campaign's counts are kept by {_NOUNS[unit]}, got {text!r}"
        )
    return text


@dataclass(frozen=True)
class Window:
    """The periods of ``unit`` from ``since`` to ``until``, both included (``since <= until``)."""

    unit: str
    since: str
    until: str

    def period_keys(self) -> list[str]:
        """Every period's key, oldest first."""
        out = [self.since]
        while out[-1] != self.until:
            out.append(shifted(self.unit, out[-1], 1))
        return out

    def __len__(self) -> int:
        step = 1 if self.unit == DAY else 7
        return (start_of(self.unit, self.until) - start_of(self.unit, self.since)).days // step + 1

    @property
    def start_s(self) -> float:
        """When the window begins (unix seconds)."""
        return start_of(self.unit, self.since).timestamp()

    @property
    def end_s(self) -> float:
        """When the window ends (unix seconds; the next period's start)."""
        return end_of(self.unit, self.until).timestamp()

    def clipped(self, since: str, until: str) -> Window | None:
        """The part of this window from ``since`` to ``until``, or None if they do not meet."""
        first, last = (
            max(self.since, since, key=self._order),
            min(self.until, until, key=self._order),
        )
        if self._order(first) > self._order(last):
            return None
        return Window(self.unit, first, last)

    def _order(self, key: str) -> float:
        return start_of(self.unit, key).timestamp()

    def to_dict(self) -> dict[str, str]:
        return {"since": self.since, "until": self.until, "period": self.unit}

    def __str__(self) -> str:
        return self.since if self.since == self.until else f"{self.since} to {self.until}"

"""Windows of periods in requests: ``since`` and ``until``, and what a window can read.

A window is given in the campaign's periods (:mod:`aggregator.storage.periods`):
ISO dates (``2026-12-01``) for a campaign counted by day (``period`` ``day`` or
``once``), ISO weeks (``2026-W48``) for one counted by week; both ends are
included, and a report is in the period in which the server received it (UTC).
Without ``since`` a window starts at the campaign's first period, without
``until`` it ends at the current one (neither beyond the other end, so that a
window before the campaign or after today is empty); with neither, the request is
over all time
(the all-time counts, which include the reports of campaigns stored before
counts were kept per period).

:func:`resolve` then says which of the window's periods are read: those of the
campaign's life up to now whose counts are still kept, with a note for each
part of the window that has no counts (expired, or from before the campaign
was counted per period).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

from aggregator.http.parameters import QueryParameter, invalid_parameter
from aggregator.storage import periods, retention
from aggregator.storage.periods import Window
from aggregator.storage.store import Campaign
from shared.schema import Number, String

PERIOD_PATTERN = r"\d{4}-(\d{2}-\d{2}|W\d{2})"
PERIOD_TEXT = (
    "an ISO date YYYY-MM-DD for a campaign counted by day (period day or once), an ISO week "
    "YYYY-Www for one counted by week"
)
# A trend covers at most this many periods (a year of days), and shows at most this many
# categories.
MAX_TREND_PERIODS = 366
DEFAULT_TREND_PERIODS = 30
MAX_TREND_TOP = 50
DEFAULT_TREND_TOP = 10


def _period_parameter(name: str, description: str) -> QueryParameter:
    return QueryParameter(
        name,
        String(pattern=PERIOD_PATTERN, pattern_text=PERIOD_TEXT),
        None,
        description=description,
    )


SINCE = _period_parameter(
    "since",
    "the window's first period, included (default: the campaign's first): an ISO date "
    "2026-12-01 for a campaign counted by day (period day or once), an ISO week 2026-W48 for "
    "one counted by week; a report is in the period the server received it in (UTC)",
)
UNTIL = _period_parameter(
    "until", "the window's last period, included (default: the current one); as since"
)
A_SINCE = _period_parameter("a_since", "window a's first period, as since")
A_UNTIL = _period_parameter("a_until", "window a's last period, as until")
B_SINCE = _period_parameter("b_since", "window b's first period, as since")
B_UNTIL = _period_parameter("b_until", "window b's last period, as until")
PERIODS = QueryParameter(
    "periods",
    Number(minimum=1, maximum=MAX_TREND_PERIODS, integer=True),
    DEFAULT_TREND_PERIODS,
    description="how many periods the trend covers, ending with until",
)
TOP = QueryParameter(
    "top",
    Number(minimum=1, maximum=MAX_TREND_TOP, integer=True),
    DEFAULT_TREND_TOP,
    description="how many categories (or cells) the trend follows: those with the largest "
    "estimated shares over its whole window",
)
WINDOW_PARAMETERS = (SINCE, UNTIL)


def parse_key(campaign: Campaign, raw: str | None, name: str) -> str | None:
    """A period key of the campaign's unit from a query string (None if absent), or a 422
    ``invalid_parameter`` naming the parameter and the format the campaign takes."""
    if raw is None:
        return None
    try:
        return periods.parse_key(campaign.unit, raw, name)
    except ValueError as exc:
        raise invalid_parameter(str(exc), field=name) from None


def parse_window(
    campaign: Campaign,
    args: Mapping[str, str | None],
    *,
    now: float,
    names: tuple[str, str] = ("since", "until"),
) -> Window | None:
    """The window named by ``args[names[0]]`` and ``args[names[1]]``; None (all time) if
    neither is given. A window that ends before it starts is refused, naming its end."""
    since_name, until_name = names
    since = parse_key(campaign, args.get(since_name), since_name)
    until = parse_key(campaign, args.get(until_name), until_name)
    if since is None and until is None:
        return None
    unit = campaign.unit

    def start(key: str) -> datetime.datetime:
        return periods.start_of(unit, key)

    if since is not None and until is not None and start(since) > start(until):
        raise invalid_parameter(
            f"{until_name} ({until}) is before {since_name} ({since}): a window runs from its "
            f"first period to its last",
            field=until_name,
        )
    # A default end never passes the given one: a window before the campaign's first period,
    # or after the current one, is empty, not wrong.
    if since is None:
        assert until is not None
        since = min(periods.key_at(unit, campaign.created_at), until, key=start)
    if until is None:
        until = max(periods.key_at(unit, now), since, key=start)
    return Window(unit, since, until)


def last_periods(campaign: Campaign, count: int, until: str | None, *, now: float) -> Window:
    """The ``count`` periods ending with ``until`` (default: the current period)."""
    unit = campaign.unit
    last = until or periods.key_at(unit, now)
    return Window(unit, periods.shifted(unit, last, -(count - 1)), last)


def previous(window: Window, name: str) -> Window:
    """The window of as many periods just before ``window``; a 422 naming ``name`` (the
    parameter that would have given it) if that starts before the years a window may name."""
    unit = window.unit
    earliest = datetime.datetime(periods.FIRST_YEAR, 1, 1, tzinfo=datetime.UTC).timestamp()
    if window.start_s - (window.end_s - window.start_s) < earliest:
        raise invalid_parameter(
            f"{name} is needed: by default window a is as many periods just before window b, "
            f"which would start before {periods.FIRST_YEAR}",
            field=name,
        )
    return Window(
        unit,
        periods.shifted(unit, window.since, -len(window)),
        periods.shifted(unit, window.since, -1),
    )


@dataclass(frozen=True)
class WindowRead:
    """A window as asked, the periods of it that are read (None: none), and notes on the
    periods it asked for that have no counts."""

    window: Window
    read: Window | None
    notes: tuple[str, ...] = ()

    @property
    def variant(self) -> str:
        """The window's part of a cache key: as asked, and where reading starts (which moves
        as periods expire)."""
        start = self.read.since if self.read is not None else "-"
        return f"{self.window.since}:{self.window.until}:{start}"

    def period_keys(self) -> list[str]:
        return [] if self.read is None else self.read.period_keys()

    def to_dict(self) -> dict[str, str]:
        return self.window.to_dict()


def _utc(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def resolve(
    campaign: Campaign, window: Window, *, now: float, retention_s: float | None
) -> WindowRead:
    """Which periods of ``window`` hold counts, and notes on those that cannot."""
    unit = campaign.unit
    first = periods.key_at(unit, campaign.created_at)
    kept = retention.first_kept(unit, retention_s, now)
    lower = first if kept is None else max(first, kept, key=lambda k: periods.start_of(unit, k))
    read = window.clipped(lower, periods.key_at(unit, now))
    notes = []
    if kept is not None and window.clipped(first, periods.shifted(unit, kept, -1)) is not None:
        days = retention_s / retention.DAY_S if retention_s else 0
        notes.append(
            f"counts per period are kept {days:g} days after their period "
            f"(LDP_PERIOD_RETENTION_DAYS): the periods of this window before {kept} have "
            "expired, and this window's figures leave their reports out"
        )
    began = campaign.periods_from
    start = max(window.start_s, campaign.created_at)
    if began is None:
        notes.append(
            "this campaign was stored by an earlier version and is not yet counted per "
            "period: this window's figures may leave out some of its reports"
        )
    elif began > campaign.created_at and start < began and read is not None:
        notes.append(
            f"this campaign is counted per period since {_utc(began)}, when it was moved "
            "from an earlier version: its reports received before then are in its all-time "
            "figures only, and this window's figures leave them out"
        )
    return WindowRead(window, read, tuple(notes))

"""What the dashboard pages show, shaped from the store and the estimate API's responses.

Nothing here computes an estimate of its own: the estimate shown is exactly
:func:`aggregator.http.estimates.estimate_response`, the body of the estimate API,
so a chart and the API can never disagree. For campaigns with a grid (planar
Laplace, the exponential mechanism on a grid, and k-RR, OLH or Hadamard response
over a region's cells: :func:`has_map`) the payload adds the heatmap layers on the
campaign's lat/lon grid: the share of noisy reports per cell (where each report is
a cell) and the reconstructed distribution, both from the estimate's body, so from
the same counts.
"""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime
from typing import Any

from aggregator.estimation import decision
from aggregator.estimation.advice import expected_error
from aggregator.http.windows import MAX_TREND_PERIODS
from aggregator.storage import periods
from aggregator.storage.periods import Window
from aggregator.storage.store import Campaign, CampaignStore
from shared.spec import (
    EXPONENTIAL_GRID,
    GEOMETRIC,
    HADAMARD_RESPONSE,
    OLH_NAME,
    PLANAR_LAPLACE,
)

MECHANISM_NAMES = {
    "rr": "Randomized response",
    "krr": "k-ary randomized response",
    PLANAR_LAPLACE: "Planar Laplace",
    GEOMETRIC: "Geometric (discrete Laplace)",
    EXPONENTIAL_GRID: "Exponential mechanism on a grid",
    HADAMARD_RESPONSE: "Hadamard response",
    OLH_NAME: "Optimized local hashing (OLH)",
}
# The method picker's names for the estimate API's methods, from the decision table. They only
# label the choices: what ran is told by the estimate itself (its ``estimator`` headline and
# ``method``).
METHOD_NAMES = {
    method: name[:1].upper() + name[1:] for method, name in decision.METHOD_NAMES.items()
}
# Shares closer to zero than this many percent are written as below it (share_text).
SMALLEST_SHOWN_PERCENT = 0.0001
# Methods computed in one step, without iterations.
CLOSED_FORM_METHODS = frozenset({decision.PROJECTION, decision.CLIP, decision.INVERSION})
# Beside the chart the interval method is cut to its first clause when longer than this; the
# whole sentence is then in the Details disclosure.
INTERVAL_SUMMARY_CHARS = 100
# Fields of the estimate body that are not the estimator's details. A body cached before the
# details had a key of their own spread them among these.
_BODY_FIELDS = frozenset(
    {
        "campaign",
        "spec_hash",
        "method",
        "n",
        "confidence",
        "estimates",
        "n_iter",
        "converged",
        "log_likelihood",
        "interval_method",
        "estimator",
        "warnings",
        "seconds",
        "poisoning",
        "range",
        "grid",
        "domain_size",
        "rows",
        "details",
    }
)


def iso_utc(timestamp: float | None) -> str | None:
    """Unix seconds as ISO 8601 in UTC (``2024-05-01T12:00:00Z``), None stays None."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def epsilon_text(campaign: Campaign) -> str:
    """Epsilon as an analyst reads it: per metre for locations, with the level/radius form, and
    per unit for an integer range."""
    spec = campaign.spec
    if spec.mechanism == GEOMETRIC:
        return f"{spec.epsilon:g} per unit"
    if spec.mechanism == EXPONENTIAL_GRID:
        return f"{spec.epsilon:g} per m of {spec.metric} distance"
    if spec.mechanism != PLANAR_LAPLACE:
        return f"{spec.epsilon:g}"
    text = f"{spec.epsilon:g} per m"
    if spec.privacy_level is not None:
        text += f" (level {spec.privacy_level:g} within {spec.privacy_radius_m:g} m)"
    return text


def campaign_row(campaign: Campaign, last_report: float | None) -> dict[str, Any]:
    """One line of the campaign list."""
    spec = campaign.spec
    return {
        "id": spec.id,
        "title": spec.title,
        "mechanism": spec.mechanism,
        "mechanism_name": MECHANISM_NAMES[spec.mechanism],
        "epsilon": spec.epsilon,
        "epsilon_text": epsilon_text(campaign),
        "status": campaign.status,
        "n_reports": campaign.n_reports,
        "last_report_at": iso_utc(last_report),
        "created_at": iso_utc(campaign.created_at),
    }


def report_series(store: CampaignStore, campaign_id: str) -> dict[str, Any]:
    """Accepted reports per bucket (the store keeps hours) and their running total.

    ``bucket_s`` is the bucket's length in seconds and ``bucket_name`` its name,
    so that the page draws finer buckets unchanged if the store keeps them.
    """
    points, total = [], 0
    for start, count in store.hourly_counts(campaign_id):
        total += count
        points.append({"start": iso_utc(start), "count": count, "total": total})
    return {"bucket_s": 3600, "bucket_name": "hour", "points": points}


def share_text(share: float | None, *, trim: bool = False) -> str:
    """A share as the dashboards write it, everywhere: a percent with three significant
    digits (``55.0%``, ``1.50%``, ``0.0700%``), whole percents from 100% up (``275%``),
    ``0%`` for zero and ``<0.0001%`` (``>-0.0001%``) for a share closer to zero than that.
    Never exponent notation, never ``0.00%`` for a share that is not zero. ``trim`` drops
    trailing zeros (axis ticks). ``static/campaign.js``'s ``formatShare`` is the same rule.
    """
    if share is None or not math.isfinite(share):
        return "–"
    if share == 0:
        return "0%"
    value = abs(100 * share)
    if value < SMALLEST_SHOWN_PERCENT:
        return ("<" if share > 0 else ">-") + f"{SMALLEST_SHOWN_PERCENT:f}".rstrip("0") + "%"
    if value >= 100:
        digits = f"{round(value)}"
    else:
        digits = f"{value:#.3g}".rstrip(".")
        if trim and "." in digits:
            digits = digits.rstrip("0").rstrip(".")
    return ("-" if share < 0 else "") + digits + "%"


def decimal_text(value: float) -> str:
    """A positive number with three significant digits in decimal notation, never exponent
    notation (``0.00000936``, ``0.025``, ``12.3``): the squared errors the page gives."""
    if not (math.isfinite(value) and value > 0):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(value)))
    return f"{value:.{decimals}f}"


# The advisor's expected error at n = 1, per spec: the squared error scales as 1 / n.
_error_at_one_report = functools.lru_cache(maxsize=256)(functools.partial(expected_error, n=1))


def expected_error_at(campaign: Campaign) -> dict[str, Any]:
    """The advisor's expected error of the estimate at the campaign's current number of reports.

    ``text`` says it for the page: the expected squared error of the frequency
    estimate summed over the domain (the advisor's closed form, cached per spec
    and divided by n), with its square root per value. A map (planar Laplace, the
    exponential mechanism on a grid) has no closed form for its estimate's error: the
    text gives the two parts that have one, the blur (the mean distance a report is
    moved, the advisor's proxy, whatever n) and the report noise, whose squared error
    summed over the cells of the report map is at most 1 / n.
    """
    n = campaign.n_reports
    unit = _error_at_one_report(campaign.spec)
    if unit is None:
        return {"text": "–", "expected_mse": None, "basis": None}
    if "mean_displacement_m" in unit:
        metres = unit["mean_displacement_m"]
        blur = f"each report moved {metres:,.0f} m on average (proxy, whatever n)"
        body: dict[str, Any] = {
            "expected_mse": None,
            "mean_displacement_m": metres,
            "basis": f"{unit['basis']}; the report map's sampling error: at most 1 / n",
        }
        if n < 1:
            return {**body, "text": f"{blur} (no reports yet)", "report_noise_mse": None}
        cells = campaign.spec.grid.n_cells
        bound = 1.0 / n
        return {
            **body,
            "text": f"{blur}; at {n:,} reports the report map's sampling error is at most "
            f"{decimal_text(bound)} squared, summed over the {cells:,} cells (about "
            f"±{share_text(math.sqrt(bound / cells))} per cell); ldp-simulate advise --region "
            "simulates the estimate's error",
            "report_noise_mse": bound,
        }
    if n < 1:
        return {"text": "– (no reports yet)", "expected_mse": None, "basis": unit["basis"]}
    mse = unit["expected_mse"] / n
    size = campaign.mechanism.n_inputs
    return {
        "text": f"squared error {decimal_text(mse)} summed over the {size:,} values (about "
        f"±{share_text(math.sqrt(mse / size))} on each value's share) at {n:,} reports",
        "expected_mse": mse,
        "basis": unit["basis"],
    }


def summary(store: CampaignStore, campaign: Campaign) -> dict[str, Any]:
    """What the campaign page polls: count, status, last report, the time series and the
    expected error at the current count."""
    campaign_id = campaign.spec.id
    last = store.last_report_times([campaign_id])[campaign_id]
    return {
        **campaign_row(campaign, last),
        "series": report_series(store, campaign_id),
        "expected_error": expected_error_at(campaign),
    }


def has_map(campaign: Campaign) -> bool:
    """Whether the campaign's values are the cells of a grid, so its page draws maps: planar
    Laplace, the exponential mechanism on a grid, and k-RR, OLH or Hadamard response over a
    region's cells."""
    return campaign.mechanism.grid is not None


def has_raw_map(campaign: Campaign) -> bool:
    """Whether each report is a cell, so the share of the reports per cell is a map (the
    estimate API's ``raw_cells``); an OLH or Hadamard response report is a hash or a code."""
    grid = campaign.mechanism.grid
    return grid is not None and campaign.mechanism.n_outputs == grid.n_cells


def heatmap_layers(campaign: Campaign, estimate: dict) -> dict[str, Any]:
    """The report shares and the reconstruction as rows x cols arrays (row 0 is the south),
    both from the estimate's ``grid``.

    ``lat`` gives each row's centre latitude and ``lon`` each column's centre
    longitude, so the layers can be drawn on the campaign's lat/lon grid;
    ``region`` is the grid's bounds. ``raw`` is None where the reports are not
    cells (:func:`has_raw_map`). ``zmax`` is the largest share of the layers: the
    shared colour scale.
    """
    grid = campaign.mechanism.grid
    assert grid is not None
    rows, cols = grid.rows, grid.cols
    empty = [[0.0] * cols for _ in range(rows)]
    layers = estimate.get("grid")  # absent with no reports yet
    raw: list[list[float]] | None = None
    if has_raw_map(campaign):
        raw = empty if layers is None else layers.get("raw_cells", empty)
    reconstructed = empty if layers is None else layers["cells"]
    peak = max((max(line) for line in (raw or []) + reconstructed), default=0.0)
    return {
        "rows": rows,
        "cols": cols,
        "cell_size_m": grid.cell_size_m,
        "region": grid.region.to_dict(),
        "lat": [grid.centre(row * cols)[0] for row in range(rows)],
        "lon": [grid.centre(col)[1] for col in range(cols)],
        "raw": raw,
        "estimate": reconstructed,
        "zmax": peak,
    }


def estimate_details(body: dict) -> dict[str, Any]:
    """The estimator's structured details (folds, iterations chosen, ...; may be empty): the
    body's ``details``, or for a body from before they had a key of their own, the fields
    beside the known ones."""
    details = body.get("details")
    if isinstance(details, dict):
        return details
    return {key: value for key, value in body.items() if key not in _BODY_FIELDS}


def interval_summary(interval_method: str) -> str:
    """How the intervals were made in a few words: the sentence up to its first ``;``, and if
    that is still long, up to its first parenthesis or the last word that fits."""
    text = interval_method.split(";", 1)[0].strip()
    if len(text) > INTERVAL_SUMMARY_CHARS and " (" in text:
        text = text.split(" (", 1)[0]
    if len(text) > INTERVAL_SUMMARY_CHARS:
        text = text[:INTERVAL_SUMMARY_CHARS].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    return text


def detail_text(value: Any) -> str:
    """A detail's value as the page shows it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def estimate_display(body: dict) -> dict[str, Any]:
    """What the page shows about an estimate beside its chart, and behind its Details.

    ``intervals`` is the confidence level and the interval method in a few words;
    ``details`` the ``[name, text]`` pairs of the Details disclosure: the method the
    numbers are from, the estimator's details, and the interval method's whole
    sentence when ``intervals`` shortened it.
    """
    sentence = body.get("interval_method") or ""
    summary = interval_summary(sentence)
    rows = [["method", str(body.get("method", ""))]]
    rows += [
        [key.replace("_", " "), detail_text(value)] for key, value in estimate_details(body).items()
    ]
    if summary != sentence:
        rows.append(["interval method", sentence])
    method = body.get("method")
    if body.get("n_iter") is not None:
        iterations = f"{body['n_iter']:,}" + (
            " (not converged)" if body.get("converged") is False else ""
        )
    else:
        iterations = "closed form" if method in CLOSED_FORM_METHODS else "–"
    return {
        "intervals": f"{body['confidence']:.0%}, {summary}" if summary else "–",
        "iterations": iterations,
        "details": rows,
    }


def estimate_payload(campaign: Campaign, body: dict) -> dict[str, Any]:
    """The estimate API's ``body``, plus what the page shows about it (``display``) and the
    heatmap layers for campaigns with a grid (:func:`has_map`)."""
    payload = dict(body)
    payload["display"] = estimate_display(body)
    if has_map(campaign):
        payload["heatmap"] = heatmap_layers(campaign, payload)
    return payload


# -- time: the window picker and the trend's window -----------------------------------------

# The trend chart covers at least this many periods (so that the latest period alone is
# seen against the ones before it), and follows this many categories (or cells) by default.
MIN_TREND_PERIODS = 7
TREND_TOP = 5
# The periods of the picker's "latest few" choice.
RECENT_PERIODS = 7
_PERIOD_NOUNS = {periods.DAY: "day", periods.WEEK: "week"}
# The browser's input for a period key of each unit (both give the key's own format).
_PERIOD_INPUTS = {periods.DAY: "date", periods.WEEK: "week"}


def window_choices(campaign: Campaign, now: float) -> dict[str, Any]:
    """The window picker's choices at ``now``: the latest period, the latest few, all time,
    and custom ends (``input``: the browser's input type for a period of the campaign's unit).
    Each choice's ``since`` and ``until`` are the query the data endpoints take."""
    unit = campaign.unit
    noun = _PERIOD_NOUNS[unit]
    current = periods.key_at(unit, now)
    recent = periods.shifted(unit, current, -(RECENT_PERIODS - 1))
    return {
        "unit": noun,
        "input": _PERIOD_INPUTS[unit],
        "current": current,
        "first": periods.key_at(unit, campaign.created_at),
        "choices": [
            {
                "value": "latest",
                "label": f"Latest {noun} ({current})",
                "since": current,
                "until": current,
            },
            {
                "value": "recent",
                "label": f"Latest {RECENT_PERIODS} {noun}s (from {recent})",
                "since": recent,
                "until": current,
            },
            {"value": "all", "label": "All time", "since": "", "until": ""},
            {"value": "custom", "label": "Custom…", "since": "", "until": ""},
        ],
    }


def trend_window(campaign: Campaign, asked: Window | None, now: float) -> Window:
    """The periods the trend chart shows for the picked window ``asked`` (None: all time,
    from the campaign's first period to the current one): those of the window, lengthened
    back to MIN_TREND_PERIODS and cut to the trend API's most (the latest ones)."""
    unit = campaign.unit
    if asked is None:
        asked = Window(unit, periods.key_at(unit, campaign.created_at), periods.key_at(unit, now))
    count = min(max(len(asked), MIN_TREND_PERIODS), MAX_TREND_PERIODS)
    return Window(unit, periods.shifted(unit, asked.until, -(count - 1)), asked.until)

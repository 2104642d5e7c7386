"""Counts, estimates and reports as files: the JSON the API serves, or CSV for spreadsheets.

The HTTP endpoints (``?format=csv``) and ``ldp-aggregator export`` share
these functions, so a file is the same whichever way it was fetched. CSV
rows follow the output order; planar campaigns add each cell's row, column
and centre, so a file can be mapped without the spec at hand.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from typing import Any

from aggregator.estimates import output_labels
from aggregator.store import Campaign
from shared.errors import ValidationError
from shared.mechanisms import PlanarLaplace

FORMATS = ("json", "csv")
CSV_MEDIA_TYPE = "text/csv; charset=utf-8"


def parse_format(raw: str | None) -> str:
    """``json`` (default) or ``csv``; anything else is a :class:`ValidationError`."""
    if raw is None:
        return "json"
    if raw not in FORMATS:
        raise ValidationError(
            f"format must be one of {', '.join(FORMATS)}, got {raw!r}",
            field="format",
            code="invalid_parameter",
        )
    return raw


def counts_body(
    campaign: Campaign, counts: dict[int, int], hourly: Iterable[tuple[int, int]]
) -> dict[str, Any]:
    """The counts API's JSON body: reports per output symbol and per hour."""
    labels = output_labels(campaign.mechanism)
    return {
        "campaign": campaign.spec.id,
        "n": sum(counts.values()),
        "counts": [{"label": labels[y], "count": counts.get(y, 0)} for y in range(len(labels))],
        "hourly": [{"hour": hour, "count": count} for hour, count in hourly],
    }


def _cell_columns(campaign: Campaign) -> tuple[list[str], list[list[Any]]]:
    """Extra columns locating each output: none for categories; row, col, centre for cells."""
    mechanism = campaign.mechanism
    if not isinstance(mechanism, PlanarLaplace):
        return [], [[] for _ in range(mechanism.n_outputs)]
    cols = mechanism.grid.cols
    extra = []
    for y in range(mechanism.n_outputs):
        centre = mechanism.report_value(y)
        extra.append([*divmod(y, cols), centre["lat"], centre["lon"]])
    return ["row", "col", "lat", "lon"], extra


def _csv(header: list[str], rows: Iterable[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def counts_csv(campaign: Campaign, counts: dict[int, int]) -> str:
    """``label,count`` per output symbol (planar: ``label,row,col,lat,lon,count``)."""
    extra_header, extra = _cell_columns(campaign)
    labels = output_labels(campaign.mechanism)
    return _csv(
        ["label", *extra_header, "count"],
        ([labels[y], *extra[y], counts.get(y, 0)] for y in range(len(labels))),
    )


def estimate_csv(campaign: Campaign, body: dict[str, Any]) -> str:
    """``label,frequency,ci_low,ci_high`` per output symbol (planar adds the cell columns).

    With no reports yet (``n`` = 0) the file has its header only.
    """
    extra_header, extra = _cell_columns(campaign)
    return _csv(
        ["label", *extra_header, "frequency", "ci_low", "ci_high"],
        (
            [
                row["label"],
                *extra[y],
                repr(row["frequency"]),
                repr(row["ci_low"]),
                repr(row["ci_high"]),
            ]
            for y, row in enumerate(body["estimates"])
        ),
    )


def reports_csv_header(campaign: Campaign) -> list[str]:
    if isinstance(campaign.mechanism, PlanarLaplace):
        return ["report_id", "lat", "lon", "received_at"]
    return ["report_id", "value", "received_at"]


def reports_csv_row(report: dict[str, Any]) -> list[Any]:
    value = report["value"]
    values = [value["lat"], value["lon"]] if isinstance(value, dict) else [value]
    return [report["report_id"], *values, report["received_at"]]


def reports_json_line(report: dict[str, Any]) -> str:
    return json.dumps(report, separators=(",", ":"), ensure_ascii=False) + "\n"

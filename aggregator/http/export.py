"""Counts, estimates and reports as files: the JSON the API serves, or CSV for spreadsheets.

The HTTP endpoints (``?format=csv``) and ``ldp-aggregator export`` share
these functions, so a file is the same whichever way it was fetched. CSV
rows follow the output order (an oracle's estimate: the order of its rows);
a row that is a cell of a campaign's grid (planar Laplace, the exponential
mechanism on a grid, k-RR, OLH and Hadamard response over a region) has the
cell's row, column and centre, in the JSON counts too, so a file can be mapped
without the spec at hand.

Every CSV file, here, in ``ldp-aggregator export`` and on the dashboard, is
written by :class:`CSVWriter`: a text cell (a label, a value) that a
spreadsheet would run as a formula gets a leading apostrophe, while numbers
are written as numbers, so a negative estimate stays a negative number.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from aggregator.http.estimates import output_labels
from aggregator.http.parameters import QueryParameter
from aggregator.storage.store import Campaign
from shared.mechanisms import GridMechanism
from shared.schema import String
from shared.terminal import json_text

if TYPE_CHECKING:
    from aggregator.http.windows import WindowRead

FORMATS = ("json", "csv")
CSV_MEDIA_TYPE = "text/csv; charset=utf-8"
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


FORMAT = QueryParameter(
    "format", String(enum=FORMATS), "json", description="csv: a CSV attachment instead of JSON"
)


def parse_format(raw: str | None) -> str:
    """``json`` (default) or ``csv``; anything else is a :class:`ValidationError`."""
    return FORMAT.parse(raw)


CELL_COLUMNS = ("row", "col", "lat", "lon")


class CellLocator:
    """Each labelled row's cell in a campaign's grid: its row, column and centre (lat, lon).

    A grid's centres have one latitude per row and one longitude per column (the
    projection is equirectangular), computed once, as :meth:`shared.geo.Grid.centre`
    gives them.
    """

    def __init__(self, campaign: Campaign) -> None:
        grid = campaign.mechanism.grid
        self.grid = grid
        if grid is not None:
            self.lat = [grid.centre(row * grid.cols)[0] for row in range(grid.rows)]
            self.lon = [grid.centre(col)[1] for col in range(grid.cols)]

    def outputs_are_cells(self, mechanism: Any) -> bool:
        """Whether each report names a cell (planar, exponential_grid, k-RR over a region;
        not an oracle's hashed or coded report)."""
        return self.grid is not None and mechanism.n_outputs == self.grid.n_cells

    def columns(self, label: str) -> list[Any]:
        """Row, column, lat and lon of the cell ``label`` names; empty for any other label."""
        index = None if self.grid is None else self.grid.label_index(label)
        if self.grid is None or index is None:
            return []
        row, col = divmod(index, self.grid.cols)
        return [row, col, self.lat[row], self.lon[col]]


def counts_body(
    campaign: Campaign, counts: dict[int, int], hourly: Iterable[tuple[int, int]]
) -> dict[str, Any]:
    """The counts API's JSON body: reports per output symbol (with the cell's row, column and
    centre where the symbol is a cell) and per hour."""
    labels = output_labels(campaign.mechanism)
    rows: list[dict[str, Any]] = [
        {"label": labels[y], "count": counts.get(y, 0)} for y in range(len(labels))
    ]
    cells = CellLocator(campaign)
    if cells.outputs_are_cells(campaign.mechanism):
        for row in rows:
            row.update(zip(CELL_COLUMNS, cells.columns(row["label"]), strict=True))
    return {
        "campaign": campaign.spec.id,
        "n": sum(counts.values()),
        "counts": rows,
        "hourly": [{"hour": hour, "count": count} for hour, count in hourly],
    }


def _cell_columns(campaign: Campaign, labels: list[str]) -> tuple[list[str], list[list[Any]]]:
    """Extra columns locating each row by its label: row, col and centre where the rows are a
    grid's cells, none otherwise."""
    cells = CellLocator(campaign)
    if cells.grid is None:
        return [], [[] for _ in labels]
    extra = [cells.columns(label) for label in labels]
    if not all(extra):  # an oracle's counts: seeds and buckets, not cells
        return [], [[] for _ in labels]
    return list(CELL_COLUMNS), extra


def text_cell(text: str) -> str:
    """``text`` as a spreadsheet should show it: a leading formula character gets an apostrophe.

    This is OWASP's advice against CSV injection; the apostrophe is what a
    spreadsheet itself puts before text that it must not evaluate.
    """
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


class CSVWriter:
    """A ``csv.writer`` whose text cannot start a formula: the one CSV writer of the aggregator.

    A ``str`` cell is text from the outside world (a label, a reported value) and is
    passed through :func:`text_cell`; numbers (``int``, ``float``) are written as
    numbers (``float`` by ``repr``, so the file holds the JSON's values exactly), and
    a negative one stays negative. Numbers must therefore be passed as numbers, never
    preformatted as strings.
    """

    def __init__(self, output: TextIO) -> None:
        self._writer = csv.writer(output, lineterminator="\n")
        # csv quotes a cell holding the line terminator ("\n") but not a bare "\r", which
        # readers then take for a line break: a row with one is written fully quoted.
        self._quoting_writer = csv.writer(output, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def writerow(self, row: Iterable[Any]) -> None:
        cells = [text_cell(cell) if isinstance(cell, str) else cell for cell in row]
        carriage_return = any(isinstance(cell, str) and "\r" in cell for cell in cells)
        (self._quoting_writer if carriage_return else self._writer).writerow(cells)

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def _csv(header: list[str], rows: Iterable[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = CSVWriter(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def counts_csv(campaign: Campaign, counts: dict[int, int]) -> str:
    """``label,count`` per output symbol (cells: ``label,row,col,lat,lon,count``)."""
    labels = output_labels(campaign.mechanism)
    extra_header, extra = _cell_columns(campaign, labels)
    return _csv(
        ["label", *extra_header, "count"],
        ([labels[y], *extra[y], counts.get(y, 0)] for y in range(len(labels))),
    )


def estimate_csv(campaign: Campaign, body: dict[str, Any]) -> str:
    """``label,frequency,ci_low,ci_high`` per row of the estimate (cells add the cell columns).

    With no reports yet (``n`` = 0) the file has its header only.
    """
    extra_header, extra = _cell_columns(campaign, [row["label"] for row in body["estimates"]])
    return _csv(
        ["label", *extra_header, "frequency", "ci_low", "ci_high"],
        (
            [
                row["label"],
                *extra[y],
                float(row["frequency"]),
                float(row["ci_low"]),
                float(row["ci_high"]),
            ]
            for y, row in enumerate(body["estimates"])
        ),
    )


def reports_csv_header(campaign: Campaign) -> list[str]:
    if isinstance(campaign.mechanism, GridMechanism):
        return ["report_id", "lat", "lon", "received_at"]
    return ["report_id", "value", "received_at"]


def reports_csv_row(report: dict[str, Any]) -> list[Any]:
    value = report["value"]
    values = [value["lat"], value["lon"]] if isinstance(value, dict) else [value]
    return [report["report_id"], *values, report["received_at"]]


def reports_json_line(report: dict[str, Any]) -> str:
    return json_text(report, separators=(",", ":")) + "\n"


def window_counts_body(
    campaign: Campaign,
    counts: dict[int, int],
    hourly: Iterable[tuple[int, int]],
    window: WindowRead | None,
) -> dict[str, Any]:
    """:func:`counts_body` over ``window`` (None: all time): ``hourly`` cut to the window's
    hours, the window named, and its notes (periods without counts) as ``warnings``."""
    if window is None:
        return counts_body(campaign, counts, hourly)
    start, end = window.window.start_s, window.window.end_s
    body = counts_body(campaign, counts, [(h, c) for h, c in hourly if start <= h < end])
    return {
        "campaign": body.pop("campaign"),
        "window": window.to_dict(),
        **body,
        "warnings": list(window.notes),
    }

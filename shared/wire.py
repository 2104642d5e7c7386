"""Report submissions on the wire: one report, or a batch of them.

A report is ``{"report_id", "value", "spec_hash"?, "enrollment_token"?}``; a
batch is ``{"reports": [...], "spec_hash"?}``. The descriptors here are what
the aggregator checks a submission with and what its OpenAPI document shows;
the value itself is checked against the campaign (a label of its domain, an
integer of its range, or the centre of a cell of its grid) by the campaign's
mechanism.
"""

from __future__ import annotations

from dataclasses import replace

from shared.schema import Array, Number, Object, OneOf, String

REPORT_ID = String(
    format="uuid",
    description="chosen by the client, one per report; a retry reuses it and is not counted twice",
)
SPEC_HASH = String(
    min_length=0,
    description="the spec hash the report was made under; another one is refused (409)",
)
ENROLLMENT_TOKEN = String(
    pattern=r"[A-Za-z0-9_-]{16,128}",
    pattern_text="16 to 128 characters of A-Z a-z 0-9 _ -",
    description="required by, and only by, campaigns with enrollment_required",
)
# A report's value has one of these shapes; which values are valid is the campaign's to say
# (a label of its domain, an integer of its range, the centre of a cell of its grid), so no
# bound is written here.
LABEL_VALUE = String(min_length=0, description="a label of the campaign's domain (rr, krr)")
INTEGER_VALUE = Number(
    integer=True, description="an integer of the campaign's range [lo, hi] (geometric)"
)
LOCATION_VALUE = Object(
    {"lat": Number(), "lon": Number()},
    required=("lat", "lon"),
    description="the centre of a cell of the campaign's report grid (planar_laplace, "
    "exponential_grid)",
)
REPORT = Object(
    {
        "report_id": REPORT_ID,
        "value": OneOf(
            (LABEL_VALUE, INTEGER_VALUE, LOCATION_VALUE),
            description="checked against the campaign by its mechanism",
        ),
        "spec_hash": SPEC_HASH,
        "enrollment_token": ENROLLMENT_TOKEN,
    },
    required=("report_id", "value"),
    noun="a report object",
)
# The server's largest batch by default (LDP_MAX_BATCH sets it).
DEFAULT_MAX_BATCH = 1000
_REPORTS = Array(REPORT, min_items=1, max_items=DEFAULT_MAX_BATCH, noun="reports")


def report_list(max_reports: int = DEFAULT_MAX_BATCH) -> Array:
    """The list of 1 to ``max_reports`` reports of a batch (the server's setting)."""
    return replace(_REPORTS, max_items=max_reports)


def report_batch(max_reports: int = DEFAULT_MAX_BATCH) -> Object:
    """A batch: its reports and, optionally, the spec hash they were all made under."""
    return Object(
        {"reports": report_list(max_reports), "spec_hash": SPEC_HASH},
        required=("reports",),
        noun='a report object or {"reports": [...]}',
    )

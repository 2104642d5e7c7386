"""Parsing report submissions at the HTTP edge.

A submission is one report ``{"report_id", "value", "spec_hash"?}`` or a batch
``{"reports": [...], "spec_hash"?}``. Each report is checked against its
campaign's mechanism (``Mechanism.parse_report_value``) and its id must be a
UUID, kept in canonical lower-case form so that retries match. The whole
submission is refused if any report is invalid, naming the report's field.
"""

from __future__ import annotations

import uuid
from typing import Any

from aggregator.store import StoredReport
from shared.errors import ReportError
from shared.mechanisms import Mechanism

DEFAULT_MAX_BATCH = 1000
_REPORT_FIELDS = frozenset({"report_id", "value", "spec_hash"})
_BATCH_FIELDS = frozenset({"reports", "spec_hash"})


def _check_keys(obj: dict, allowed: frozenset[str], prefix: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ReportError(f"unknown field {unknown[0]!r}", field=f"{prefix}{unknown[0]}")


def _check_spec_hash(obj: dict, expected: str, field: str) -> None:
    if "spec_hash" not in obj:
        return
    given = obj["spec_hash"]
    if not isinstance(given, str):
        raise ReportError(f"{field} must be a string", field=field)
    if given != expected:
        raise ReportError(
            "the report was made under another version of the campaign spec",
            field=field,
            code="spec_mismatch",
        )


def _report_id(raw: Any, field: str) -> str:
    if not isinstance(raw, str):
        raise ReportError(f"{field} must be a UUID string", field=field)
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise ReportError(f"{field} must be a UUID", field=field) from None


def parse_submission(
    body: Any, mechanism: Mechanism, spec_hash: str, *, max_batch: int = DEFAULT_MAX_BATCH
) -> list[StoredReport]:
    """Validate a submission against its campaign; raise :class:`ReportError` naming the field."""
    if not isinstance(body, dict):
        raise ReportError('the body must be a report object or {"reports": [...]}', field=None)
    if "reports" not in body:
        raw_reports, prefix = [body], ""
    else:
        _check_keys(body, _BATCH_FIELDS, "")
        _check_spec_hash(body, spec_hash, "spec_hash")
        raw_reports = body["reports"]
        if not isinstance(raw_reports, list):
            raise ReportError("reports must be a list", field="reports")
        if not 1 <= len(raw_reports) <= max_batch:
            raise ReportError(
                f"a batch holds 1 to {max_batch} reports, got {len(raw_reports)}", field="reports"
            )
        prefix = "reports[{}]."
    parsed = []
    for i, raw in enumerate(raw_reports):
        where = prefix.format(i)
        if not isinstance(raw, dict):
            raise ReportError("a report must be an object", field=where.rstrip(".") or None)
        _check_keys(raw, _REPORT_FIELDS, where)
        _check_spec_hash(raw, spec_hash, f"{where}spec_hash")
        for required in ("report_id", "value"):
            if required not in raw:
                raise ReportError(f"{where}{required} is required", field=f"{where}{required}")
        report_id = _report_id(raw["report_id"], f"{where}report_id")
        output = mechanism.parse_report_value(raw["value"], field=f"{where}value")
        parsed.append(StoredReport(report_id, output, mechanism.report_value(output)))
    return parsed

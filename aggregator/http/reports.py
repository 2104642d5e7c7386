"""Parsing report submissions at the HTTP edge.

A submission is one report ``{"report_id", "value", "spec_hash"?, "enrollment_token"?}``
(the token only, and always, for campaigns with ``enrollment_required``) or a batch
``{"reports": [...], "spec_hash"?}``. Each report is checked against its
campaign's mechanism (``Mechanism.parse_report_value``) and its id must be a
UUID, kept in canonical lower-case form so that retries match; the shapes and
bounds are those of :mod:`shared.wire`, which the OpenAPI document shows. The whole
submission is refused if any report is invalid, naming the report's field.
"""

from __future__ import annotations

import re
from typing import Any

from aggregator.storage.ingest import StoredReport
from shared.errors import ReportError
from shared.mechanisms import Mechanism
from shared.wire import (
    DEFAULT_MAX_BATCH,
    ENROLLMENT_TOKEN,
    REPORT,
    REPORT_ID,
    SPEC_HASH,
    report_batch,
    report_list,
)

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_REPORT_BUDGET", "parse_submission"]
# New reports one address may store in one campaign per window (REPORT_BUDGET): at about
# 200 bytes of Redis memory a report, 2 MB an hour per address and campaign.
DEFAULT_REPORT_BUDGET = "10000 per hour"
_PLAIN_FIELDS = frozenset({"report_id", "value"})
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _check_spec_hash(obj: dict, expected: str, field: str) -> None:
    if "spec_hash" not in obj:
        return
    if SPEC_HASH.check(obj["spec_hash"], field, ReportError) != expected:
        raise ReportError(
            "the report was made under another version of the campaign spec",
            field=field,
            code="spec_mismatch",
        )


def _report_id(raw: Any, field: str) -> str:
    if isinstance(raw, str) and _CANONICAL_UUID.fullmatch(raw):
        return raw  # already in the form uuid.UUID would give (the usual case, and fast)
    return REPORT_ID.check(raw, field, ReportError)


def _enrollment_token(raw: dict, required: bool, field: str) -> str | None:
    present = "enrollment_token" in raw
    if not present and not required:
        return None
    if not required:
        raise ReportError(
            "this campaign does not use enrollment tokens", field=field, code="unexpected_token"
        )
    if not present:
        raise ReportError(
            "this campaign requires an enrollment token with each report",
            field=field,
            code="enrollment_required",
        )
    return ENROLLMENT_TOKEN.check(raw["enrollment_token"], field, ReportError)


def _parse_report(
    raw: Any, where: str, mechanism: Mechanism, spec_hash: str, enrollment_required: bool
) -> StoredReport:
    """One report, every check in turn; errors name the field as ``{where}{field}``."""
    REPORT.check_keys(raw, where.rstrip(".") or None, ReportError)
    _check_spec_hash(raw, spec_hash, f"{where}spec_hash")
    report_id = _report_id(raw["report_id"], f"{where}report_id")
    output = mechanism.parse_report_value(raw["value"], field=f"{where}value")
    token = _enrollment_token(raw, enrollment_required, f"{where}enrollment_token")
    return StoredReport(report_id, output, mechanism.report_value(output), token)


def parse_submission(
    body: Any,
    mechanism: Mechanism,
    spec_hash: str,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    enrollment_required: bool = False,
) -> list[StoredReport]:
    """Validate a submission against its campaign; raise :class:`ReportError` naming the field."""
    if not isinstance(body, dict):
        raise ReportError('the body must be a report object or {"reports": [...]}', field=None)
    if "reports" not in body:
        raw_reports, prefix = [body], ""
    else:
        report_batch(max_batch).check_keys(body, None, ReportError)
        _check_spec_hash(body, spec_hash, "spec_hash")
        raw_reports = report_list(max_batch).check_length(body["reports"], "reports", ReportError)
        prefix = "reports[{}]."
    parsed = []
    parse_value, report_value = mechanism.parse_report_value, mechanism.report_value
    for i, raw in enumerate(raw_reports):
        # The usual report, {"report_id": <canonical UUID>, "value": ...}, without the
        # per-field bookkeeping; anything else, or any doubt, takes the checked path.
        if not enrollment_required and type(raw) is dict and raw.keys() == _PLAIN_FIELDS:
            report_id = raw["report_id"]
            if type(report_id) is str and _CANONICAL_UUID.fullmatch(report_id):
                try:
                    output = parse_value(raw["value"])
                except ReportError:
                    pass  # raised again below, naming the report's field
                else:
                    parsed.append(StoredReport(report_id, output, report_value(output)))
                    continue
        parsed.append(
            _parse_report(raw, prefix.format(i), mechanism, spec_hash, enrollment_required)
        )
    return parsed

"""The REST API under ``/api/v1``; ``docs/aggregator.md`` and the OpenAPI document describe it."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import flask
import redis

from aggregator.estimation.advised_spec import spec_and_advice
from aggregator.http import estimates, export, trends, windows
from aggregator.http.auth import ADMIN, ANALYST, METRICS, bearer_token, require, token_grants
from aggregator.http.errors import APIError
from aggregator.http.metrics import counted_submission, current_metrics
from aggregator.http.ratelimits import add_headers
from aggregator.http.reports import parse_submission
from aggregator.services import (
    current_settings,
    get_capacity,
    get_channels,
    get_replication,
    get_store,
)
from aggregator.storage.errors import CampaignFull, ReportBudgetExceeded, is_out_of_memory
from aggregator.storage.ingest import RateLimit, ReportBudget, StoredReport
from aggregator.storage.replication import ReplicationReading
from aggregator.storage.store import STATUSES, Campaign
from shared.errors import ValidationError
from shared.schema import Object, String
from shared.spec import ID_PATTERN, SERVER_FIELDS

bp = flask.Blueprint("api", __name__, url_prefix="/api/v1")
# The body of a campaign update: only the status can change, a spec never does.
STATUS_UPDATE = Object(
    {"status": String(enum=STATUSES)},
    required=("status",),
    noun='{"status": "open" | "closed"}; a spec cannot be changed',
)
_invalid_update = functools.partial(ValidationError, code="invalid_update")
# Whether an estimate was served from the cache (``hit``) or computed for this request.
ESTIMATE_CACHE_HEADER = "X-Estimate-Cache"
# The public campaign list gives a domain up to this many labels: a campaign of 100,000 labels
# would make every anonymous request to the list megabytes long. The campaign's own endpoint
# (``url`` in the list) serves its whole spec, which is what clients read.
LISTED_DOMAIN_LIMIT = 100


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all distinct: a repeated key has no one meaning."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice in one object")
            seen.add(key)
    return obj


def json_body() -> Any:
    """The request's JSON body: 415 unless it is JSON, 400 if it does not parse.

    Stricter than RFC 8259 allows a parser to be, so that no two parsers can
    read one body differently: NaN and Infinity, repeated keys and invalid
    UTF-8 are refused.
    """
    if not flask.request.is_json:
        raise APIError(415, "unsupported_media_type", "the body must be application/json")
    raw = flask.request.get_data(cache=False)
    try:
        return json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise APIError(400, "invalid_json", "the body is nested too deeply") from None
    except ValueError as exc:
        # int() names an interpreter setting here; the client needs only the limit.
        reason = "a number has too many digits" if "integer string" in str(exc) else exc
        raise APIError(400, "invalid_json", f"the body is not valid JSON: {reason}") from None


def load_campaign(campaign_id: str) -> Campaign:
    """The campaign named in the URL (404 for an unknown or malformed id)."""
    if not ID_PATTERN.fullmatch(campaign_id):
        raise APIError(404, "campaign_not_found", f"no campaign {campaign_id!r}")
    return get_store().get_campaign(campaign_id)


@bp.get("/health")
def health() -> flask.Response:
    """Liveness, whether reports are accepted and which masters lack replicas: reads only, so
    it answers at a full store. Each master's address and the reports acknowledged on fewer
    replicas only for a token of the metrics role (as ``/metrics``); a wrong token is 401."""
    get_store().ping()
    token = bearer_token()
    detailed = token is not None and token_grants(token, METRICS)
    capacity = get_capacity()
    reading = capacity.reading()
    return flask.jsonify(
        {
            "status": "ok",
            "storage": {
                "accepting_reports": not reading.full,
                "used_fraction": reading.used_fraction,
                "high_water": capacity.high_water if reading.limit_bytes else None,
                "refused": capacity.refusals(),
            },
            "replication": replication_body(get_replication().reading(), detailed=detailed),
        }
    )


def replication_body(reading: ReplicationReading, *, detailed: bool) -> dict[str, Any]:
    """``/health``'s ``replication``: the replicas writes wait for, the masters that answered,
    and those with fewer replicas (how many, their cluster slots and campaign shards; None
    where the campaigns could not be read). ``detailed`` adds each of those masters and the
    reports acknowledged by such masters since the store was created."""
    short = reading.under_replicated
    under: dict[str, Any] = {
        "masters": len(short),
        "slots": reading.under_replicated_slots,
        "shards": reading.under_replicated_shards,
    }
    body: dict[str, Any] = {
        "replicas_wanted": reading.wanted,
        "masters": len(reading.masters),
        "under_replicated": under,
    }
    if detailed:
        under["nodes"] = [dataclasses.asdict(master) for master in short]
        body["reports_under_replicated"] = reading.reports
    return body


def listed(campaign: Campaign) -> dict[str, Any]:
    """A campaign as the public list gives it: its spec, with a link to the spec's endpoint,
    and a domain of more than :data:`LISTED_DOMAIN_LIMIT` labels left out (its size instead)."""
    domain = campaign.spec.domain
    wire = campaign.to_wire()
    if domain is not None and len(domain) > LISTED_DOMAIN_LIMIT:
        del wire["domain"]
        wire["domain_labels"] = len(domain)
    wire["url"] = flask.url_for("api.get_campaign", campaign_id=campaign.spec.id)
    return wire


@bp.get("/campaigns")
def list_campaigns() -> flask.Response:
    return flask.jsonify({"campaigns": [listed(c) for c in get_store().list_campaigns()]})


@bp.post("/campaigns")
@require(ADMIN)
def create_campaign() -> tuple[flask.Response, int]:
    body = json_body()
    if isinstance(body, dict):
        server_fields = sorted(set(body) & SERVER_FIELDS)
        if server_fields:
            field = server_fields[0]
            raise ValidationError(f"{field} is set by the server", field=field, code="invalid_spec")
    # No mechanism: the server chooses one for the domain (aggregator.estimation.advice).
    spec, advice = spec_and_advice(body)
    campaign, created = get_store().create_campaign(spec)
    wire = campaign.to_wire()
    if advice is not None:
        wire["advice"] = advice
    response = flask.jsonify(wire)
    response.headers["Location"] = flask.url_for("api.get_campaign", campaign_id=spec.id)
    return response, 201 if created else 200


@bp.get("/campaigns/<campaign_id>")
def get_campaign(campaign_id: str) -> flask.Response:
    return flask.jsonify(load_campaign(campaign_id).to_wire())


@bp.patch("/campaigns/<campaign_id>")
@require(ADMIN)
def update_campaign(campaign_id: str) -> flask.Response:
    """Only the status can change; the spec is immutable."""
    load_campaign(campaign_id)
    body = json_body()
    status = STATUS_UPDATE.check(body, None, _invalid_update)["status"]
    return flask.jsonify(get_store().set_status(campaign_id, status).to_wire())


def _report_limits() -> tuple[RateLimit | None, ReportBudget | None]:
    """This client's submission limit and report budget (None when limits are off)."""
    settings = current_settings()
    submissions = settings.rate_limit("ratelimit_reports")
    budget = settings.rate_limit("report_budget")
    if submissions is None or budget is None:
        return None, None
    client = flask.request.remote_addr or "unknown"
    return RateLimit(*submissions, client), ReportBudget(*budget, client)


@bp.post("/campaigns/<campaign_id>/reports")
@counted_submission
def submit_reports(campaign_id: str) -> flask.Response:
    """Validate and store reports: one Redis call on the usual path.

    The campaign's spec comes from the process's copy and the ingestion script
    checks its hash, the campaign's status, the client's rate limit and report
    budget and the campaign's quota in the same call; a spec that changed under
    the copy is read again and the reports checked again, once. Above the
    store's high-water mark nothing is written (507 with ``Retry-After``).
    """
    if not ID_PATTERN.fullmatch(campaign_id):
        raise APIError(404, "campaign_not_found", f"no campaign {campaign_id!r}")
    store = get_store()
    # An unknown campaign is 404 whatever the body (no read once this process knows it).
    store.campaign_for_reports(campaign_id)
    body = json_body()
    rate_limit, report_budget = _report_limits()
    capacity = get_capacity()
    settings = current_settings()
    reports: list[StoredReport] = []

    def check(campaign: Campaign) -> list[StoredReport]:
        # Against the store's copy of the campaign; called once more if its spec changed.
        nonlocal reports
        reports = parse_submission(
            body,
            campaign.mechanism,
            campaign.spec_hash,
            max_batch=settings.max_batch,
            enrollment_required=campaign.spec.enrollment_required,
        )
        capacity.check_reports(campaign_id, len(reports))
        return reports

    try:
        result = store.ingest_checked(
            campaign_id, check, rate_limit=rate_limit, report_budget=report_budget
        )
    except (CampaignFull, ReportBudgetExceeded) as refusal:
        capacity.record_refusal(refusal.code, campaign_id, len(reports))
        raise
    except redis.ResponseError as exc:
        if not is_out_of_memory(exc):
            raise
        # Redis refused the script's first write (a flood overshot the high-water mark
        # between two readings): nothing was stored.
        raise capacity.storage_full(campaign_id, len(reports)) from exc
    current_metrics().record_ingest(campaign_id, result)
    response = flask.jsonify(
        {
            "campaign": campaign_id,
            "received": len(reports),
            "accepted": result.accepted,
            "duplicates": result.duplicates,
        }
    )
    if rate_limit is not None:
        add_headers(response, rate_limit.amount, result.window_remaining, result.window_ttl_s)
    return response


def _check_parameters(allowed: set[str]) -> None:
    unknown = sorted(set(flask.request.args) - allowed)
    if unknown:
        raise ValidationError(
            f"unknown parameter {unknown[0]!r}", field=unknown[0], code="invalid_parameter"
        )


def _csv_download(text: str, filename: str) -> flask.Response:
    response = flask.Response(text, mimetype=export.CSV_MEDIA_TYPE)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def request_window(campaign: Campaign) -> windows.WindowRead | None:
    """The window of ``since`` and ``until`` in the request, resolved (None: all time)."""
    store = get_store()
    now = store.clock()
    window = windows.parse_window(campaign, flask.request.args, now=now)
    if window is None:
        return None
    return windows.resolve(campaign, window, now=now, retention_s=store.period_retention_s)


def window_suffix(window: windows.WindowRead | None) -> str:
    """A download's file name part for a window: ``-2026-12-01-2026-12-07`` (all time: none)."""
    return "" if window is None else f"-{window.window.since}-{window.window.until}"


@bp.get("/campaigns/<campaign_id>/counts")
@require(ANALYST)
def get_counts(campaign_id: str) -> flask.Response:
    """Reports per output symbol and per hour (the raw material of the dashboards), over all
    time or a window."""
    _check_parameters({"format", "since", "until"})
    output = export.parse_format(flask.request.args.get("format"))
    campaign = load_campaign(campaign_id)
    window = request_window(campaign)
    store = get_store()
    counts = estimates.window_counts(store, campaign, window)
    if output == "csv":
        name = f"{campaign_id}-counts{window_suffix(window)}.csv"
        return _csv_download(export.counts_csv(campaign, counts), name)
    hourly = store.hourly_counts(campaign_id)
    return flask.jsonify(export.window_counts_body(campaign, counts, hourly, window))


def _estimate_sources() -> dict[str, Any]:
    """The app's channel operators, per-estimate limits and latency histogram, for the
    cached_estimate calls."""
    return {
        "channels": get_channels(),
        "limits": estimates.current_limits(),
        "observe": current_metrics().observe_estimate,
    }


def bounded_estimate(
    campaign: Campaign,
    method: str,
    confidence: float,
    window: windows.WindowRead | None = None,
) -> tuple[dict[str, Any], bool]:
    """The campaign's (cached) estimate over ``window`` (None: all time) within the app's
    limits, and whether it was cached."""
    return estimates.cached_estimate(
        get_store(), campaign, method, confidence, window=window, **_estimate_sources()
    )


@bp.get("/campaigns/<campaign_id>/estimate")
@require(ANALYST)
def get_estimate(campaign_id: str) -> flask.Response:
    """The estimate with intervals, over all time or a window; served from the cache while no
    new report has arrived."""
    _check_parameters({"method", "confidence", "format", "since", "until"})
    campaign = load_campaign(campaign_id)
    method = estimates.parse_method(flask.request.args.get("method"), campaign.mechanism)
    confidence = estimates.parse_confidence(flask.request.args.get("confidence"))
    output = export.parse_format(flask.request.args.get("format"))
    window = request_window(campaign)
    if output == "csv":
        body, cached = bounded_estimate(campaign, method, confidence, window)
        response = _csv_download(
            export.estimate_csv(campaign, body),
            f"{campaign_id}-estimate-{method}{window_suffix(window)}.csv",
        )
    else:
        # The cached text as it is: parsing and serialising a large grid's body again
        # would cost more than the rest of a cache hit.
        text, cached = estimates.cached_estimate_json(
            get_store(), campaign, method, confidence, window=window, **_estimate_sources()
        )
        response = flask.Response(text, mimetype="application/json")
    response.headers[ESTIMATE_CACHE_HEADER] = "hit" if cached else "miss"
    return response


@bp.get("/campaigns/<campaign_id>/trend")
@require(ANALYST)
def get_trend(campaign_id: str) -> flask.Response:
    """The estimate of each of the last ``periods`` periods (up to ``until``) for the ``top``
    categories of their whole window, with intervals."""
    _check_parameters({"method", "confidence", "periods", "top", "until"})
    campaign = load_campaign(campaign_id)
    args = flask.request.args
    method = estimates.parse_method(args.get("method"), campaign.mechanism)
    confidence = estimates.parse_confidence(args.get("confidence"))
    count = int(windows.PERIODS.parse(args.get("periods")))
    top = int(windows.TOP.parse(args.get("top")))
    until = windows.parse_key(campaign, args.get("until"), "until")
    store = get_store()
    now = store.clock()
    window = windows.last_periods(campaign, count, until, now=now)
    body = trends.trend_response(
        store, campaign, method, confidence, window, top, now=now, **_estimate_sources()
    )
    return flask.jsonify(body)


@bp.get("/campaigns/<campaign_id>/compare")
@require(ANALYST)
def get_comparison(campaign_id: str) -> flask.Response:
    """Each category's difference between the estimates of windows b and a, with intervals
    that hold both windows' noise; cached like an estimate. Window b is the current period
    by default, window a as many periods just before b."""
    names = ("a_since", "a_until", "b_since", "b_until")
    _check_parameters({"method", "confidence", *names})
    campaign = load_campaign(campaign_id)
    args = flask.request.args
    method = estimates.parse_method(args.get("method"), campaign.mechanism)
    confidence = estimates.parse_confidence(args.get("confidence"))
    store = get_store()
    now = store.clock()
    b = windows.parse_window(campaign, args, now=now, names=("b_since", "b_until"))
    b = b or windows.last_periods(campaign, 1, None, now=now)
    a = windows.parse_window(campaign, args, now=now, names=("a_since", "a_until"))
    a = a or windows.previous(b, "a_since")
    sides = [
        windows.resolve(campaign, window, now=now, retention_s=store.period_retention_s)
        for window in (a, b)
    ]
    text, cached = trends.comparison_json(
        store, campaign, method, confidence, (sides[0], sides[1]), **_estimate_sources()
    )
    response = flask.Response(text, mimetype="application/json")
    response.headers[ESTIMATE_CACHE_HEADER] = "hit" if cached else "miss"
    return response

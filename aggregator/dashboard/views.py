"""Dashboard routes under ``/dashboard``: pages, the JSON they poll, downloads, plotly.js.

Pages are rendered on the server; the campaign page's charts are drawn in the
browser by ``static/campaign.js`` from the JSON endpoints under ``data/``,
which take the session cookie (never the analyst token). Everything but the
sign-in page and the static files needs a session. No inline script: the
Content-Security-Policy allows scripts from this server only.
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import flask

from aggregator.dashboard import data, sessions
from aggregator.dashboard.sessions import data_login_required, page_login_required
from aggregator.estimation import decision
from aggregator.http import auth, estimates, export, trends, windows
from aggregator.http.errors import APIError
from aggregator.http.routes import (
    _estimate_sources,
    bounded_estimate,
    load_campaign,
    request_window,
    window_suffix,
)
from aggregator.services import current_settings, get_replication, get_store
from aggregator.storage.errors import CampaignNotFound
from aggregator.storage.store import Campaign
from shared.errors import ValidationError
from shared.spec import GEOMETRIC

# plotly's (and Leaflet's) styles are injected at run time, hence 'unsafe-inline' for styles
# only. A basemap's tile host is added to img-src when one is set (content_security_policy).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_CACHEABLE_ENDPOINTS = frozenset({"dashboard.static", "dashboard.plotly_js"})

bp = flask.Blueprint(
    "dashboard",
    __name__,
    url_prefix="/dashboard",
    template_folder="templates",
    static_folder="static",
)


@bp.record_once
def _configure(state: flask.blueprints.BlueprintSetupState) -> None:
    sessions.configure(state.app)


@bp.context_processor
def _template_helpers() -> dict[str, Any]:
    return {
        "csrf_token": sessions.csrf_token,
        "csrf_field": sessions.CSRF_FIELD,
        "signed_in": sessions.signed_in,
        "replication_notice": replication_notice,
    }


def replication_notice() -> dict[str, int | None] | None:
    """What an admin's pages say while a Redis master holding campaign shards has fewer
    replicas than writes wait for: those masters, their shards (None: not read) and the
    reports acknowledged by such masters since the store was created (None: not read).
    None when there is nothing to say, or to anyone but an admin."""
    if sessions.session_role() != auth.ADMIN:
        return None
    reading = get_replication().reading()
    holding = [master for master in reading.under_replicated if master.shards != 0]
    if not holding:
        return None
    return {
        "wanted": reading.wanted,
        "masters": len(holding),
        "shards": reading.under_replicated_shards,
        "reports": reading.reports,
    }


def tile_source(tiles_url: str) -> str:
    """The CSP source of a tile URL template: its scheme and host (with its port), ``{s}.``
    as ``*.`` (``https://{s}.tile.example/{z}/{x}/{y}.png`` gives ``https://*.tile.example``)."""
    parts = urlsplit(tiles_url)
    return f"{parts.scheme}://{parts.netloc.replace('{s}', '*')}"


def content_security_policy(tiles_url: str | None) -> str:
    """The dashboard's policy: this server only, and a basemap's tile host for images when the
    operator set one (``LDP_MAP_TILES_URL``)."""
    if tiles_url is None:
        return CONTENT_SECURITY_POLICY
    return CONTENT_SECURITY_POLICY.replace(
        "img-src 'self' data: blob:;", f"img-src 'self' data: blob: {tile_source(tiles_url)};"
    )


def basemap_config() -> dict[str, str] | None:
    """The basemap a campaign page's maps are drawn over (None: the operator set no tiles)."""
    settings = current_settings()
    if settings.map_tiles_url is None:
        return None
    return {"url": settings.map_tiles_url, "attribution": settings.map_tiles_attribution or ""}


@bp.after_request
def _headers(response: flask.Response) -> flask.Response:
    policy = content_security_policy(current_settings().map_tiles_url)
    response.headers["Content-Security-Policy"] = policy
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    if flask.request.endpoint not in _CACHEABLE_ENDPOINTS:
        response.headers["Cache-Control"] = "no-store"
    return response


# -- sign-in -------------------------------------------------------------------------------


def _login_page(error: str | None, status: int, next_url: str | None) -> tuple[str, int]:
    signed_out = flask.request.args.get("signed_out") == "1" and error is None
    page = flask.render_template(
        "dashboard/login.html", error=error, next_url=next_url, signed_out=signed_out
    )
    return page, status


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    """The sign-in form; a valid analyst token opens a session."""
    next_url = sessions.safe_next(flask.request.values.get("next"))
    if flask.request.method == "GET":
        if sessions.signed_in():
            return flask.redirect(next_url or flask.url_for("dashboard.campaign_list"))
        return _login_page(None, 200, next_url)
    if not sessions.csrf_ok():
        return _login_page("The form expired. Please try again.", 400, next_url)
    if not sessions.sign_in(flask.request.form.get("token", "")):
        return _login_page("That token is not valid.", 401, next_url)
    return flask.redirect(next_url or flask.url_for("dashboard.campaign_list"), code=303)


@bp.post("/logout")
def logout() -> Any:
    """End the session (a POST with the CSRF token, so no other site can sign you out)."""
    if not sessions.csrf_ok():
        page = flask.render_template(
            "dashboard/message.html",
            title="Not signed out",
            message="The form expired. Reload the page and sign out again.",
        )
        return page, 400
    sessions.sign_out()
    return flask.redirect(flask.url_for("dashboard.login", signed_out=1), code=303)


# -- pages ---------------------------------------------------------------------------------


@bp.get("/")
@page_login_required
def campaign_list() -> str:
    store = get_store()
    campaigns = store.list_campaigns()
    last = store.last_report_times([c.spec.id for c in campaigns])
    rows = [data.campaign_row(c, last[c.spec.id]) for c in campaigns]
    return flask.render_template("dashboard/campaigns.html", campaigns=rows)


def _page_campaign(campaign_id: str) -> Campaign | None:
    try:
        return load_campaign(campaign_id)
    except (APIError, CampaignNotFound):
        return None


@bp.get("/campaigns/<campaign_id>")
@page_login_required
def campaign_page(campaign_id: str) -> Any:
    campaign = _page_campaign(campaign_id)
    if campaign is None:
        page = flask.render_template(
            "dashboard/message.html",
            title="No such campaign",
            message=f"There is no campaign {campaign_id!r}.",
        )
        return page, 404
    spec = campaign.spec
    store = get_store()
    last = store.last_report_times([spec.id])[spec.id]
    planar = data.has_map(campaign)  # a map of the grid's cells
    ordinal = spec.mechanism == GEOMETRIC
    return flask.render_template(
        "dashboard/campaign.html",
        campaign=data.campaign_row(campaign, last),
        planar=planar,
        raw_map=data.has_raw_map(campaign),
        basemap=basemap_config() if planar else None,
        ordinal=ordinal,
        grid=campaign.mechanism.grid if planar else None,
        value_range=(spec.lo, spec.hi) if ordinal else None,
        domain_size=None if planar or ordinal else campaign.mechanism.n_inputs,
        expected_error=data.expected_error_at(campaign),
        methods=[
            (m, data.METHOD_NAMES.get(m, m))
            for m in estimates.applicable_methods(campaign.mechanism)
        ],
        default_method=decision.default_method(campaign.mechanism),
        # An oracle's estimate lists its top values only (estimates.ORACLE_TOP_ROWS).
        listed_rows=estimates.ORACLE_TOP_ROWS if estimates.is_oracle(campaign.mechanism) else None,
        refresh_s=current_settings().dashboard_refresh_s,
        window_choices=data.window_choices(campaign, store.clock()),
    )


# -- data for the pages --------------------------------------------------------------------


def _estimate_args(campaign: Campaign, extra: frozenset[str] = frozenset()) -> tuple[str, float]:
    unknown = sorted(set(flask.request.args) - {"method", "confidence", "since", "until", *extra})
    if unknown:
        raise ValidationError(
            f"unknown parameter {unknown[0]!r}", field=unknown[0], code="invalid_parameter"
        )
    method = estimates.parse_method(flask.request.args.get("method"), campaign.mechanism)
    return method, estimates.parse_confidence(flask.request.args.get("confidence"))


@bp.get("/data/campaigns/<campaign_id>/summary")
@data_login_required
def campaign_summary(campaign_id: str) -> flask.Response:
    campaign = load_campaign(campaign_id)
    return flask.jsonify(data.summary(get_store(), campaign))


@bp.get("/data/campaigns/<campaign_id>/estimate")
@data_login_required
def campaign_estimate(campaign_id: str) -> flask.Response:
    campaign = load_campaign(campaign_id)
    method, confidence = _estimate_args(campaign)
    body, _ = bounded_estimate(campaign, method, confidence, request_window(campaign))
    return flask.jsonify(data.estimate_payload(campaign, body))


@bp.get("/data/campaigns/<campaign_id>/estimate.<any(csv, json):fmt>")
@data_login_required
def download_estimate(campaign_id: str, fmt: str) -> flask.Response:
    """The estimate as a file: CSV (one line per category or cell) or the API's JSON."""
    campaign = load_campaign(campaign_id)
    method, confidence = _estimate_args(campaign)
    window = request_window(campaign)
    body, _ = bounded_estimate(campaign, method, confidence, window)
    if fmt == "csv":
        response = flask.Response(export.estimate_csv(campaign, body), mimetype="text/csv")
    else:
        response = flask.jsonify(body)
    filename = f"{campaign.spec.id}-estimate-{method}{window_suffix(window)}.{fmt}"
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# -- time: the trend and the comparison of the picked window -------------------------------


@bp.get("/data/campaigns/<campaign_id>/trend")
@data_login_required
def campaign_trend(campaign_id: str) -> flask.Response:
    """The trend API's body (trends.trend_response) for the picked window: its periods, at
    least data.MIN_TREND_PERIODS of them up to its last, and its ``top`` categories (or cells).
    Without a window, every period from the campaign's first up to now."""
    campaign = load_campaign(campaign_id)
    method, confidence = _estimate_args(campaign, frozenset({"top"}))
    top = int(windows.TOP.parse(flask.request.args.get("top", str(data.TREND_TOP))))
    store = get_store()
    now = store.clock()
    asked = windows.parse_window(campaign, flask.request.args, now=now)
    window = data.trend_window(campaign, asked, now)
    body = trends.trend_response(
        store, campaign, method, confidence, window, top, now=now, **_estimate_sources()
    )
    return flask.jsonify(body)


@bp.get("/data/campaigns/<campaign_id>/compare")
@data_login_required
def campaign_comparison(campaign_id: str) -> flask.Response:
    """The comparison API's body (trends.comparison_json) of the picked window (b) with as
    many periods just before it (a). Without a window: the current period and the one before,
    as the API's defaults."""
    campaign = load_campaign(campaign_id)
    method, confidence = _estimate_args(campaign)
    store = get_store()
    now = store.clock()
    b = windows.parse_window(campaign, flask.request.args, now=now)
    b = b or windows.last_periods(campaign, 1, None, now=now)
    a = windows.previous(b, "since")
    sides = [
        windows.resolve(campaign, window, now=now, retention_s=store.period_retention_s)
        for window in (a, b)
    ]
    text, _ = trends.comparison_json(
        store, campaign, method, confidence, (sides[0], sides[1]), **_estimate_sources()
    )
    return flask.Response(text, mimetype="application/json")


@bp.get("/vendor/plotly.min.js")
def plotly_js() -> flask.Response:
    """plotly.js as shipped inside the installed ``plotly`` package (no CDN)."""
    bundle = resources.files("plotly") / "package_data" / "plotly.min.js"
    with resources.as_file(bundle) as path:
        return flask.send_file(path, mimetype="text/javascript", max_age=24 * 3600)

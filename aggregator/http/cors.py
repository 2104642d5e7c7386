"""Cross-origin access for the public endpoints only, so browser-based clients can report.

A web page on another origin may read campaign specs (``GET /campaigns``,
``GET /campaigns/<id>``, the OpenAPI document) and submit reports
(``POST /campaigns/<id>/reports``). Nothing else answers CORS: the admin and
analyst endpoints and the dashboards send no ``Access-Control-*`` header, so
a browser keeps other origins out of them. The public endpoints take no
cookies or tokens, so ``Access-Control-Allow-Credentials`` is never sent and
the wildcard origin is safe; ``CORS_ORIGINS`` (``LDP_CORS_ORIGINS``) narrows
it to a list of origins, or turns CORS off when empty.
"""

from __future__ import annotations

from collections.abc import Collection

import flask

from aggregator.services import current_settings

DEFAULT_ORIGINS = "*"
# URL rule -> the methods another origin may use on it.
PUBLIC_RULES: dict[str, frozenset[str]] = {
    "/api/v1/campaigns": frozenset({"GET"}),
    "/api/v1/campaigns/<campaign_id>": frozenset({"GET"}),
    "/api/v1/campaigns/<campaign_id>/reports": frozenset({"POST"}),
    "/api/v1/openapi.json": frozenset({"GET"}),
}
ALLOWED_HEADERS = "Content-Type"
# What a reporting page needs to read to back off when rate limited.
EXPOSED_HEADERS = "Retry-After, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset"
PREFLIGHT_MAX_AGE_S = 600


def _allowed_origin(origin: str, configured: str | Collection[str] | None) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for ``origin``, or None to refuse it."""
    if not configured:
        return None
    if configured == "*":
        return "*"
    origins = [configured] if isinstance(configured, str) else list(configured)
    return origin if origin in origins else None


def add_cors_headers(response: flask.Response) -> flask.Response:
    """``after_request`` hook: CORS headers on public endpoints' responses, errors included."""
    request = flask.request
    origin = request.headers.get("Origin")
    rule = request.url_rule.rule if request.url_rule is not None else None
    methods = PUBLIC_RULES.get(rule) if rule is not None else None
    if origin is None or methods is None:
        return response
    allow = _allowed_origin(origin, current_settings().cors_origins)
    if allow is None:
        return response
    if allow != "*":
        response.vary.add("Origin")
    if request.method == "OPTIONS":
        asked = request.headers.get("Access-Control-Request-Method", "")
        if asked not in methods:
            return response
        response.headers["Access-Control-Allow-Methods"] = ", ".join(sorted(methods))
        response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
    elif request.method not in methods | {"HEAD"}:
        return response
    else:
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
    response.headers["Access-Control-Allow-Origin"] = allow
    return response


def init_app(app: flask.Flask) -> None:
    app.after_request(add_cors_headers)

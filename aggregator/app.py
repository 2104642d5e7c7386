"""The Flask application factory and the store handle.

Settings come from :data:`DEFAULTS`, then ``test_config`` if given, else the
environment (``LDP_ADMIN_TOKEN``, ``LDP_ANALYST_TOKEN``, ``LDP_REDIS_URL``,
``LDP_DATA_DIR``, ...; see ``docs/aggregator.md``). The factory refuses weak
tokens (:func:`aggregator.http.auth.check_token_strength`) and bad settings with a
ValueError. Nothing connects until the first request needs the store: then
:func:`aggregator.services.get_store` opens the Redis named by ``REDIS_URL`` or, if
none is named, starts (or reuses) the embedded server in ``DATA_DIR``.
"""

from __future__ import annotations

from typing import Any

import flask
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from werkzeug.middleware.proxy_fix import ProxyFix

from aggregator import dashboard
from aggregator.http import auth, cors, enrollment, openapi, ratelimits, routes
from aggregator.http.errors import register_error_handlers
from aggregator.http.estimates import (
    DEFAULT_MAX_WORK,
    DEFAULT_TIMEOUT_S,
    LIMITS_EXTENSION,
    EstimateLimits,
)
from aggregator.http.reports import DEFAULT_MAX_BATCH, DEFAULT_REPORT_BUDGET
from aggregator.services import EXTENSION, StoreHandle
from aggregator.storage.capacity import DEFAULT_CHECK_INTERVAL_S, DEFAULT_HIGH_WATER
from aggregator.storage.redis_server import DEFAULT_DATA_DIR, DEFAULT_FSYNC, parse_memory_size
from aggregator.storage.store import DEFAULT_CAMPAIGN_MAX_REPORTS, DEFAULT_REPORT_ID_TTL_S

DEFAULTS: dict[str, Any] = {
    "ADMIN_TOKEN": None,
    "ANALYST_TOKEN": None,
    # Development only: accept tokens that are short or published as examples.
    "ALLOW_WEAK_TOKENS": False,
    "REDIS_URL": None,
    "DATA_DIR": DEFAULT_DATA_DIR,
    "REDIS_FSYNC": DEFAULT_FSYNC,
    # The embedded Redis's maxmemory (bytes or "512mb"); None: a quarter of the machine's.
    "REDIS_MAXMEMORY": None,
    "STORAGE_HIGH_WATER": DEFAULT_HIGH_WATER,
    "STORAGE_CHECK_INTERVAL_S": DEFAULT_CHECK_INTERVAL_S,
    "REPORT_ID_TTL_S": DEFAULT_REPORT_ID_TTL_S,
    "MAX_BATCH": DEFAULT_MAX_BATCH,
    "MAX_CONTENT_LENGTH": 1024 * 1024,
    "CAMPAIGN_MAX_REPORTS": DEFAULT_CAMPAIGN_MAX_REPORTS,
    "RATELIMIT_REPORTS": "600 per minute",
    "REPORT_BUDGET": DEFAULT_REPORT_BUDGET,
    "RATELIMIT_AUTH_FAILURES": auth.DEFAULT_AUTH_FAILURE_LIMIT,
    "RATELIMIT_ENABLED": True,
    "RATELIMIT_HEADERS_ENABLED": True,
    "CORS_ORIGINS": cors.DEFAULT_ORIGINS,
    # Proxies in front of the app whose X-Forwarded-For/-Proto are trusted (0: none).
    "TRUSTED_PROXIES": 0,
    # None: the session cookie is Secure when the request came over HTTPS.
    "SESSION_COOKIE_SECURE": None,
    "ESTIMATE_MAX_WORK": DEFAULT_MAX_WORK,
    "ESTIMATE_TIMEOUT_S": DEFAULT_TIMEOUT_S,
}


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, not opened for the API (it authenticates by token).

    The cookie is ``Secure`` when ``SESSION_COOKIE_SECURE`` says so, or, when it is
    unset, when the request came over HTTPS (directly, or through a trusted proxy
    that says so: ``TRUSTED_PROXIES``).
    """

    def open_session(  # type: ignore[override]  # the API's null session is a SessionMixin too
        self, app: flask.Flask, request: flask.Request
    ) -> SessionMixin | None:
        if request.path.startswith("/api/"):
            return self.null_session_class()
        return super().open_session(app, request)

    def get_cookie_secure(self, app: flask.Flask) -> bool:
        configured = app.config["SESSION_COOKIE_SECURE"]
        if configured is None:
            return flask.has_request_context() and flask.request.is_secure
        return bool(configured)


def _check_settings(config: flask.Config) -> None:
    """Refuse weak tokens and malformed settings before anything starts (ValueError)."""
    auth.check_token_strength(config)
    parse_memory_size(config["REDIS_MAXMEMORY"])
    proxies = config["TRUSTED_PROXIES"]
    if isinstance(proxies, bool) or not isinstance(proxies, int) or proxies < 0:
        raise ValueError(f"LDP_TRUSTED_PROXIES must be a whole number >= 0, got {proxies!r}")


def create_app(test_config: dict[str, Any] | None = None) -> flask.Flask:
    """Build the aggregator app; ``test_config`` replaces the environment when given."""
    app = flask.Flask(__name__)
    app.config.from_mapping(DEFAULTS)
    if test_config is None:
        app.config.from_prefixed_env("LDP")
    else:
        app.config.from_mapping(test_config)
    _check_settings(app.config)
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's default JSON provider
    app.session_interface = _SessionInterface()
    proxies = app.config["TRUSTED_PROXIES"]
    if proxies:
        # Client address (rate limits) and scheme (the Secure cookie) from the proxies' headers.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)  # type: ignore[method-assign]

    app.extensions[EXTENSION] = StoreHandle(app.config)
    app.extensions[LIMITS_EXTENSION] = EstimateLimits.from_config(app.config)
    register_error_handlers(app)
    cors.init_app(app)
    app.register_blueprint(routes.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(dashboard.bp)
    app.register_blueprint(enrollment.bp)

    # Report submissions are limited (RATELIMIT_REPORTS) inside the ingestion script, in
    # the same Redis call that stores them (see aggregator.http.routes.submit_reports).
    ratelimits.limit_public_views(app)
    return app

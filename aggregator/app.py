"""The Flask application factory and the store handle.

Settings come from :data:`DEFAULTS`, then ``test_config`` if given, else the
environment (``LDP_ADMIN_TOKEN``, ``LDP_ANALYST_TOKEN``, ``LDP_REDIS_URL``,
``LDP_DATA_DIR``, ...; see ``docs/aggregator.md``). Nothing connects until
the first request needs the store: then :func:`aggregator.db.get_store` opens the Redis
named by ``REDIS_URL`` or, if none is named, starts (or reuses) the embedded
server in ``DATA_DIR``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flask
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

from aggregator import api, cors, dashboard, enrollment, openapi, ratelimits
from aggregator.db import EXTENSION, StoreHandle
from aggregator.errors import register_error_handlers
from aggregator.estimates import (
    DEFAULT_MAX_WORK,
    DEFAULT_TIMEOUT_S,
    LIMITS_EXTENSION,
    EstimateLimits,
)
from aggregator.redis_server import DEFAULT_DATA_DIR, DEFAULT_FSYNC
from aggregator.reports import DEFAULT_MAX_BATCH
from aggregator.store import DEFAULT_REPORT_ID_TTL_S

DEFAULTS: dict[str, Any] = {
    "ADMIN_TOKEN": None,
    "ANALYST_TOKEN": None,
    "REDIS_URL": None,
    "DATA_DIR": DEFAULT_DATA_DIR,
    "REDIS_FSYNC": DEFAULT_FSYNC,
    "REPORT_ID_TTL_S": DEFAULT_REPORT_ID_TTL_S,
    "MAX_BATCH": DEFAULT_MAX_BATCH,
    "MAX_CONTENT_LENGTH": 1024 * 1024,
    "RATELIMIT_REPORTS": "600 per minute",
    "RATELIMIT_ENABLED": True,
    "RATELIMIT_HEADERS_ENABLED": True,
    "CORS_ORIGINS": cors.DEFAULT_ORIGINS,
    "ESTIMATE_MAX_WORK": DEFAULT_MAX_WORK,
    "ESTIMATE_TIMEOUT_S": DEFAULT_TIMEOUT_S,
}


def _limiter_storage(redis_url: str | None) -> str:
    if not redis_url:
        return "memory://"
    if redis_url.startswith("unix://"):
        return "redis+unix://" + redis_url.removeprefix("unix://")
    return redis_url


REPORTS_VIEW = "api.submit_reports"


def _is_limiter_hook(hook: Callable) -> bool:
    return isinstance(getattr(hook, "__self__", None), Limiter)


def _unless_reports(hook: Callable[[], Any]) -> Callable[[], Any]:
    @functools.wraps(hook)
    def wrapped() -> Any:
        if flask.request.endpoint != REPORTS_VIEW:
            return hook()
        return None

    return wrapped


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, not opened for the API (it authenticates by token)."""

    def open_session(self, app: flask.Flask, request: flask.Request) -> SessionMixin | None:
        if request.path.startswith("/api/"):
            return self.null_session_class()
        return super().open_session(app, request)


def create_app(test_config: dict[str, Any] | None = None) -> flask.Flask:
    """Build the aggregator app; ``test_config`` replaces the environment when given."""
    app = flask.Flask(__name__)
    app.config.from_mapping(DEFAULTS)
    if test_config is None:
        app.config.from_prefixed_env("LDP")
    else:
        app.config.from_mapping(test_config)
    app.config.setdefault("RATELIMIT_STORAGE_URI", _limiter_storage(app.config["REDIS_URL"]))
    app.json.sort_keys = False
    app.session_interface = _SessionInterface()

    app.extensions[EXTENSION] = StoreHandle(app.config)
    app.extensions[LIMITS_EXTENSION] = EstimateLimits.from_config(app.config)
    register_error_handlers(app)
    cors.init_app(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(dashboard.bp)
    app.register_blueprint(enrollment.bp)

    limiter = Limiter(get_remote_address, key_prefix="ldp:ratelimit")
    limiter.init_app(app)
    # The limit decorator holds the limiter only weakly, and a disabled limiter does not
    # register itself in app.extensions: without this reference it is collected and every
    # limited view fails.
    app.extensions["ldp_limiter"] = limiter
    # Report submissions are limited (RATELIMIT_REPORTS) inside the ingestion script, in
    # the same Redis call that stores them (see aggregator.api.submit_reports), so the
    # limiter's per-request hook is skipped for them: it is about 5 % of a report's CPU.
    limiter.request_filter(lambda: flask.request.endpoint == REPORTS_VIEW)
    hooks = app.before_request_funcs.setdefault(None, [])
    hooks[:] = [_unless_reports(hook) if _is_limiter_hook(hook) else hook for hook in hooks]
    ratelimits.limit_public_views(app, limiter)
    return app

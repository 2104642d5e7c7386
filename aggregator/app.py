"""The Flask application factory.

Settings come from ``test_config`` if given, else the environment (``LDP_ADMIN_TOKEN``,
``LDP_REDIS_URL``, ``LDP_DATA_DIR``, ...), read and checked once into an
:class:`aggregator.settings.Settings` (see docs/aggregator.md): a weak token or a bad
value stops the factory with :class:`aggregator.settings.SettingsError`. Nothing
connects until the first request needs the store: then
:func:`aggregator.services.get_store` opens the Redis named by ``REDIS_URL`` or, if
none is named, starts (or reuses) the embedded server in ``DATA_DIR``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import flask
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from werkzeug.middleware.proxy_fix import ProxyFix

from aggregator import dashboard
from aggregator.http import cors, enrollment, metrics, openapi, ratelimits, routes
from aggregator.http.errors import register_error_handlers
from aggregator.http.estimates import LIMITS_EXTENSION, EstimateLimits
from aggregator.services import EXTENSION, SETTINGS_EXTENSION, StoreHandle
from aggregator.settings import Settings


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
        configured = app.extensions[SETTINGS_EXTENSION].session_cookie_secure
        if configured is None:
            return flask.has_request_context() and flask.request.is_secure
        return bool(configured)


def create_app(test_config: Settings | Mapping[str, Any] | None = None) -> flask.Flask:
    """Build the aggregator app from ``test_config`` if given, else from the environment.

    ``test_config`` is a :class:`Settings` or a mapping of setting names (``REDIS_URL``,
    ...) and Flask's own keys (``TESTING``, ...). A bad setting raises
    :class:`aggregator.settings.SettingsError` before anything is built.
    """
    if isinstance(test_config, Settings):
        settings = test_config
    elif test_config is None:
        settings = Settings.from_env(os.environ)
    else:
        settings = Settings.from_mapping(test_config)
    app = flask.Flask(__name__)
    if isinstance(test_config, Mapping):
        app.config.from_mapping(test_config)  # Flask's own keys; the settings replace the rest
    app.config.from_mapping(settings.to_config())
    app.extensions[SETTINGS_EXTENSION] = settings
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's default JSON provider
    app.session_interface = _SessionInterface()
    proxies = settings.trusted_proxies
    if proxies:
        # Client address (rate limits) and scheme (the Secure cookie) from the proxies' headers.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)  # type: ignore[method-assign]

    app_metrics = metrics.init_app(app)
    app.extensions[EXTENSION] = StoreHandle(
        settings, on_under_replicated=app_metrics.record_under_replicated
    )
    app.extensions[LIMITS_EXTENSION] = EstimateLimits(
        max_work=settings.estimate_max_work,
        timeout_s=settings.estimate_timeout_s,
        threads=settings.estimate_threads,
    )
    register_error_handlers(app, on_redis_error=app_metrics.record_redis_error)
    cors.init_app(app)
    app.register_blueprint(routes.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(dashboard.bp)
    app.register_blueprint(enrollment.bp)

    # Report submissions are limited (RATELIMIT_REPORTS) inside the ingestion script, in
    # the same Redis call that stores them (see aggregator.http.routes.submit_reports).
    ratelimits.limit_public_views(app)
    return app

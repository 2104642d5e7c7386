"""Rate limits per client address on every endpoint anyone can call without a token.

Report submissions have their own limit (``RATELIMIT_REPORTS``, set up in
:func:`aggregator.app.create_app`); the other public endpoints (health,
campaign list and spec, the OpenAPI document) share the setting
``RATELIMIT_PUBLIC`` (each its own counter), and the dashboard's sign-in form
``RATELIMIT_LOGIN``, which also slows down guessing the analyst token. The
counters live in the limiter's storage (the store's Redis under ``serve``), so
a limit holds across workers. A limited request gets 429 with ``Retry-After``.
"""

from __future__ import annotations

import flask
from flask_limiter import Limiter

DEFAULT_PUBLIC_LIMIT = "1200 per minute"
DEFAULT_LOGIN_LIMIT = "30 per minute"
PUBLIC_VIEWS = ("api.health", "api.list_campaigns", "api.get_campaign", "openapi.openapi_json")
LOGIN_VIEW = "dashboard.login"


def _setting(name: str):
    return lambda: flask.current_app.config[name]


def limit_public_views(app: flask.Flask, limiter: Limiter) -> None:
    """Wrap the public views of ``app`` (already registered) in their limits."""
    app.config.setdefault("RATELIMIT_PUBLIC", DEFAULT_PUBLIC_LIMIT)
    app.config.setdefault("RATELIMIT_LOGIN", DEFAULT_LOGIN_LIMIT)
    for view in PUBLIC_VIEWS:
        # flask-limiter's decorator is typed for async views too; these are sync.
        app.view_functions[view] = limiter.limit(_setting("RATELIMIT_PUBLIC"))(  # type: ignore[assignment]
            app.view_functions[view]
        )
    if LOGIN_VIEW in app.view_functions:
        app.view_functions[LOGIN_VIEW] = limiter.limit(_setting("RATELIMIT_LOGIN"))(  # type: ignore[assignment]
            app.view_functions[LOGIN_VIEW]
        )

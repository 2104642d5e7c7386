"""Rate limits per client address on every endpoint anyone can call without a token.

There is one kind of limit: a fixed window counted in the store's Redis by a
Lua script (``aggregator/storage/lua``), so a limit holds across workers.
Report submissions are counted inside the ingestion script itself
(``RATELIMIT_REPORTS``, see :func:`aggregator.http.routes.submit_reports`);
the other public endpoints (health, campaign list and spec, the OpenAPI
document, the metrics) share the setting ``RATELIMIT_PUBLIC`` (each its own counter), and
the dashboard's sign-in form ``RATELIMIT_LOGIN``, which also slows down
guessing the analyst token. A limited request gets 429 with ``Retry-After``;
with ``RATELIMIT_HEADERS_ENABLED`` every counted response carries
``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``.

A counter that cannot be written (Redis at its memory limit, or unreachable)
does not refuse the request: health and reads must keep answering in the
store's reserve. Failed sign-ins are counted apart, and fail closed
(:mod:`aggregator.http.auth`).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

import flask
import redis

from aggregator.http.errors import error_response
from aggregator.services import current_settings, get_store
from aggregator.storage.ingest import RateLimit
from aggregator.storage.request_counter import WindowCount

DEFAULT_PUBLIC_LIMIT = "1200 per minute"
DEFAULT_LOGIN_LIMIT = "30 per minute"
PUBLIC_VIEWS = (
    "api.health",
    "api.list_campaigns",
    "api.get_campaign",
    "openapi.openapi_json",
    "metrics.metrics",
)
LOGIN_VIEW = "dashboard.login"
_UNIT_S = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "month": 30 * 86400,
    "year": 12 * 30 * 86400,
}
# "600 per minute", "600/minute", "10 per 30 seconds".
_LIMIT = re.compile(r"(\d+)\s*(?:/|per)\s*(\d+)?\s*(second|minute|hour|day|month|year)s?", re.I)


@functools.lru_cache(maxsize=16)
def parse_limit(setting: str) -> tuple[int, int]:
    """``"600 per minute"`` as (600, 60): requests allowed and the window in seconds.

    Raises ValueError for anything else (several limits in one setting included).
    """
    match = _LIMIT.fullmatch(setting.strip())
    if match is None:
        raise ValueError(
            f"a rate limit is written like '600 per minute' or '10 per 30 seconds', got {setting!r}"
        )
    amount, multiple, unit = match.groups()
    window_s = int(multiple or 1) * _UNIT_S[unit.lower()]
    if window_s < 1:
        raise ValueError(f"a rate limit's window must be at least a second, got {setting!r}")
    return int(amount), window_s


def add_headers(response: flask.Response, amount: int, remaining: int, ttl_s: int) -> None:
    """The ``X-RateLimit-*`` headers of a counted request, if ``RATELIMIT_HEADERS_ENABLED``."""
    if not current_settings().ratelimit_headers_enabled:
        return
    response.headers["X-RateLimit-Limit"] = str(amount)
    response.headers["X-RateLimit-Remaining"] = str(max(remaining, 0))
    response.headers["X-RateLimit-Reset"] = str(int(time.time()) + ttl_s)


def _count(setting: str, view: str) -> tuple[RateLimit, WindowCount] | None:
    """Count this request; None when limits are off or the counter cannot be written."""
    configured = current_settings().rate_limit(setting)
    if configured is None:
        return None
    limit = RateLimit(*configured, flask.request.remote_addr or "unknown")
    try:
        return limit, get_store().count_request(view, limit)
    except redis.RedisError as error:
        flask.current_app.logger.warning("rate limit of %s not counted: %s", view, error)
        return None


def _limited(setting: str, view: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` behind the limit named by ``setting``, counted per address for ``view``."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> flask.Response:
        counted = _count(setting, view)
        if counted is None:
            return flask.make_response(function(*args, **kwargs))
        limit, count = counted
        if count.hits > limit.amount:
            response = error_response(
                429,
                "rate_limited",
                f"rate limit exceeded ({limit.amount} per {limit.window_s} s); retry later",
            )
            response.headers["Retry-After"] = str(max(count.ttl_s, 1))
        else:
            response = flask.make_response(function(*args, **kwargs))
        add_headers(response, limit.amount, limit.amount - count.hits, count.ttl_s)
        return response

    return wrapped


def limit_public_views(app: flask.Flask) -> None:
    """Wrap the public views of ``app`` (already registered) in their limits."""
    for view in PUBLIC_VIEWS:
        app.view_functions[view] = _limited("ratelimit_public", view, app.view_functions[view])
    if LOGIN_VIEW in app.view_functions:
        app.view_functions[LOGIN_VIEW] = _limited(
            "ratelimit_login", LOGIN_VIEW, app.view_functions[LOGIN_VIEW]
        )

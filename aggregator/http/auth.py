"""Bearer-token roles: ``admin`` (create and close campaigns), ``analyst`` (read results)
and ``metrics`` (scrape ``/metrics``).

The tokens are server settings (``LDP_ADMIN_TOKEN``, ``LDP_ANALYST_TOKEN``,
``LDP_METRICS_TOKEN``); the admin token also opens analyst endpoints and the
metrics. A role whose token is not configured cannot be used at all (but by
the admin token). Tokens are compared in constant time.

* No token: 401. A token that is none of the configured ones: 401 (with
  ``WWW-Authenticate: Bearer``), and the failure is counted against the
  client's address. A configured token without the role: 403.
* Failed attempts (here and on the dashboard's sign-in form) are limited per
  address by ``RATELIMIT_AUTH_FAILURES``, counted in the store's Redis so the
  limit holds across workers. Past it, every token attempt from that address
  gets 429 with ``Retry-After`` before any token is compared, so the answer
  says nothing about the token.
* :func:`check_token_strength` refuses tokens shorter than
  :data:`MIN_TOKEN_LENGTH` or published as examples, unless
  ``ALLOW_WEAK_TOKENS`` is set (development only).
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import flask
from werkzeug.exceptions import TooManyRequests

from aggregator.http.errors import APIError
from aggregator.services import current_settings, get_store
from aggregator.storage.ingest import RateLimit

ADMIN = "admin"
ANALYST = "analyst"
METRICS = "metrics"
_ROLE_TOKENS = {
    ADMIN: ("ADMIN_TOKEN",),
    ANALYST: ("ANALYST_TOKEN", "ADMIN_TOKEN"),
    METRICS: ("METRICS_TOKEN", "ADMIN_TOKEN"),
}
# Every bearer token the server takes (all must be strong).
TOKEN_SETTINGS = ("ADMIN_TOKEN", "ANALYST_TOKEN", "METRICS_TOKEN")
MIN_TOKEN_LENGTH = 32
# Tokens that appear in the project's documentation and examples: known to everyone.
EXAMPLE_TOKENS = frozenset({"change-me", "change-me-too", "admin-secret", "analyst-secret"})
DEFAULT_AUTH_FAILURE_LIMIT = "10 per minute"

F = TypeVar("F", bound=Callable)


class WeakTokenError(ValueError):
    """A configured token is too short or a published example (names the setting only)."""


def check_token_strength(config: Mapping[str, Any]) -> None:
    """Refuse weak tokens unless ``ALLOW_WEAK_TOKENS`` is set; the message never shows a token."""
    if config.get("ALLOW_WEAK_TOKENS"):
        return
    for name in TOKEN_SETTINGS:
        value = config.get(name)
        if value is None or value == "":
            continue
        token = str(value)
        if token.strip().lower() in EXAMPLE_TOKENS:
            reason = "is an example from the documentation"
        elif len(token) < MIN_TOKEN_LENGTH:
            reason = f"is shorter than {MIN_TOKEN_LENGTH} characters"
        else:
            continue
        raise WeakTokenError(
            f"LDP_{name} {reason}; generate one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))' "
            "(or set LDP_ALLOW_WEAK_TOKENS=1 for development only)"
        )


def bearer_token() -> str | None:
    header = flask.request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(given: str, configured: object) -> bool:
    if configured is None or configured == "":
        return False
    return hmac.compare_digest(given.encode(), str(configured).encode())


FAILURES_VIEW = "auth-failure"


def _failure_limit() -> RateLimit | None:
    """This address's allowance of failed attempts, or None if unlimited."""
    limit = current_settings().rate_limit("ratelimit_auth_failures")
    if limit is None:
        return None
    return RateLimit(*limit, flask.request.remote_addr or "unknown")


def refuse_if_throttled() -> None:
    """429 (``Retry-After``) if this address has used up its failed attempts (a read only)."""
    limit = _failure_limit()
    if limit is None:
        return
    amount, window_s = limit.amount, limit.window_s
    if get_store().requests_counted(FAILURES_VIEW, limit) >= amount:
        retry_after = max(window_s - int(time.time()) % window_s, 1)
        raise TooManyRequests(
            f"too many failed authentication attempts ({amount} per {window_s} s)",
            retry_after=retry_after,
        )


def record_failure() -> None:
    """Count a failed attempt from this address (shared by all workers through Redis).

    The attempt that uses up the address's allowance is logged (once per window).
    """
    limit = _failure_limit()
    if limit is None:
        return
    failures = get_store().count_request(FAILURES_VIEW, limit).hits
    if failures == limit.amount:
        flask.current_app.logger.warning(
            "%d failed authentication attempts from %s within %d s: further token attempts "
            "from this address get 429 until the window ends",
            failures,
            flask.request.remote_addr,
            limit.window_s,
        )


def grants(token: str, role: str) -> bool:
    """Whether ``token`` is one of the configured tokens that carry ``role``."""
    config = flask.current_app.config
    return any(_matches(token, config.get(name)) for name in _ROLE_TOKENS[role])


def token_grants(token: str, role: str) -> bool:
    """Whether ``token`` carries ``role``; False for a configured token of another role.

    Raises 429 (throttled: before any token is compared) or 401 for a token that is none
    of the configured ones, counted as a failed attempt.
    """
    refuse_if_throttled()
    if grants(token, role):
        return True
    config = flask.current_app.config
    if any(_matches(token, config.get(name)) for name in TOKEN_SETTINGS):
        return False
    record_failure()
    raise APIError(401, "unauthorized", "the bearer token is not valid")


def check_role(role: str) -> None:
    """Raise 401 (no or unknown token), 403 (token without ``role``) or 429 (throttled)."""
    token = bearer_token()
    if token is None:
        raise APIError(
            401, "unauthorized", f"this endpoint needs a bearer token of the {role} role"
        )
    if not token_grants(token, role):
        raise APIError(403, "forbidden", f"the token does not grant the {role} role")


def require(role: str) -> Callable[[F], F]:
    """Decorator: the view needs a bearer token of ``role``."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapped(*args, **kwargs):
            check_role(role)
            return view(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorate

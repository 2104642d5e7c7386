"""Bearer-token roles: ``admin`` (create and close campaigns) and ``analyst`` (read results).

The tokens are server settings (``LDP_ADMIN_TOKEN``, ``LDP_ANALYST_TOKEN``);
the admin token also opens analyst endpoints. A role whose token is not
configured cannot be used at all. Tokens are compared in constant time.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import TypeVar

import flask

from aggregator.errors import APIError

ADMIN = "admin"
ANALYST = "analyst"
_ROLE_TOKENS = {ADMIN: ("ADMIN_TOKEN",), ANALYST: ("ANALYST_TOKEN", "ADMIN_TOKEN")}

F = TypeVar("F", bound=Callable)


def bearer_token() -> str | None:
    header = flask.request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(given: str, configured: object) -> bool:
    if configured is None or configured == "":
        return False
    # from_prefixed_env parses values as JSON, so a numeric token arrives as an int.
    return hmac.compare_digest(given.encode(), str(configured).encode())


def check_role(role: str) -> None:
    """Raise a 401 (no token) or 403 (token without this role) unless the request has ``role``."""
    token = bearer_token()
    if token is None:
        raise APIError(401, "unauthorized", f"this endpoint needs an {role} bearer token")
    config = flask.current_app.config
    if not any(_matches(token, config.get(name)) for name in _ROLE_TOKENS[role]):
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

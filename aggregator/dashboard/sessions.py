"""Dashboard sign-in: the analyst token opens a server-side session named by a cookie.

The browser holds Flask's signed session cookie (``HttpOnly``, ``SameSite=Lax``)
with two random values: ``sid``, the session's id, and ``csrf``, the token that
every dashboard form must echo. The session itself lives in Redis under
``ldp:dashboard:session:<sid>`` with a fixed lifetime, holding a keyed digest
of the token that opened it, so that

* signing out deletes it, and a copy of the cookie is worthless afterwards;
* rotating ``LDP_ANALYST_TOKEN`` ends every session it opened;
* any number of workers behind one Redis share the sessions.

Failed sign-ins count against the address's failed-authentication limit, the
one bearer tokens share (:mod:`aggregator.http.auth`): past it the form answers 429
before comparing the token. The token itself is never stored, nor put into a
page. ``SECRET_KEY`` (the
``LDP_SECRET_KEY`` setting) signs the cookie; when it is not set, a key is
derived from the configured tokens, which every worker shares, so that
sessions survive restarts and work across workers without configuration.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

import flask

from aggregator.http import auth
from aggregator.http.errors import error_response
from aggregator.services import get_store

if TYPE_CHECKING:
    from flask.sansio.app import App

DEFAULT_SESSION_TTL_S = 8 * 3600
COOKIE_NAME = "ldp_session"
CSRF_FIELD = "csrf_token"
# Tokens that may open a dashboard session (the admin token also grants the analyst role).
_TOKEN_SETTINGS = ("ANALYST_TOKEN", "ADMIN_TOKEN")
_DERIVATION_LABEL = b"ldp-dashboard-session-key"

F = TypeVar("F", bound=Callable)


def configure(app: App) -> None:
    """Give the app what the dashboard's cookie needs, keeping what the operator set."""
    config = app.config
    if isinstance(config.get("SECRET_KEY"), (int, float)):
        # from_prefixed_env parses values as JSON: an all-digit key arrives as a number.
        config["SECRET_KEY"] = str(config["SECRET_KEY"])
    if not config.get("SECRET_KEY"):
        tokens = [str(config.get(name) or "") for name in _TOKEN_SETTINGS]
        if any(tokens):
            material = "\0".join(tokens).encode()
            config["SECRET_KEY"] = hmac.new(material, _DERIVATION_LABEL, hashlib.sha256).hexdigest()
        else:
            # No token, no sign-in: the key signs nothing of value.
            config["SECRET_KEY"] = secrets.token_hex(32)
    if config.get("SESSION_COOKIE_NAME") in (None, "session"):
        config["SESSION_COOKIE_NAME"] = COOKIE_NAME
    if not config.get("SESSION_COOKIE_SAMESITE"):
        config["SESSION_COOKIE_SAMESITE"] = "Lax"
    config["SESSION_COOKIE_HTTPONLY"] = True
    config.setdefault("DASHBOARD_SESSION_TTL_S", DEFAULT_SESSION_TTL_S)


def _fingerprint(token: str) -> str:
    key = str(flask.current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def _configured_tokens() -> list[str]:
    config = flask.current_app.config
    # from_prefixed_env parses values as JSON, so a numeric token arrives as an int.
    return [str(config[name]) for name in _TOKEN_SETTINGS if config.get(name) not in (None, "")]


def token_is_valid(token: str) -> bool:
    """Whether ``token`` is the analyst (or admin) token, compared in constant time."""
    given = token.encode()
    return any(hmac.compare_digest(given, t.encode()) for t in _configured_tokens())


def csrf_token() -> str:
    """The session's CSRF token, created on first use."""
    if "csrf" not in flask.session:
        flask.session["csrf"] = secrets.token_urlsafe(32)
    return flask.session["csrf"]


def csrf_ok() -> bool:
    """Whether the submitted form echoes the session's CSRF token."""
    expected = flask.session.get("csrf")
    given = flask.request.form.get(CSRF_FIELD, "")
    return bool(expected) and hmac.compare_digest(given.encode(), str(expected).encode())


def sign_in(token: str) -> bool:
    """Open a session if ``token`` is valid; a fresh session id and CSRF token either way.

    A throttled address gets 429 whatever the token; a wrong token is counted.
    """
    auth.refuse_if_throttled()
    if not token_is_valid(token):
        auth.record_failure()
        return False
    sid = secrets.token_urlsafe(32)
    ttl = int(flask.current_app.config["DASHBOARD_SESSION_TTL_S"])
    get_store().sessions.open(sid, _fingerprint(token), ttl)
    flask.session.clear()
    flask.session["sid"] = sid
    flask.session["csrf"] = secrets.token_urlsafe(32)
    return True


def sign_out() -> None:
    sid = flask.session.get("sid")
    if sid:
        get_store().sessions.close(sid)
    flask.session.clear()


def signed_in() -> bool:
    """Whether the request carries a live session opened by a currently valid token."""
    if "ldp_signed_in" in flask.g:
        return flask.g.ldp_signed_in
    result = False
    sid = flask.session.get("sid")
    if isinstance(sid, str) and sid:
        stored = get_store().sessions.fingerprint(sid)
        if stored is not None:
            result = any(
                hmac.compare_digest(stored, _fingerprint(token).encode())
                for token in _configured_tokens()
            )
    flask.g.ldp_signed_in = result
    return result


def safe_next(raw: str | None) -> str | None:
    """A dashboard path to return to after sign-in, or None if ``raw`` is not one."""
    if not raw or "\\" in raw or any(ord(ch) < 32 for ch in raw):
        return None
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc or raw.startswith("//"):
        return None
    prefix = flask.url_for("dashboard.campaign_list")
    return raw if parts.path.startswith(prefix) else None


def page_login_required(view: F) -> F:
    """Decorator for pages: without a session, redirect to the sign-in page."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not signed_in():
            target = flask.request.full_path.rstrip("?")
            return flask.redirect(flask.url_for("dashboard.login", next=target))
        return view(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def data_login_required(view: F) -> F:
    """Decorator for the pages' JSON and downloads: 401 without a session."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not signed_in():
            return error_response(401, "unauthorized", "sign in to the dashboard first")
        return view(*args, **kwargs)

    return wrapped  # type: ignore[return-value]

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
from aggregator.services import SETTINGS_EXTENSION, current_settings, get_store

if TYPE_CHECKING:
    from flask.sansio.app import App

CSRF_FIELD = "csrf_token"
_DERIVATION_LABEL = b"ldp-dashboard-session-key"

F = TypeVar("F", bound=Callable)


def configure(app: App) -> None:
    """Give the app what the dashboard's cookie needs, keeping what the operator set."""
    config = app.config
    if not config.get("SECRET_KEY"):
        settings = app.extensions[SETTINGS_EXTENSION]
        tokens = [settings.analyst_token or "", settings.admin_token or ""]
        if any(tokens):
            material = "\0".join(tokens).encode()
            config["SECRET_KEY"] = hmac.new(material, _DERIVATION_LABEL, hashlib.sha256).hexdigest()
        else:
            # No token, no sign-in: the key signs nothing of value.
            config["SECRET_KEY"] = secrets.token_hex(32)
    config["SESSION_COOKIE_HTTPONLY"] = True


def _fingerprint(token: str) -> str:
    key = str(flask.current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def _configured_tokens() -> list[str]:
    """The tokens that may open a dashboard session (the admin token grants the analyst role)."""
    settings = current_settings()
    return [token for token in (settings.analyst_token, settings.admin_token) if token]


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
    ttl = current_settings().dashboard_session_ttl_s
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


def session_role() -> str | None:
    """The role of the currently valid token that opened the request's live session
    (``admin`` for the admin token, else ``analyst``), or None without one."""
    if "ldp_session_role" in flask.g:
        return flask.g.ldp_session_role
    role = None
    sid = flask.session.get("sid")
    if isinstance(sid, str) and sid:
        stored = get_store().sessions.fingerprint(sid)
        settings = current_settings()
        tokens = ((auth.ADMIN, settings.admin_token), (auth.ANALYST, settings.analyst_token))
        if stored is not None:
            role = next(
                (
                    name
                    for name, token in tokens
                    if token and hmac.compare_digest(stored, _fingerprint(token).encode())
                ),
                None,
            )
    flask.g.ldp_session_role = role
    return role


def signed_in() -> bool:
    """Whether the request carries a live session opened by a currently valid token."""
    return session_role() is not None


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

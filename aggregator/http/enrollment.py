"""Enrollment tokens: campaigns that take one report per token the admin issued.

A campaign with ``enrollment_required`` accepts a new report only with an
unused token (``enrollment_token`` in the report); the ingest script spends
the token in the same atomic step that stores the report, so one token makes
exactly one report, however many workers and retries there are. The admin
issues tokens in bulk and hands each device its own (out of band: e-mail, QR
code, an app's sign-up). The store keeps only each token's SHA-256, and
never which token made which report.
"""

from __future__ import annotations

import functools
import secrets

import flask

from aggregator.http.auth import ADMIN, require
from aggregator.http.errors import APIError
from aggregator.http.routes import json_body, load_campaign
from aggregator.services import get_store
from aggregator.storage.store import Campaign
from shared.errors import ValidationError
from shared.schema import Number, Object

MAX_TOKENS_PER_REQUEST = 10_000
TOKEN_BYTES = 24

# The body of a request for tokens.
TOKEN_REQUEST = Object(
    {"count": Number(integer=True, minimum=1, maximum=MAX_TOKENS_PER_REQUEST)},
    required=("count",),
    noun='{"count": <number of tokens>}',
)
_invalid_request = functools.partial(ValidationError, code="invalid_request")

bp = flask.Blueprint("enrollment", __name__, url_prefix="/api/v1")


def new_token() -> str:
    """A fresh token: 24 bytes from the CSPRNG, URL-safe base64 (32 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def _enrollment_campaign(campaign_id: str) -> Campaign:
    campaign = load_campaign(campaign_id)
    if not campaign.spec.enrollment_required:
        raise APIError(
            409,
            "enrollment_not_required",
            f"campaign {campaign_id!r} does not require enrollment; its reports take no token",
        )
    return campaign


def _count(body: object) -> int:
    return TOKEN_REQUEST.check(body, None, _invalid_request)["count"]


@bp.post("/campaigns/<campaign_id>/enrollment-tokens")
@require(ADMIN)
def issue_tokens(campaign_id: str) -> tuple[flask.Response, int]:
    """Issue ``count`` single-use tokens; they are shown once, here, and never again."""
    _enrollment_campaign(campaign_id)
    count = _count(json_body())
    tokens = [new_token() for _ in range(count)]
    unused = get_store().add_enrollment_tokens(campaign_id, tokens)
    body = {"campaign": campaign_id, "issued": count, "unused": unused, "tokens": tokens}
    return flask.jsonify(body), 201


@bp.get("/campaigns/<campaign_id>/enrollment-tokens")
@require(ADMIN)
def token_status(campaign_id: str) -> flask.Response:
    """How many issued tokens have not made a report yet."""
    _enrollment_campaign(campaign_id)
    unused = get_store().unused_enrollment_tokens(campaign_id)
    return flask.jsonify({"campaign": campaign_id, "unused": unused})

"""HTTP errors: every failure leaves as ``{"error": {"code", "message", "field"}}``.

The library layers raise :class:`shared.errors.ValidationError` and the store's
errors; this module maps them, and werkzeug's own HTTP errors, to JSON with
the right status. An unexpected exception becomes a 500 with a generic
message: the traceback goes to the log, never to the client.
"""

from __future__ import annotations

from collections.abc import Callable

import flask
import redis
from werkzeug.exceptions import HTTPException

from aggregator.storage.errors import (
    CampaignClosed,
    CampaignExists,
    CampaignFull,
    CampaignNotFound,
    EnrollmentRefused,
    LayoutOutdated,
    RateLimited,
    ReportBudgetExceeded,
    SpecChanged,
    StorageFull,
    StoreError,
)
from shared.errors import LDPError, ValidationError

# Validation codes that are conflicts with the server's state rather than bad input.
CONFLICT_CODES = frozenset({"spec_mismatch"})
# Seconds a client is told to wait when the store could not be reached.
STORAGE_RETRY_AFTER_S = 2
_STORE_STATUS = {
    CampaignNotFound: 404,
    CampaignClosed: 409,
    CampaignExists: 409,
    EnrollmentRefused: 403,
    SpecChanged: 409,
    RateLimited: 429,
    ReportBudgetExceeded: 429,
    CampaignFull: 507,
    StorageFull: 507,
    LayoutOutdated: 503,
}
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}
STORAGE_UNAVAILABLE = "storage_unavailable"
INTERNAL_ERROR = "internal_error"


class APIError(LDPError):
    """An error the HTTP layer raises itself (authentication, media type, body)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message, field=field, code=code)
        self.status = status
        self.retry_after_s = retry_after_s


def error_response(
    status: int, code: str, message: str, field: str | None = None
) -> flask.Response:
    response = flask.jsonify({"error": {"code": code, "message": message, "field": field}})
    response.status_code = status
    return response


def _api_error(error: APIError) -> flask.Response:
    response = error_response(error.status, error.code, error.message, error.field)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="ldp"'
    if error.retry_after_s is not None:
        response.headers["Retry-After"] = str(error.retry_after_s)
    return response


def _validation_error(error: ValidationError) -> flask.Response:
    status = 409 if error.code in CONFLICT_CODES else 422
    return error_response(status, error.code, error.message, error.field)


def _store_error(error: StoreError) -> flask.Response:
    response = error_response(_STORE_STATUS.get(type(error), 409), error.code, error.message)
    retry_after_s = getattr(error, "retry_after_s", None)
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


def _http_code(error: HTTPException) -> str:
    return _HTTP_CODES.get(error.code or 500, "http_error")


def answer_code(error: BaseException) -> str:
    """The ``code`` of the JSON error that the handlers below answer ``error`` with."""
    if isinstance(error, APIError | ValidationError | StoreError):
        return error.code
    if isinstance(error, HTTPException):
        return _http_code(error)
    if isinstance(error, redis.RedisError):
        return STORAGE_UNAVAILABLE
    return INTERNAL_ERROR


def _http_error(error: HTTPException) -> flask.Response:
    status = error.code or 500
    code = _http_code(error)
    message = error.description or error.name
    if status == 413:
        message = "the request body is too large"
    elif status == 429:
        message = f"rate limit exceeded ({message}); retry later"
    response = error_response(status, code, message)
    for name, value in error.get_headers():
        if name.lower() not in ("content-type", "content-length"):
            response.headers[name] = value
    return response


def _redis_error(error: redis.RedisError) -> flask.Response:
    flask.current_app.logger.error("storage unavailable: %s", error)
    response = error_response(
        503, STORAGE_UNAVAILABLE, "the report store is unavailable; retry later"
    )
    # A node failing over comes back within seconds (the store retried for a few already).
    response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
    return response


def _unexpected(error: Exception) -> flask.Response:
    flask.current_app.logger.exception("unhandled error")
    return error_response(500, INTERNAL_ERROR, "internal server error")


def register_error_handlers(
    app: flask.Flask, *, on_redis_error: Callable[[redis.RedisError], None] | None = None
) -> None:
    """Map every error to its JSON answer; ``on_redis_error`` is told of each 503 from Redis."""

    def redis_error(error: redis.RedisError) -> flask.Response:
        if on_redis_error is not None:
            on_redis_error(error)
        return _redis_error(error)

    app.register_error_handler(APIError, _api_error)
    app.register_error_handler(ValidationError, _validation_error)
    app.register_error_handler(StoreError, _store_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(redis.RedisError, redis_error)
    app.register_error_handler(Exception, _unexpected)

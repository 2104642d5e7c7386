"""HTTP to the aggregator: fetch and check a campaign spec, post reports.

The server is not trusted. Every request has a timeout; answers are size
limited and parsed strictly (no NaN or Infinity); a spec must parse, name the
campaign asked for and carry the hash the device computes from it. Errors map
onto :mod:`client.errors`: anything worth retrying (refused connection,
timeout, 5xx, 429, an acknowledgement that cannot be read) is
:class:`ServerUnavailable`; a definite refusal is a :class:`ServerError`.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import quote, urlsplit

import requests

from client.errors import (
    CampaignClosed,
    CampaignNotFound,
    ServerRejected,
    ServerUnavailable,
    UntrustedSpec,
)
from shared.errors import SpecError, ValidationError
from shared.spec import ID_PATTERN, CampaignSpec

API_PREFIX = "/api/v1"
# (connect, read) seconds, as the requests documentation advises.
DEFAULT_TIMEOUT = (3.05, 10.0)
# A k-RR spec with the largest domain is about 20 MB; refuse anything much larger.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_RETRY_AFTER_S = 24 * 3600.0
_MESSAGE_CHARS = 300
_ERRNO_MESSAGE = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def normalize_server_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash; ValueError otherwise."""
    if not isinstance(url, str):
        raise TypeError("the server URL must be a string")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the server URL must be http:// or https://, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError("the server URL must not have a query or fragment")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def check_campaign_id(campaign_id: Any) -> str:
    """A campaign id as the protocol allows it (so it is safe in a URL path)."""
    if not isinstance(campaign_id, str) or not ID_PATTERN.fullmatch(campaign_id):
        raise ValidationError(
            "a campaign id is 1-64 characters of a-z, 0-9, '-' or '_'",
            field="campaign",
            code="invalid_campaign_id",
        )
    return campaign_id


@dataclass(frozen=True)
class Delivery:
    """The server's acknowledgement of a report or a batch."""

    accepted: int
    duplicates: int


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _clean(text: Any) -> str:
    """Server-supplied text, made safe to show: printable and short."""
    shown = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    return shown if len(shown) <= _MESSAGE_CHARS else shown[:_MESSAGE_CHARS] + "..."


def _count(value: Any) -> TypeGuard[int]:
    """Whether a JSON value is a count: an integer >= 0 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _reason(exc: Exception) -> str:
    """A short cause for a connection failure: the OS message if there is one."""
    found = _ERRNO_MESSAGE.search(str(exc))
    if found:
        return _clean(found.group(1)).lower()
    return type(exc).__name__


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class AggregatorAPI:
    """The part of the aggregator's API the device uses.

    Parameters
    ----------
    server : str
        Base URL, e.g. ``http://127.0.0.1:8000``.
    session : requests.Session
        Injected for connection reuse and for tests (a transport adapter).
    timeout : float or (connect, read)
        Applied to every request.
    """

    def __init__(
        self,
        server: str,
        session: requests.Session,
        *,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        self.server = normalize_server_url(server)
        self.session = session
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes

    def campaign_url(self, campaign_id: str) -> str:
        return (
            f"{self.server}{API_PREFIX}/campaigns/{quote(check_campaign_id(campaign_id), safe='')}"
        )

    def reports_url(self, campaign_id: str) -> str:
        return f"{self.campaign_url(campaign_id)}/reports"

    def get_campaign(self, campaign_id: str) -> tuple[CampaignSpec, dict[str, Any]]:
        """The campaign's spec, checked, and the server fields (``status``, ``spec_hash``...).

        Raises :class:`CampaignClosed` for a closed campaign and
        :class:`UntrustedSpec` for anything that does not check out.
        """
        status, body = self._request("GET", self.campaign_url(campaign_id))
        self._raise_for_status(status, body)
        if not isinstance(body, dict):
            raise UntrustedSpec("the server's campaign spec is not a JSON object", status=status)
        try:
            spec, meta = CampaignSpec.from_wire(body)
        except SpecError as exc:
            raise UntrustedSpec(
                f"the server's campaign spec is invalid: {exc.message}",
                status=status,
                field=exc.field,
            ) from exc
        if spec.id != campaign_id:
            raise UntrustedSpec(
                f"asked for campaign {campaign_id!r}, the server answered with {_clean(spec.id)!r}",
                status=status,
                field="id",
            )
        served_hash = meta.get("spec_hash")
        if served_hash != spec.spec_hash:
            raise UntrustedSpec(
                "the server's spec_hash does not match the spec it serves "
                f"(served {_clean(served_hash)!r}, computed {spec.spec_hash!r})",
                status=status,
                field="spec_hash",
            )
        campaign_status = meta.get("status", "open")
        if campaign_status == "closed":
            raise CampaignClosed(f"campaign {campaign_id!r} is closed", status=status)
        if campaign_status != "open":
            raise UntrustedSpec(
                f"unknown campaign status {_clean(campaign_status)!r}",
                status=status,
                field="status",
            )
        return spec, meta

    def post_reports(self, campaign_id: str, payloads: list[dict[str, Any]]) -> Delivery:
        """Send one report (a list of one) or a batch; idempotent thanks to the report ids."""
        if not payloads:
            raise ValueError("nothing to send")
        document = payloads[0] if len(payloads) == 1 else {"reports": payloads}
        status, body = self._request("POST", self.reports_url(campaign_id), document)
        self._raise_for_status(status, body)
        if isinstance(body, dict):
            accepted, duplicates = body.get("accepted"), body.get("duplicates")
            if _count(accepted) and _count(duplicates):
                return Delivery(accepted=accepted, duplicates=duplicates)
        # Acknowledged, but unreadably: sending again is safe (same report ids).
        raise ServerUnavailable("the server's acknowledgement could not be read; will retry")

    def _request(self, method: str, url: str, document: Any = None) -> tuple[int, Any]:
        data = None
        headers = {"Accept": "application/json"}
        if document is not None:
            data = json.dumps(document, allow_nan=False, separators=(",", ":")).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            with self.session.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,
            ) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    retry_after = parse_retry_after(
                        response.headers.get("Retry-After"), time.time()
                    )
                    what = "is rate limiting this device" if status == 429 else f"failed ({status})"
                    raise ServerUnavailable(f"the server {what}", retry_after=retry_after)
                raw = self._read_limited(response)
        except requests.Timeout as exc:
            raise ServerUnavailable(f"the server did not answer in time ({url})") from exc
        except requests.RequestException as exc:
            raise ServerUnavailable(
                f"cannot reach the server at {self.server} ({_reason(exc)})"
            ) from exc
        try:
            body = json.loads(raw, parse_constant=_reject_constant) if raw else None
        except (ValueError, RecursionError):
            body = _NOT_JSON
        return status, body

    def _read_limited(self, response: requests.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_content(chunk_size=65536):
            size += len(chunk)
            if size > self.max_response_bytes:
                raise ServerUnavailable(
                    f"the server's answer is larger than {self.max_response_bytes} bytes"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _raise_for_status(self, status: int, body: Any) -> None:
        if 200 <= status < 300:
            return
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        code = _clean(error.get("code", "")) or None
        message = _clean(error.get("message", "")) or f"HTTP {status}"
        field = _clean(error["field"]) if isinstance(error.get("field"), str) else None
        if status == 404:
            raise CampaignNotFound(f"unknown campaign ({message})", status=status, field=field)
        if status == 409 and code is not None and "closed" in code:
            raise CampaignClosed(f"the campaign is closed ({message})", status=status, field=field)
        if 300 <= status < 400:
            raise ServerRejected(f"the server redirected ({status}); not followed", status=status)
        raise ServerRejected(
            f"the server refused ({status}, {code or 'no code'}): {message}",
            status=status,
            field=field,
            code=code,
        )


_NOT_JSON = object()

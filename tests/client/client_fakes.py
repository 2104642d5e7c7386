"""An in-process stand-in for the aggregator, as a requests transport adapter.

Narrow unit tests only: it speaks the DESIGN.md section 5 protocol closely
enough to exercise the client's failure handling (refused connections, lost
acknowledgements, 5xx, 429, malicious specs) without sockets. The end-to-end
tests in ``tests/e2e`` use the real server.
"""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter

from shared.errors import ReportError
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

SERVER = "http://aggregator.test"
KRR_SPEC = {
    "id": "fruit",
    "title": "Favourite fruit",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": ["apple", "banana", "cherry", "durian"],
}
# One report per device per UTC day: the campaign for tests that answer one campaign repeatedly.
DAILY_SPEC = {**KRR_SPEC, "id": "daily", "title": "Fruit today", "period": "day"}
RR_SPEC = {"id": "smoker", "title": "Do you smoke?", "mechanism": "rr", "epsilon": 0.5}
PLANAR_SPEC = {
    "id": "where",
    "title": "Where do you live?",
    "mechanism": "planar_laplace",
    "epsilon": 0.002,
    "region": {"lat_min": 48.10, "lat_max": 48.15, "lon_min": 11.50, "lon_max": 11.60},
    "cell_size_m": 250.0,
}


class Clock:
    """A device clock for tests: seconds since the epoch, moved on by hand."""

    DAY_S = 86_400.0

    def __init__(self, now: float = 1_736_899_200.0):  # 2025-01-15 00:00 UTC, a Wednesday
        self.now = now

    def __call__(self) -> float:
        return self.now

    def next_day(self) -> None:
        self.now += self.DAY_S


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing catches it."""


class FakeAggregator(BaseAdapter):
    """Campaigns, received reports by id, and knobs to make the server misbehave.

    ``mode`` applies to every request: ``"up"``, ``"down"`` (connection
    refused), ``"timeout"``, ``"503"``, ``"429"``. ``post_mode`` applies to
    report submissions only: any of those, or ``"lose_ack"`` (stores, then the
    connection drops), ``"crash"`` (the client process dies while sending).
    """

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, CampaignSpec] = {}
        self.status: dict[str, str] = {}
        self.raw_spec: dict[str, bytes] = {}
        self.received: dict[str, dict[str, Any]] = {}
        self.reject_ids: set[str] = set()
        self.requests: list[tuple[str, str, Any]] = []
        self.mode = "up"
        self.post_mode = "up"
        self.retry_after = "120"

    # -- set-up --------------------------------------------------------------------------

    def add(self, spec: dict[str, Any], status: str = "open") -> CampaignSpec:
        parsed = CampaignSpec.from_dict(spec)
        self.specs[parsed.id] = parsed
        self.status[parsed.id] = status
        self.received.setdefault(parsed.id, {})
        return parsed

    def session(self) -> requests.Session:
        session = requests.Session()
        session.mount(SERVER, self)
        return session

    def posts(self) -> list[Any]:
        return [body for method, _path, body in self.requests if method == "POST"]

    def count(self, campaign_id: str) -> int:
        return len(self.received.get(campaign_id, {}))

    # -- the adapter ---------------------------------------------------------------------

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        path = urlsplit(request.url).path
        body = json.loads(request.body) if request.body else None
        self.requests.append((request.method, path, body))
        mode = self.post_mode if request.method == "POST" and self.mode == "up" else self.mode
        if mode == "down":
            raise requests.ConnectionError("connection refused")
        if mode == "timeout":
            raise requests.ReadTimeout("read timed out")
        if mode == "503":
            return self._response(request, 503, _error("storage_unavailable", "down"))
        if mode == "429":
            return self._response(
                request, 429, _error("rate_limited", "slow down"), {"Retry-After": self.retry_after}
            )
        parts = path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "campaigns"] or len(parts) not in (4, 5):
            return self._response(request, 404, _error("not_found", "no route"))
        campaign_id = parts[3]
        if campaign_id not in self.specs:
            return self._response(request, 404, _error("campaign_not_found", "no campaign"))
        if len(parts) == 4 and request.method == "GET":
            if campaign_id in self.raw_spec:
                return self._raw(request, 200, self.raw_spec[campaign_id])
            spec = self.specs[campaign_id]
            wire = {
                **spec.to_dict(),
                "status": self.status[campaign_id],
                "spec_hash": spec.spec_hash,
            }
            return self._response(request, 200, wire)
        if len(parts) == 5 and parts[4] == "reports" and request.method == "POST":
            return self._submit(request, campaign_id, body)
        return self._response(request, 405, _error("method_not_allowed", "no"))

    def _submit(self, request: Any, campaign_id: str, body: Any) -> requests.Response:
        if self.status[campaign_id] != "open":
            return self._response(request, 409, _error("campaign_closed", "closed"))
        spec = self.specs[campaign_id]
        mechanism = Mechanism.from_spec(spec)
        reports = body.get("reports", [body])
        for i, report in enumerate(reports):
            if set(report) - {"report_id", "value", "spec_hash"}:
                return self._response(request, 422, _error("invalid_report", "unknown field"))
            if report.get("spec_hash", spec.spec_hash) != spec.spec_hash:
                return self._response(request, 409, _error("spec_mismatch", "other spec"))
            if report["report_id"] in self.reject_ids:
                return self._response(
                    request, 422, _error("invalid_report", "refused", f"reports[{i}].value")
                )
            try:
                mechanism.parse_report_value(report["value"])
            except ReportError as exc:
                return self._response(request, 422, {"error": exc.to_dict()})
        if self.post_mode == "crash":
            raise Crash()
        seen = self.received[campaign_id]
        accepted = duplicates = 0
        for report in reports:
            if report["report_id"] in seen:
                duplicates += 1
            else:
                seen[report["report_id"]] = report["value"]
                accepted += 1
        if self.post_mode == "lose_ack":
            raise requests.ConnectionError("connection reset by peer")
        return self._response(request, 200, {"accepted": accepted, "duplicates": duplicates})

    def _response(
        self, request: Any, status: int, document: Any, headers: dict | None = None
    ) -> requests.Response:
        return self._raw(request, status, json.dumps(document).encode(), headers)

    @staticmethod
    def _raw(
        request: Any, status: int, body: bytes, headers: dict | None = None
    ) -> requests.Response:
        response = requests.Response()
        response.status_code = status
        response.headers.update({"Content-Type": "application/json", **(headers or {})})
        response.raw = io.BytesIO(body)
        response.url = request.url
        response.request = request
        return response

    def close(self) -> None:
        pass


def _error(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}

"""Rate limits against a real server: every public endpoint answers 429 with Retry-After."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from support import running_server

ADMIN_TOKEN = "ratelimit-admin-token-0123456789abcdefgh"
LIMIT = 3
SPEC = {"id": "limited", "title": "Limited", "mechanism": "rr", "epsilon": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = {
        "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
        "LDP_RATELIMIT_PUBLIC": f"{LIMIT} per minute",
        "LDP_RATELIMIT_REPORTS": f"{LIMIT} per minute",
        "LDP_RATELIMIT_LOGIN": f"{LIMIT} per minute",
        # One shard: a report's limit is counted whole in it (each of S shards admits 1/S).
        "LDP_SHARDS": "1",
    }
    data_dir = tmp_path_factory.mktemp("ratelimit") / "data"
    with running_server(data_dir, env=settings, workers=2) as srv:
        created = requests.post(
            f"{srv.api}/campaigns",
            json=SPEC,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=10,
        )
        assert created.status_code == 201
        yield srv


def with_room_in_the_window(seconds: float = 20.0) -> None:
    """Wait for the next minute if fewer than ``seconds`` are left in this one. The limits'
    windows are fixed minutes of the clock (RELIABILITY.md): requests on both sides of a
    boundary are counted in two windows, and a test's last requests would be allowed again."""
    left = 60.0 - time.time() % 60.0
    if left < seconds:
        time.sleep(left + 0.1)


def report() -> dict:
    return {"report_id": str(uuid.uuid4()), "value": "yes"}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/campaigns", None),
        ("GET", "/api/v1/campaigns/limited", None),
        ("GET", "/api/v1/openapi.json", None),
        ("POST", "/api/v1/campaigns/limited/reports", report),
        ("GET", "/dashboard/login", None),
    ],
)
def test_public_endpoints_answer_429_with_retry_after(server, method, path, body):
    with_room_in_the_window()
    session = requests.Session()
    statuses = []
    for _ in range(LIMIT + 2):
        response = session.request(
            method, server.url + path, json=body() if body else None, timeout=10
        )
        statuses.append(response.status_code)
    assert statuses[:LIMIT] == [200] * LIMIT
    assert statuses[LIMIT:] == [429, 429]
    assert 0 < int(response.headers["Retry-After"]) <= 60
    if path.startswith("/api/"):
        assert response.json()["error"]["code"] == "rate_limited"


def test_the_limit_holds_across_workers(server):
    # Two workers answer in turn; the counter lives in Redis, so the limit is per address.
    # (Waiting for the server to start may have spent some of the health check's allowance.)
    with_room_in_the_window()
    responses = [requests.get(f"{server.url}/api/v1/health", timeout=10) for _ in range(8)]
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) <= LIMIT and statuses[-5:] == [429] * 5
    assert int(responses[-1].headers["Retry-After"]) > 0

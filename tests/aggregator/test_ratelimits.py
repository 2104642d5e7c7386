"""The public views' rate limits: fixed windows counted in Redis by the store's Lua script."""

from __future__ import annotations

import time

import pytest
import redis

from aggregator.app import create_app
from aggregator.http.ratelimits import parse_limit
from aggregator.storage.ingest import RateLimit
from aggregator.storage.store import CampaignStore

HEALTH = "/api/v1/health"


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("600 per minute", (600, 60)),
        ("600/minute", (600, 60)),
        ("10 per 30 seconds", (10, 30)),
        (" 5 PER 2 Hours ", (5, 7200)),
        ("1 per day", (1, 86400)),
    ],
)
def test_limits_are_read_as_amount_and_window(setting, expected):
    assert parse_limit(setting) == expected


@pytest.mark.parametrize(
    "setting", ["", "600", "per minute", "600 per fortnight", "1 per minute; 2 per hour", "-1/s"]
)
def test_a_malformed_limit_is_refused(setting):
    with pytest.raises(ValueError, match="600 per minute"):
        parse_limit(setting)


@pytest.mark.parametrize("setting", ["RATELIMIT_PUBLIC", "RATELIMIT_LOGIN"])
def test_a_malformed_setting_stops_the_app_naming_it(config, setting):
    with pytest.raises(ValueError, match=f"LDP_{setting}"):
        create_app({**config, setting: "lots"})


def test_a_public_view_answers_429_with_retry_after_past_its_limit(config):
    client = create_app({**config, "RATELIMIT_PUBLIC": "2 per minute"}).test_client()
    responses = [client.get(HEALTH) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert [r.headers["X-RateLimit-Remaining"] for r in responses] == ["1", "0", "0"]
    assert all(r.headers["X-RateLimit-Limit"] == "2" for r in responses)
    refused = responses[-1]
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert int(refused.headers["X-RateLimit-Reset"]) <= time.time() + 61
    assert refused.get_json()["error"]["code"] == "rate_limited"
    # Each view has its own counter.
    assert client.get("/api/v1/campaigns").status_code == 200


def test_the_sign_in_form_has_its_own_limit(config):
    client = create_app(
        {**config, "RATELIMIT_LOGIN": "1 per minute", "RATELIMIT_PUBLIC": "100 per minute"}
    ).test_client()
    assert [client.get("/dashboard/login").status_code for _ in range(2)] == [200, 429]
    assert client.get(HEALTH).status_code == 200


def test_no_limit_and_no_headers_when_limits_are_off(config):
    client = create_app(
        {**config, "RATELIMIT_PUBLIC": "1 per minute", "RATELIMIT_ENABLED": False}
    ).test_client()
    responses = [client.get(HEALTH) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert "X-RateLimit-Limit" not in responses[0].headers


def test_headers_can_be_left_out(config):
    client = create_app(
        {**config, "RATELIMIT_PUBLIC": "1 per minute", "RATELIMIT_HEADERS_ENABLED": False}
    ).test_client()
    assert client.get(HEALTH).status_code == 200
    refused = client.get(HEALTH)
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    assert "X-RateLimit-Limit" not in refused.headers


def test_counters_are_single_keys_without_hash_tags_expiring_with_their_window(store):
    limit = RateLimit(amount=5, window_s=60, client="2001:db8::1")
    moment = 1_700_000_000.0
    counts = [store.count_request("api.health", limit, now=moment) for _ in range(3)]
    assert [c.hits for c in counts] == [1, 2, 3]
    assert all(0 < c.ttl_s <= 60 for c in counts)
    keys = [key.decode() for key in store.connection.keys("ldp:ratelimit:*")]
    assert keys == [f"ldp:ratelimit:api.health:2001:db8::1:{int(moment // 60)}"]
    assert "{" not in keys[0]
    # Another address, view or window counts apart.
    assert store.count_request("api.health", limit, now=moment + 60).hits == 1
    other = RateLimit(amount=5, window_s=60, client="192.0.2.7")
    assert store.count_request("api.health", other, now=moment).hits == 1
    assert store.count_request("api.list_campaigns", limit, now=moment).hits == 1


def test_a_counter_that_cannot_be_written_does_not_refuse_the_request(config, monkeypatch):
    def refuse(*args, **kwargs):
        raise redis.exceptions.OutOfMemoryError(
            "command not allowed when used memory > 'maxmemory'"
        )

    monkeypatch.setattr(CampaignStore, "count_request", refuse)
    client = create_app({**config, "RATELIMIT_PUBLIC": "1 per minute"}).test_client()
    responses = [client.get(HEALTH) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert "X-RateLimit-Limit" not in responses[0].headers

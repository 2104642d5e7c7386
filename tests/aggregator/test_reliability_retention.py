"""Retention: raw reports expire from the stream, counts stay; no client address is stored."""

from __future__ import annotations

import redis
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage.ingest import StoredReport
from aggregator.storage.retention import DAY_S, trim_all
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec

NOW = 1_750_000_000.0


def reports(n: int) -> list[StoredReport]:
    return [StoredReport(new_id(), i % 4, KRR_SPEC["domain"][i % 4]) for i in range(n)]


def test_old_raw_reports_are_trimmed_on_write_and_counts_stay(redis_url):
    store = CampaignStore(
        redis.Redis.from_url(redis_url), retention_s=30 * DAY_S, raw_reports="keep", shards=1
    )
    store.create_campaign(CampaignSpec.from_dict(KRR_SPEC), now=NOW - 60 * DAY_S)
    connection = store.connection
    layout = store.layout("fruit")
    stream = layout.stream_key(0)
    # Stream ids are stamped by Redis; old entries are planted with explicit old ids.
    for i in range(5):
        connection.xadd(
            stream,
            {"report_id": new_id(), "y": 0, "value": '"apple"'},
            id=f"{int((NOW - 40 * DAY_S) * 1000)}-{i}",
        )
    connection.hincrby(layout.counts_key(0), 0, 5)
    store.ingest("fruit", reports(8), now=NOW)
    # The clock of the Redis server is today's, so the fresh entries are newer than NOW.
    assert connection.xlen(stream) == 8
    assert sum(store.counts("fruit").values()) == 13


def test_trim_all_reaches_campaigns_without_new_reports(redis_url):
    store = CampaignStore(redis.Redis.from_url(redis_url), raw_reports="keep")
    store.create_campaign(CampaignSpec.from_dict(KRR_SPEC))
    store.ingest("fruit", reports(6))
    assert trim_all(store, 30 * DAY_S) == {"fruit": 0}
    # A retention of zero seconds from a moment in the future drops everything.
    assert trim_all(store, 1.0, now=4_000_000_000.0) == {"fruit": 6}
    assert list(store.iter_reports("fruit")) == []
    assert sum(store.counts("fruit").values()) == 6


def test_the_app_applies_the_setting(config, admin):
    app = create_app({**config, "RETENTION_DAYS": 7})
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    with app.app_context():
        from aggregator.services import get_store

        assert get_store().retention_s == 7 * DAY_S


def test_no_client_address_is_stored_with_reports(client, admin, redis_url):
    address = "203.0.113.77"
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    for value in ("apple", "banana"):
        response = client.post(
            "/api/v1/campaigns/fruit/reports",
            json={"report_id": new_id(), "value": value},
            environ_base={"REMOTE_ADDR": address},
        )
        assert response.status_code == 200
    connection = redis.Redis.from_url(redis_url)
    keys = connection.keys("ldp:{c:fruit:*}:reports")
    entries = [entry for key in keys for entry in connection.xrange(key)]
    assert len(entries) == 2
    assert all(set(fields) == {b"report_id", b"y", b"value"} for _, fields in entries)
    # Only rate-limit counters know the address, in their key names, and they expire.
    for key in connection.scan_iter("ldp:*"):
        if b"ratelimit" in key:
            assert connection.ttl(key) > 0
            continue
        kind = connection.type(key)
        dumped = repr(
            {
                b"hash": connection.hgetall,
                b"stream": connection.xrange,
                b"string": connection.get,
                b"set": connection.smembers,
                b"zset": lambda k: connection.zrange(k, 0, -1),
            }[kind](key)
        )
        assert address not in key.decode() and address not in dumped

"""The Redis store against a real server: creation, atomic deduplicated ingestion, key scheme."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from aggregator_testdata import KRR_SPEC, PLANAR_SPEC, new_id
from redis.crc import key_slot

from aggregator.storage.errors import CampaignClosed, CampaignExists, CampaignNotFound
from aggregator.storage.ingest import StoredReport
from aggregator.storage.keys import CAMPAIGNS
from aggregator.storage.store import CampaignStore
from shared.errors import SpecError
from shared.spec import CampaignSpec

KRR = CampaignSpec.from_dict(KRR_SPEC)


def reports(*outputs: int) -> list[StoredReport]:
    return [StoredReport(new_id(), y, KRR.domain[y]) for y in outputs]


def test_create_then_get_and_list(store):
    campaign, created = store.create_campaign(KRR, now=1000.0)
    assert created
    fetched = store.get_campaign(KRR.id)
    assert fetched == campaign
    assert fetched.spec == KRR
    assert fetched.status == "open"
    assert fetched.created_at == 1000.0
    assert fetched.to_wire()["spec_hash"] == KRR.spec_hash
    planar = CampaignSpec.from_dict(PLANAR_SPEC)
    store.create_campaign(planar, now=2000.0)
    assert [c.spec.id for c in store.list_campaigns()] == [KRR.id, planar.id]


def test_create_is_idempotent_for_the_same_spec_and_refuses_another(store):
    first, _ = store.create_campaign(KRR)
    again, created = store.create_campaign(KRR)
    assert not created
    assert again == first
    other = CampaignSpec.from_dict({**KRR_SPEC, "epsilon": 2.0})
    with pytest.raises(CampaignExists):
        store.create_campaign(other)
    assert store.get_campaign(KRR.id).spec == KRR


def test_unknown_campaign(store):
    with pytest.raises(CampaignNotFound):
        store.get_campaign("nope")
    with pytest.raises(CampaignNotFound):
        store.set_status("nope", "closed")
    with pytest.raises(CampaignNotFound):
        store.ingest("nope", reports(0))
    assert store.list_campaigns() == []


def test_ingest_counts_and_deduplicates_within_and_across_batches(store):
    store.create_campaign(KRR)
    batch = reports(0, 1, 1, 3)
    result = store.ingest(KRR.id, [*batch, batch[1]])
    assert (result.accepted, result.duplicates) == (4, 1)
    retry = store.ingest(KRR.id, [*batch[2:], *reports(3)])
    assert (retry.accepted, retry.duplicates) == (1, 2)
    assert store.counts(KRR.id) == {0: 1, 1: 2, 3: 2}
    assert store.get_campaign(KRR.id).n_reports == 5


def test_closed_campaign_refuses_and_stores_nothing(store):
    store.create_campaign(KRR)
    store.ingest(KRR.id, reports(2))
    assert store.set_status(KRR.id, "closed").status == "closed"
    with pytest.raises(CampaignClosed):
        store.ingest(KRR.id, reports(0, 1))
    assert store.counts(KRR.id) == {2: 1}
    assert len(list(store.iter_reports(KRR.id))) == 1
    store.set_status(KRR.id, "open")
    assert store.ingest(KRR.id, reports(0)).accepted == 1


def test_status_must_be_known(store):
    store.create_campaign(KRR)
    with pytest.raises(ValueError, match="status"):
        store.set_status(KRR.id, "paused")


def test_stream_keeps_every_accepted_report_oldest_batch_first(store):
    store.create_campaign(KRR)
    batch = reports(3, 0, 2, 2, 1)
    store.ingest(KRR.id, batch[:3], now=100.0)
    time.sleep(0.002)  # stream ids are Redis's milliseconds
    store.ingest(KRR.id, [*batch[3:], batch[0]], now=200.0)
    exported = list(store.iter_reports(KRR.id, chunk=2))
    # The shards keep a batch's reports each in its own stream: within a batch (the same
    # millisecond) the order is the shards'; batches come oldest first.
    sent = {r.report_id: r.value for r in batch}
    assert {r["report_id"] for r in exported[:3]} == {r.report_id for r in batch[:3]}
    assert {r["report_id"] for r in exported[3:]} == {r.report_id for r in batch[3:]}
    assert all(r["value"] == sent[r["report_id"]] for r in exported)
    times = [r["received_at"] for r in exported]
    assert times == sorted(times) and times[0] > 0


def test_hourly_counts_bucket_by_hour(store):
    store.create_campaign(KRR)
    store.ingest(KRR.id, reports(0, 1), now=7200.0 + 10)
    store.ingest(KRR.id, reports(1), now=7200.0 + 3599)
    store.ingest(KRR.id, reports(2), now=3600.0 * 5)
    assert store.hourly_counts(KRR.id) == [(7200, 3), (18000, 1)]


def test_each_shard_of_a_campaign_keeps_its_keys_in_one_slot(store):
    store.create_campaign(KRR)
    store.ingest(KRR.id, reports(*[i % 4 for i in range(200)]))
    keys = [k.decode() for k in store.connection.keys("*") if k != CAMPAIGNS.encode()]
    layout = store.layout(KRR.id)
    assert layout.shards == 16
    by_tag: dict[str, set[int]] = {}
    for key in keys:
        tag = key[key.index("{") : key.index("}") + 1]
        by_tag.setdefault(tag, set()).add(key_slot(key.encode()))
    # The record (and the campaign's counters) under {c:fruit}; every shard under its own tag.
    assert set(by_tag) == {"{c:fruit}"} | {f"{{c:fruit:{s}}}" for s in range(16)}
    assert all(len(slots) == 1 for slots in by_tag.values())
    assert len({next(iter(slots)) for slots in by_tag.values()}) == 17


def test_report_ids_are_remembered_for_the_ttl_in_sets_that_expire_whole(store):
    store.report_id_ttl_s = 1234
    store.max_reports = 3000  # buckets are sized for the quota: one per shard here
    store.create_campaign(KRR)
    layout = store.layout(KRR.id)
    assert (layout.window_s, layout.buckets) == (617, 1) and layout.report_id_ttl_s >= 1234
    batch = reports(*[i % 4 for i in range(300)])
    now = time.time()
    store.ingest(KRR.id, batch, now=now)
    seen = [k for k in store.connection.keys("ldp:{c:fruit:*}:seen:*")]
    # Far fewer keys than reports, each a compact set of 64-bit integers.
    assert 0 < len(seen) <= 16
    assert {store.connection.object("encoding", k) for k in seen} == {b"intset"}
    assert sum(store.connection.scard(k) for k in seen) == 300
    ttls = {store.connection.ttl(k) for k in seen}
    # Set expire when their window is two windows old: 2 to 3 windows after the report.
    assert all(1234 - 2 <= ttl <= 3 * 617 for ttl in ttls)
    # A retry within the TTL, in a later window, is still a duplicate.
    retry = store.ingest(KRR.id, batch[:10], now=now + 1200)
    assert (retry.accepted, retry.duplicates) == (0, 10)


def test_concurrent_retries_count_each_report_once(store):
    store.create_campaign(KRR)
    batch = reports(*[i % 4 for i in range(200)])
    errors = []

    def send(chunk):
        try:
            for start in range(0, len(chunk), 25):
                store.ingest(KRR.id, chunk[start : start + 25])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    # Eight threads send overlapping halves of the same reports, as retrying clients would.
    threads = [threading.Thread(target=send, args=(batch[(i % 2) * 100 :],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(store.counts(KRR.id).values()) == 200
    assert store.get_campaign(KRR.id).n_reports == 200
    exported = [r["report_id"] for r in store.iter_reports(KRR.id)]
    assert sorted(exported) == sorted(r.report_id for r in batch)


def test_stored_values_are_json(store):
    planar = CampaignSpec.from_dict(PLANAR_SPEC)
    store.create_campaign(planar)
    store.ingest(planar.id, [StoredReport(new_id(), 3, {"lat": 37.771, "lon": -122.419})])
    layout = store.layout(planar.id)
    raw = [e for s in range(layout.shards) for e in store.connection.xrange(layout.stream_key(s))]
    assert json.loads(raw[0][1][b"value"]) == {"lat": 37.771, "lon": -122.419}


def test_a_spec_is_read_and_parsed_once_per_store(store, monkeypatch):
    from aggregator.storage import campaigns

    store.create_campaign(KRR)
    first = store.get_campaign(KRR.id)
    # Corrupt the stored spec: a store that re-read it would now fail to parse it.
    store.connection.hset(store.layout(KRR.id).record_key, "spec", "{not json")
    again = store.get_campaign(KRR.id)
    assert again.spec is first.spec
    assert again.mechanism is first.mechanism
    fresh = CampaignStore(store.connection)
    with pytest.raises(ValueError):
        fresh.get_campaign(KRR.id)
    # The cache is bounded: with room for one spec, another campaign evicts this one.
    monkeypatch.setattr(campaigns, "SPEC_CACHE_SIZE", 1)
    store.create_campaign(CampaignSpec.from_dict(PLANAR_SPEC))
    with pytest.raises(ValueError):
        store.get_campaign(KRR.id)


def test_a_campaign_from_before_the_distortion_limit_stays_readable(store):
    # Created when regions were not yet bounded: the limit binds new campaigns only.
    wide = {
        **PLANAR_SPEC,
        "id": "wide",
        "region": {"lat_min": 50.0, "lat_max": 70.0, "lon_min": 0.0, "lon_max": 1.0},
        "cell_size_m": 5000.0,
        "epsilon": 0.0001,
    }
    with pytest.raises(SpecError, match="too large for one planar projection"):
        CampaignSpec.from_dict(wide)
    spec = CampaignSpec.from_dict(wide, stored=True)
    store.create_campaign(spec)
    fresh = CampaignStore(store.connection)
    assert fresh.get_campaign("wide").spec == spec
    assert [c.spec.id for c in fresh.list_campaigns()] == ["wide"]
    assert fresh.ingest("wide", [StoredReport(new_id(), 0, "r0c0")]).accepted == 1


def test_a_write_no_replica_confirmed_is_not_acknowledged_and_a_retry_is_a_duplicate(store):
    from aggregator.storage.cluster import NotAcknowledged

    waiting = CampaignStore(store.connection, ack_replicas=1, ack_timeout_ms=50)
    waiting.create_campaign(KRR)
    batch = reports(0, 1, 2)
    with pytest.raises(NotAcknowledged, match="reached 0 of 1 replicas"):
        waiting.ingest(KRR.id, batch)
    # The master has the reports: sent again they are duplicates, counted once.
    retried = store.ingest(KRR.id, batch)
    assert (retried.accepted, retried.duplicates) == (0, 3)
    assert store.get_campaign(KRR.id).n_reports == 3


def test_the_report_endpoint_answers_503_with_retry_after_when_replicas_do_not_confirm(config):
    from aggregator.app import create_app

    client = create_app({**config, "ACK_REPLICAS": 1, "ACK_TIMEOUT_MS": 50}).test_client()
    admin = {"Authorization": "Bearer " + config["ADMIN_TOKEN"]}
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    response = client.post(
        "/api/v1/campaigns/fruit/reports", json={"report_id": new_id(), "value": "apple"}
    )
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "storage_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_a_node_that_refuses_wait_is_retried_not_a_server_error(store, monkeypatch):
    """A replica (an old master back after a failover) answers WAIT with an error."""
    from aggregator.storage import cluster

    writer = cluster.NodeWriter(
        store.connection, ack_replicas=1, retry_for_s=0.3, sleep=lambda s: None
    )
    original = redis.client.Pipeline.execute

    def as_a_replica(self, raise_on_error=True):
        results = original(self, raise_on_error=raise_on_error)
        if results and results[-1] == 0:
            results[-1] = redis.ResponseError("ERR WAIT cannot be used with replica instances")
        return results

    monkeypatch.setattr(redis.client.Pipeline, "execute", as_a_replica)
    script = store.connection.register_script("return redis.call('INCR', KEYS[1])")
    with pytest.raises(redis.exceptions.ReadOnlyError, match="WAIT refused"):
        writer.run([cluster.Call(script, ["k"], [])])

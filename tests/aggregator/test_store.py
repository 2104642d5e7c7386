"""The Redis store against a real server: creation, atomic deduplicated ingestion, key scheme."""

from __future__ import annotations

import json
import threading

import pytest
from aggregator_testdata import KRR_SPEC, PLANAR_SPEC, new_id
from redis.crc import key_slot

from aggregator.storage.store import (
    CampaignClosed,
    CampaignExists,
    CampaignNotFound,
    StoredReport,
)
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


def test_stream_keeps_every_accepted_report_in_order(store):
    store.create_campaign(KRR)
    batch = reports(3, 0, 2, 2, 1)
    store.ingest(KRR.id, batch[:3], now=100.0)
    store.ingest(KRR.id, [*batch[3:], batch[0]], now=200.0)
    exported = list(store.iter_reports(KRR.id, chunk=2))
    assert [r["report_id"] for r in exported] == [r.report_id for r in batch]
    assert [r["value"] for r in exported] == [r.value for r in batch]
    assert all(r["received_at"] > 0 for r in exported)


def test_hourly_counts_bucket_by_hour(store):
    store.create_campaign(KRR)
    store.ingest(KRR.id, reports(0, 1), now=7200.0 + 10)
    store.ingest(KRR.id, reports(1), now=7200.0 + 3599)
    store.ingest(KRR.id, reports(2), now=3600.0 * 5)
    assert store.hourly_counts(KRR.id) == [(7200, 3), (18000, 1)]


def test_every_key_of_a_campaign_shares_one_cluster_slot(store):
    store.create_campaign(KRR)
    store.ingest(KRR.id, reports(0, 1))
    keys = [k for k in store.connection.keys("*") if k != store.INDEX_KEY.encode()]
    assert len(keys) >= 6  # campaign, counts, hourly, stream, two seen keys
    assert all(k.startswith(b"ldp:{c:fruit}:") for k in keys)
    assert len({key_slot(k) for k in keys}) == 1


def test_seen_keys_expire_after_the_retention(store):
    store.report_id_ttl_s = 1234
    store.create_campaign(KRR)
    (report,) = reports(0)
    store.ingest(KRR.id, [report])
    key = store.SEEN_KEY.format(id=KRR.id, report_id=report.report_id)
    assert 0 < store.connection.ttl(key) <= 1234


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
    raw = store.connection.xrange(store.STREAM_KEY.format(id=planar.id))
    assert json.loads(raw[0][1][b"value"]) == {"lat": 37.771, "lon": -122.419}


def test_a_spec_is_read_and_parsed_once_per_store(store, monkeypatch):
    from aggregator.storage import store as store_module

    store.create_campaign(KRR)
    first = store.get_campaign(KRR.id)
    # Corrupt the stored spec: a store that re-read it would now fail to parse it.
    store.connection.hset(store.CAMPAIGN_KEY.format(id=KRR.id), "spec", "{not json")
    again = store.get_campaign(KRR.id)
    assert again.spec is first.spec
    assert again.mechanism is first.mechanism
    fresh = store_module.CampaignStore(store.connection)
    with pytest.raises(ValueError):
        fresh.get_campaign(KRR.id)
    # The cache is bounded: with room for one spec, another campaign evicts this one.
    monkeypatch.setattr(store_module, "SPEC_CACHE_SIZE", 1)
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
    store.forget_campaign("wide")
    store._parsed.clear()
    assert store.get_campaign("wide").spec == spec
    assert [c.spec.id for c in store.list_campaigns()] == ["wide"]
    assert store.ingest("wide", [StoredReport(new_id(), 0, "r0c0")]).accepted == 1

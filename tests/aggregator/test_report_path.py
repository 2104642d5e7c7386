"""The one-call report path: spec pinned by hash, status and rate limit checked in the script."""

from __future__ import annotations

import pytest
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage.store import (
    CampaignStore,
    RateLimit,
    RateLimited,
    SpecChanged,
    StoredReport,
)
from shared.spec import CampaignSpec

URL = "/api/v1/campaigns/fruit/reports"
KRR = CampaignSpec.from_dict(KRR_SPEC)


def n_reports(store: CampaignStore, campaign_id: str = "fruit") -> int:
    return store.get_campaign(campaign_id).n_reports


def test_one_redis_call_per_submission(app, client, krr_campaign, redis_url):
    client.post(URL, json={"report_id": new_id(), "value": "apple"})  # the process reads the spec
    store = app.extensions["ldp"].get()
    calls = []
    original = store.connection.execute_command

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    store.connection.execute_command = counting
    try:
        for _ in range(3):
            assert (
                client.post(URL, json={"report_id": new_id(), "value": "banana"}).status_code == 200
            )
    finally:
        store.connection.execute_command = original
    assert calls == ["EVALSHA"] * 3


def test_rate_limit_per_client_and_campaign_with_headers(config, admin, store):
    client = create_app({**config, "RATELIMIT_REPORTS": "3 per minute"}).test_client()
    for spec in (KRR_SPEC, {**KRR_SPEC, "id": "other"}):
        assert client.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    remaining = []
    for _ in range(3):
        response = client.post(URL, json={"report_id": new_id(), "value": "apple"})
        assert response.status_code == 200
        assert response.headers["X-RateLimit-Limit"] == "3"
        remaining.append(int(response.headers["X-RateLimit-Remaining"]))
    assert remaining == [2, 1, 0]
    before = n_reports(store)
    limited = client.post(URL, json={"reports": [{"report_id": new_id(), "value": "cherry"}]})
    assert limited.status_code == 429
    assert limited.get_json()["error"]["code"] == "rate_limited"
    assert 0 < int(limited.headers["Retry-After"]) <= 60
    assert n_reports(store) == before
    # Another client address, or another campaign, has its own window.
    other_client = client.post(
        URL,
        json={"report_id": new_id(), "value": "apple"},
        environ_base={"REMOTE_ADDR": "10.0.0.2"},
    )
    assert other_client.status_code == 200
    other = client.post(
        "/api/v1/campaigns/other/reports", json={"report_id": new_id(), "value": "apple"}
    )
    assert other.status_code == 200


def test_rate_limit_off(config, krr_campaign):
    client = create_app({**config, "RATELIMIT_REPORTS": "1 per minute", "RATELIMIT_ENABLED": False})
    client = client.test_client()
    for _ in range(3):
        response = client.post(URL, json={"report_id": new_id(), "value": "apple"})
        assert response.status_code == 200
        assert "X-RateLimit-Limit" not in response.headers


def delete_campaign(connection, campaign_id: str) -> None:
    """Delete every key of a campaign, as an operator would by hand: record and shards."""
    for pattern in (f"ldp:{{c:{campaign_id}}}:*", f"ldp:{{c:{campaign_id}:*}}:*"):
        keys = list(connection.scan_iter(match=pattern))
        if keys:
            connection.delete(*keys)


def test_a_campaign_recreated_under_the_same_id_is_read_again(app, client, admin, krr_campaign):
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    # Behind this process's back, the campaign is replaced by one with other labels.
    store = app.extensions["ldp"].get()
    delete_campaign(store.connection, "fruit")
    replaced = CampaignSpec.from_dict({**KRR_SPEC, "domain": ["kiwi", "lime"]})
    store.create_campaign(replaced)
    # Checked against the stale copy "kiwi" would be refused; the script notices the new hash.
    response = client.post(URL, json={"report_id": new_id(), "value": "kiwi"})
    assert response.status_code == 200, response.get_json()
    stale_label = client.post(URL, json={"report_id": new_id(), "value": "apple"})
    assert stale_label.status_code == 422
    assert store.counts("fruit") == {0: 1}


def test_a_deleted_campaign_is_404_after_being_cached(app, client, krr_campaign):
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    store = app.extensions["ldp"].get()
    delete_campaign(store.connection, "fruit")
    response = client.post(URL, json={"report_id": new_id(), "value": "apple"})
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "campaign_not_found"


def test_store_refuses_a_stale_spec_hash_and_counts_the_limit(store):
    store.create_campaign(KRR)
    report = [StoredReport(new_id(), 0, "apple")]
    with pytest.raises(SpecChanged):
        store.ingest("fruit", report, spec_hash="0" * 64)
    limit = RateLimit(amount=1, window_s=60, client="c1")
    result = store.ingest("fruit", report, spec_hash=KRR.spec_hash, rate_limit=limit, now=120.0)
    assert (result.accepted, result.window_hits) == (1, 1)
    assert 0 < result.window_ttl_s <= 60
    with pytest.raises(RateLimited) as refused:
        store.ingest("fruit", [StoredReport(new_id(), 1, "banana")], rate_limit=limit, now=130.0)
    assert refused.value.retry_after_s >= 1
    # The next window is a fresh count.
    assert (
        store.ingest(
            "fruit", [StoredReport(new_id(), 1, "banana")], rate_limit=limit, now=185.0
        ).accepted
        == 1
    )
    assert store.counts("fruit") == {0: 1, 1: 1}

"""The one-call report path: spec pinned by hash, status and rate limit checked in the script."""

from __future__ import annotations

import pytest
import redis
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage.errors import CampaignFull, RateLimited, ReportBudgetExceeded, SpecChanged
from aggregator.storage.ingest import RateLimit, ReportBudget, StoredReport
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec

URL = "/api/v1/campaigns/fruit/reports"
KRR = CampaignSpec.from_dict(KRR_SPEC)


def n_reports(store: CampaignStore, campaign_id: str = "fruit") -> int:
    return store.get_campaign(campaign_id).n_reports


def round_trips(monkeypatch) -> list[list[bytes]]:
    """What each round trip to Redis from now on sends: the names of its commands."""
    sent: list[list[bytes]] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        chunks = [command] if isinstance(command, bytes | str) else command
        packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        # RESP arrays: each command is "*<n>\r\n$<len>\r\n<name>\r\n..."; take the names.
        parts = packed.split(b"\r\n")
        sent.append([parts[i + 2] for i, part in enumerate(parts[:-2]) if part.startswith(b"*")])
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


@pytest.mark.parametrize("limits", [False, True], ids=["no limits", "rate limit and budget"])
def test_one_round_trip_per_single_report(config, admin, krr_campaign, monkeypatch, limits):
    """A single report costs one round trip to Redis: its shard's script admits and stores it
    (the memory reading of the capacity guard, once a second, aside)."""
    settings = {"RATELIMIT_REPORTS": "600 per minute", "REPORT_BUDGET": "10000 per hour"}
    client = create_app({**config, "RATELIMIT_ENABLED": limits, **settings}).test_client()
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    sent = round_trips(monkeypatch)
    for _ in range(5):
        assert client.post(URL, json={"report_id": new_id(), "value": "banana"}).status_code == 200
    assert [trip for trip in sent if trip != [b"INFO"]] == [[b"EVALSHA"]] * 5


def test_rate_limit_per_client_and_campaign_with_headers(config, admin, store):
    # One shard: the whole limit is counted in one place (split over shards: below).
    client = create_app({**config, "RATELIMIT_REPORTS": "3 per minute", "SHARDS": 1})
    client = client.test_client()
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
    store = CampaignStore(store.connection, shards=1)
    store.create_campaign(KRR)
    report = [StoredReport(new_id(), 0, "apple")]
    with pytest.raises(SpecChanged):
        store.ingest("fruit", report, spec_hash="0" * 64)
    limit = RateLimit(amount=1, window_s=60, client="c1")
    result = store.ingest("fruit", report, spec_hash=KRR.spec_hash, rate_limit=limit, now=120.0)
    assert (result.accepted, result.window_remaining) == (1, 0)
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


# -- admission split over the shards ---------------------------------------------------------


def ids_in_shard(store: CampaignStore, shard: int, count: int) -> list[str]:
    """``count`` fresh report ids that the campaign "fruit" routes to ``shard``."""
    layout = store.layout("fruit")
    found: list[str] = []
    while len(found) < count:
        report_id = new_id()
        if layout.route(report_id).shard == shard:
            found.append(report_id)
    return found


def single(report_id: str) -> list[StoredReport]:
    return [StoredReport(report_id, 0, "apple")]


def test_each_shard_admits_its_share_of_the_rate_limit(store):
    """8 submissions a minute over 4 shards: each shard admits 2 from one client, and the
    headers' remaining extrapolates the shard's share left to the whole limit."""
    store = CampaignStore(store.connection, shards=4)
    store.create_campaign(KRR)
    limit = RateLimit(amount=8, window_s=60, client="c1")
    first, second, third = ids_in_shard(store, 0, 3)
    assert store.ingest("fruit", single(first), rate_limit=limit, now=60.0).window_remaining == 4
    assert store.ingest("fruit", single(second), rate_limit=limit, now=61.0).window_remaining == 0
    with pytest.raises(RateLimited):
        store.ingest("fruit", single(third), rate_limit=limit, now=62.0)
    # Another shard's share is untouched; another client has shares of its own.
    (elsewhere,) = ids_in_shard(store, 1, 1)
    assert store.ingest("fruit", single(elsewhere), rate_limit=limit, now=63.0).accepted == 1
    other = RateLimit(amount=8, window_s=60, client="c2")
    assert store.ingest("fruit", single(third), rate_limit=other, now=64.0).accepted == 1
    assert n_reports(store) == 4


def test_each_shard_holds_its_share_of_the_quota(store):
    store = CampaignStore(store.connection, shards=4, max_reports=8)
    store.create_campaign(KRR)
    in_zero = ids_in_shard(store, 0, 3)
    assert store.ingest("fruit", single(in_zero[0]) + single(in_zero[1])).accepted == 2
    with pytest.raises(CampaignFull):
        store.ingest("fruit", single(in_zero[2]))
    # A stored report sent again is a duplicate, not refused; other shards take their share.
    assert store.ingest("fruit", single(in_zero[0])).duplicates == 1
    assert store.ingest("fruit", single(ids_in_shard(store, 3, 1)[0])).accepted == 1
    assert store.get_campaign("fruit").shard_reports == (2, 0, 0, 1)


def test_a_batch_over_several_shards_is_refused_whole_and_counted_once(store):
    """A batch is checked on every shard it touches before any is written: one shard over its
    share of the budget refuses all of it. It counts as one submission, in the shard of its
    first report."""
    store = CampaignStore(store.connection, shards=4)
    store.create_campaign(KRR)
    limit = RateLimit(amount=8, window_s=60, client="c1")
    budget = ReportBudget(amount=8, window_s=3600, client="c1")
    in_zero, in_one = ids_in_shard(store, 0, 3), ids_in_shard(store, 1, 2)
    batch = [StoredReport(report_id, 1, "banana") for report_id in in_one + in_zero[:2]]
    stored = store.ingest("fruit", batch, rate_limit=limit, report_budget=budget, now=60.0)
    assert stored.accepted == 4 and stored.window_remaining == 4  # counted in shard 1 only
    # Shard 0 has 2 of its 2 new reports: a batch adding one there is refused whole.
    refused = [StoredReport(report_id, 2, "cherry") for report_id in ids_in_shard(store, 2, 1)]
    refused.append(StoredReport(in_zero[2], 2, "cherry"))
    with pytest.raises(ReportBudgetExceeded):
        store.ingest("fruit", refused, rate_limit=limit, report_budget=budget, now=61.0)
    assert store.get_campaign("fruit").shard_reports == (2, 2, 0, 0)
    # The same batch sent again costs nothing: all duplicates, within every share.
    again = store.ingest("fruit", batch, rate_limit=limit, report_budget=budget, now=62.0)
    assert (again.accepted, again.duplicates) == (0, 4)


@pytest.mark.parametrize("size", [1, 40], ids=["single report", "batch"])
def test_a_server_that_lost_its_scripts_still_stores(store, size):
    """A node that restarted or was promoted has no script loaded: the first call loads it
    (one report alone goes without a pipeline, a batch in one)."""
    store.create_campaign(KRR)
    store.connection.script_flush()
    reports = [StoredReport(new_id(), 0, "apple") for _ in range(size)]
    assert store.ingest("fruit", reports).accepted == size
    assert n_reports(store) == size

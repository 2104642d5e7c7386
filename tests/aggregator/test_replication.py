"""Reports acknowledged on fewer replicas than writes wait for: the writer says so, the count
is kept in Redis and per process, and ``/health`` and ``/metrics`` show the masters concerned.

The embedded Redis is a master with no replica: a writer that waits for one replica, or
fewer while the master has fewer (as a cluster's store does with ``LDP_ACK_REPLICAS``
unset), acknowledges on its word alone, as a replica promoted by a failover does.
"""

from __future__ import annotations

import logging

import pytest
import redis
from aggregator_testdata import (
    ADMIN_TOKEN,
    ANALYST_TOKEN,
    KRR_SPEC,
    PLANAR_SPEC,
    create_campaign,
    new_id,
    short_app_of,
)
from support.ports import free_port
from test_metrics import samples_of, scrape, value

from aggregator.storage.cluster import Call, NodeWriter, NotAcknowledged, node_name
from aggregator.storage.replication import ReplicaWatch, UnderReplicatedReports
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec

REPORTS = "/api/v1/campaigns/fruit/reports"
HEALTH = "/api/v1/health"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
METRICS_TOKEN = "metrics-scraper-token-0123456789abcdef"
# Stores a number under KEYS[1] and answers as ingest.lua does: {status, accepted, ...}.
SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return {0, tonumber(ARGV[1]), 0, 0, 0, 0}"


def calls(connection, *accepted: int) -> list[Call]:
    script = connection.register_script(SCRIPT)
    return [Call(script, [f"k{n}"], [count]) for n, count in enumerate(accepted)]


def test_a_master_without_replicas_acknowledges_and_the_writer_says_so(connection):
    heard = []
    writer = NodeWriter(
        connection,
        ack_replicas=1,
        only_present=True,
        on_under_replicated=lambda node, replies: heard.append((node, replies)),
    )
    replies = writer.run(calls(connection, 3, 0, 2))
    assert [reply[1] for reply in replies] == [3, 0, 2]
    assert connection.get("k2") == b"2"  # acknowledged and stored
    assert heard == [(node_name(connection), replies)]
    # Calls that write nothing are never waited for, nor reported.
    writer.run(calls(connection, 5), wait=False)
    assert len(heard) == 1


@pytest.mark.parametrize(
    ("ack_replicas", "only_present"),
    [(0, True), (0, False), (1, False)],
)
def test_a_writer_asked_for_no_replica_or_for_every_one_reports_nothing(
    connection, ack_replicas, only_present
):
    heard = []
    writer = NodeWriter(
        connection,
        ack_replicas=ack_replicas,
        only_present=only_present,
        ack_timeout_ms=20,
        on_under_replicated=lambda node, replies: heard.append(node),
    )
    if ack_replicas and not only_present:
        # Waited for whatever happens: not acknowledged, so not acknowledged short either.
        with pytest.raises(NotAcknowledged):
            writer.run(calls(connection, 1))
    else:
        writer.run(calls(connection, 1))
    assert heard == []


def test_the_count_is_kept_in_redis_for_every_process_and_passed_on(connection):
    heard = []
    counted = UnderReplicatedReports(connection, on_count=lambda *args: heard.append(args))
    other = UnderReplicatedReports(connection)  # another process
    counted.record("10.0.0.5:6379", 7)
    other.record("10.0.0.5:6379", 4)
    assert counted.total() == other.total() == 11
    assert connection.hget("ldp:metrics", "under_replicated_reports") == b"11"
    assert heard == [("10.0.0.5:6379", 7)]


def test_a_count_that_cannot_be_written_fails_nothing(caplog):
    down = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}")
    heard = []
    counted = UnderReplicatedReports(down, on_count=lambda *args: heard.append(args))
    with caplog.at_level(logging.WARNING, logger="aggregator.storage.replication"):
        counted.record("10.0.0.5:6379", 3)
    assert "3 reports acknowledged by 10.0.0.5:6379 on fewer replicas not counted" in caplog.text
    assert heard == [("10.0.0.5:6379", 3)]


def test_the_watch_names_the_master_its_slots_and_shards_and_reads_again_after_a_while(
    connection,
):
    store = CampaignStore(connection, ack_replicas=1, shards=4)
    store.create_campaign(CampaignSpec.from_dict(KRR_SPEC))
    UnderReplicatedReports(connection).record("x", 5)
    now = [100.0]
    watch = ReplicaWatch(store, check_interval_s=5.0, clock=lambda: now[0])
    reading = watch.reading()
    assert reading.wanted == 1
    (master,) = reading.masters
    assert (master.node, master.replicas, master.slots, master.shards) == (
        node_name(connection),
        0,
        16384,
        4,
    )
    assert reading.under_replicated == (master,)
    assert reading.reports == 5
    # Reused for check_interval_s, then read again.
    store.create_campaign(CampaignSpec.from_dict(PLANAR_SPEC))
    now[0] += 4.9
    assert watch.reading() is reading
    now[0] += 0.1
    assert watch.reading().masters[0].shards == 8


def test_a_store_that_waits_for_no_replica_has_no_master_short_of_them(connection):
    reading = ReplicaWatch(CampaignStore(connection)).reading()
    assert reading.wanted == 0
    assert reading.under_replicated == ()
    assert [(m.replicas, m.shards) for m in reading.masters] == [(0, None)]


def test_a_master_that_does_not_answer_is_left_out():
    down = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}")
    reading = ReplicaWatch(CampaignStore(down, ack_replicas=1)).reading()
    assert (reading.masters, reading.reports) == ((), None)


@pytest.fixture
def short_app(config):
    return short_app_of(config, METRICS_TOKEN=METRICS_TOKEN)


def post_reports(client, n: int) -> list[dict]:
    batch = [{"report_id": new_id(), "value": "apple"} for _ in range(n)]
    response = client.post(REPORTS, json={"reports": batch})
    assert response.status_code == 200, response.get_json()
    return batch


def test_health_shows_the_master_without_replicas_and_its_reports_to_a_token_only(
    short_app, redis_server
):
    client = short_app.test_client()
    create_campaign(client, ADMIN, KRR_SPEC)
    batch = post_reports(client, 5)
    assert client.post(REPORTS, json={"reports": batch}).get_json()["duplicates"] == 5

    anonymous = client.get(HEALTH).get_json()["replication"]
    assert anonymous == {
        "replicas_wanted": 1,
        "masters": 1,
        "under_replicated": {"masters": 1, "slots": 16384, "shards": 16},
    }
    socket_path = redis_server.url.removeprefix("unix://")
    assert socket_path not in client.get(HEALTH).get_data(as_text=True)
    assert client.get(HEALTH, headers=ANALYST).get_json()["replication"] == anonymous
    for token in (ADMIN_TOKEN, METRICS_TOKEN):
        detailed = client.get(HEALTH, headers={"Authorization": f"Bearer {token}"}).get_json()
        replication = detailed["replication"]
        assert replication["under_replicated"]["nodes"] == [
            {"node": socket_path, "replicas": 0, "slots": 16384, "shards": 16}
        ]
        # The new reports only: the duplicates stored nothing.
        assert replication["reports_under_replicated"] == 5
    wrong = client.get(HEALTH, headers={"Authorization": "Bearer not-a-token-0123456789abcdef"})
    assert wrong.status_code == 401


def test_health_counts_the_reports_of_every_worker(short_app, config):
    client = short_app.test_client()
    create_campaign(client, ADMIN, KRR_SPEC)
    post_reports(client, 3)
    other = short_app_of(config)  # another worker, or another server
    post_reports(other.test_client(), 2)
    detailed = other.test_client().get(HEALTH, headers=ADMIN).get_json()
    assert detailed["replication"]["reports_under_replicated"] == 5


def test_health_on_a_store_that_waits_for_no_replica(client):
    replication = client.get(HEALTH, headers=ADMIN).get_json()["replication"]
    assert replication["replicas_wanted"] == 0
    assert replication["under_replicated"] == {"masters": 0, "slots": 0, "shards": 0, "nodes": []}
    assert replication["reports_under_replicated"] == 0


def test_metrics_show_the_masters_replicas_and_count_this_process_s_reports(
    short_app, redis_server
):
    client = short_app.test_client()
    create_campaign(client, ADMIN, KRR_SPEC)
    post_reports(client, 4)
    samples = scrape(client)
    socket_path = redis_server.url.removeprefix("unix://")
    assert value(samples, "ldp_reports_under_replicated_total", node=socket_path) == 4
    assert value(samples, "ldp_redis_replicas", node=socket_path) == 0
    assert value(samples, "ldp_redis_replicas_wanted") == 1
    assert value(samples, "ldp_redis_under_replicated_masters") == 1
    assert value(samples, "ldp_redis_under_replicated_slots") == 16384
    assert value(samples, "ldp_redis_under_replicated_shards") == 16


def test_the_open_view_numbers_the_master_and_leaves_out_the_report_count(config, redis_server):
    client = short_app_of(config, METRICS_PUBLIC=True).test_client()
    create_campaign(client, ADMIN, KRR_SPEC)
    post_reports(client, 4)
    text = client.get("/metrics").get_data(as_text=True)
    assert redis_server.url.removeprefix("unix://") not in text
    samples = samples_of(text)
    assert not [name for name, _ in samples if name.startswith("ldp_reports_under_replicated")]
    assert value(samples, "ldp_redis_replicas", node="0") == 0
    assert value(samples, "ldp_redis_under_replicated_masters") == 1

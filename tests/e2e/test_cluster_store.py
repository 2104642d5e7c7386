"""The aggregator on a real Redis Cluster (3 masters, 3 replicas from scripts/redis_cluster.py).

Everything an analyst and a client do works against it with no setting but the URL;
one campaign's shards spread over every master; a retried batch is counted once;
a report acknowledged with WAIT survives the loss of its master.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from aggregator.app import create_app
from aggregator.services import EXTENSION
from aggregator.storage import keys
from aggregator.storage.cluster import is_cluster, open_connection
from aggregator.storage.estimate_cache import CacheBudget, EstimateCache, reserved_bytes
from tests.support import free_port_run

KRR_SPEC = {
    "id": "fruit",
    "title": "Favourite fruit",
    "mechanism": "krr",
    "epsilon": 1.5,
    "domain": ["apple", "banana", "cherry", "damson"],
}
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "redis_cluster.py"
ADMIN = {"Authorization": "Bearer " + "a" * 40}
ANALYST = {"Authorization": "Bearer " + "n" * 40}
REPORTS = "/api/v1/campaigns/fruit/reports"

pytestmark = pytest.mark.slow


def cluster(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    port = free_port_run(6)
    root = str(tmp_path_factory.mktemp("cluster"))
    try:
        cluster("start", "--dir", root, "--port", str(port))
        yield f"redis://127.0.0.1:{port}", Path(root)
    finally:
        cluster("stop", "--dir", root)


@pytest.fixture
def app(cluster_url):
    url, _ = cluster_url
    RedisCluster.from_url(url).flushall()
    return create_app(
        {
            "REDIS_URL": url,
            "ADMIN_TOKEN": ADMIN["Authorization"][7:],
            "ANALYST_TOKEN": ANALYST["Authorization"][7:],
            "REPORT_BUDGET": "100000 per hour",
        }
    )


def new_id() -> str:
    return str(uuid.uuid4())


def batch(n: int, ids: list[str] | None = None) -> dict:
    ids = ids or [new_id() for _ in range(n)]
    return {
        "reports": [{"report_id": i, "value": KRR_SPEC["domain"][k % 4]} for k, i in enumerate(ids)]
    }


def test_the_url_of_any_node_is_enough(cluster_url):
    url, _ = cluster_url
    connection = open_connection(url)
    assert is_cluster(connection)
    assert len(connection.get_primaries()) == 3


def test_everything_works_on_a_cluster_and_a_campaign_spreads_over_every_master(app, cluster_url):
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    ids = [new_id() for _ in range(2000)]
    for start in range(0, 2000, 500):
        response = client.post(REPORTS, json=batch(0, ids[start : start + 500]))
        assert response.status_code == 200, response.get_json()
        assert response.get_json()["accepted"] == 500
    # A retried batch (sent again, as to another process) is counted once.
    retried = client.post(REPORTS, json=batch(0, ids[:500])).get_json()
    assert (retried["accepted"], retried["duplicates"]) == (0, 500)
    counts = client.get("/api/v1/campaigns/fruit/counts", headers=ANALYST).get_json()
    assert counts["n"] == 2000
    estimate = client.get("/api/v1/campaigns/fruit/estimate", headers=ANALYST)
    assert estimate.status_code == 200
    assert client.get("/api/v1/campaigns/fruit").get_json()["status"] == "open"
    assert client.get("/api/v1/campaigns").status_code == 200
    # Dashboard sessions live in the cluster: another app (process) knows this one's session.
    dashboard = app.test_client()
    page = dashboard.get("/dashboard/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    form = {"csrf_token": csrf, "token": ANALYST["Authorization"][7:]}
    assert dashboard.post("/dashboard/login", data=form).status_code == 303
    cookie = dashboard.get_cookie("ldp_session")
    other = create_app(app.extensions["ldp_settings"]).test_client()
    other.set_cookie("ldp_session", cookie.value)
    assert other.get("/dashboard/campaigns/fruit").status_code == 200
    health = client.get("/api/v1/health").get_json()
    assert health["storage"]["accepting_reports"] is True

    url, _ = cluster_url
    connection = RedisCluster.from_url(url)
    keys = [key.decode() for key in connection.scan_iter(match="ldp:{c:fruit:*}:*")]
    by_master: dict[str, int] = {}
    for key in keys:
        node = connection.get_node_from_key(key)
        by_master[node.name] = by_master.get(node.name, 0) + 1
    assert len(by_master) == 3
    assert max(by_master.values()) / min(by_master.values()) < 3
    # The 16 shards are placed, not hashed: 6 / 5 / 5 over the three masters.
    layout = app.extensions[EXTENSION].get().layout("fruit")
    assert layout.placement_field
    shards_by_master = Counter(
        connection.get_node_from_key(layout.state_key(shard)).name for shard in range(16)
    )
    assert sorted(shards_by_master.values()) == [5, 5, 6]

    closed = client.patch("/api/v1/campaigns/fruit", json={"status": "closed"}, headers=ADMIN)
    assert closed.status_code == 200
    refused = client.post(REPORTS, json=batch(50))
    assert refused.status_code == 409


def test_the_estimate_cache_holds_its_caps_with_campaigns_on_every_master(cluster_url):
    """A campaign's entries and their sizes share its slot, the total has a slot of its own:
    eviction in a campaign and across campaigns works wherever they live."""
    url, _ = cluster_url
    connection = open_connection(url)
    connection.flushall()
    on_master: dict[str, str] = {}
    for n in range(100):
        ledger = keys.estimate_expiry(f"c{n}")
        on_master.setdefault(connection.get_node_from_key(ledger).name, f"c{n}")
    first, second, third = on_master.values()
    body = "x" * 100_000
    entry = reserved_bytes(keys.estimate(first, "a"), {"body": body})
    now = [time.time()]
    cache = EstimateCache(
        connection,
        budget=CacheBudget(total_bytes=int(2.5 * entry), campaign_bytes=int(1.5 * entry)),
        clock=lambda: now[0],
    )

    def put(campaign_id: str, variant: str) -> bool:
        now[0] += 1
        return cache.put(campaign_id, variant, "d" * 64, body, reports="seen")

    assert put(first, "a") and put(first, "b")  # its cap: "a" goes
    assert put(second, "a")
    assert put(third, "a")  # the total: the oldest of any campaign, first's "b", goes
    found = {
        (campaign_id, variant): cache.get(campaign_id, variant, reports="seen") is not None
        for campaign_id, variant in [(first, "a"), (first, "b"), (second, "a"), (third, "a")]
    }
    assert list(found.values()) == [False, False, True, True]
    assert cache.bytes_used() == cache.bytes_used(second) + cache.bytes_used(third)
    assert 0 < cache.bytes_used() <= int(2.5 * entry)
    assert connection.get_node_from_key(cache.key(third, "a")).name == list(on_master)[2]
    connection.close()


# Kills a master: the last test of the module.
def test_an_acknowledged_report_survives_the_loss_of_its_master(app, cluster_url):
    url, root = cluster_url
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    sent = [new_id() for _ in range(400)]
    assert client.post(REPORTS, json=batch(0, sent)).get_json()["accepted"] == 400
    connection = RedisCluster.from_url(url)
    # Shard 0's master, wherever the campaign's placement put the shard.
    store = app.extensions[EXTENSION].get()
    layout = store.layout("fruit")
    victim = connection.get_node_from_key(layout.state_key(0))
    victim_slots = sum(
        1 for nodes in connection.nodes_manager.slots_cache.values() if nodes[0].name == victim.name
    )
    pid = int((root / f"node-{victim.port}" / "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    # Reports keep coming; those refused while the replica takes over are sent again.
    more = [new_id() for _ in range(200)]
    deadline = time.monotonic() + 30
    pending = list(more)
    while pending and time.monotonic() < deadline:
        response = client.post(REPORTS, json=batch(0, pending[:50]))
        if response.status_code == 200:
            pending = pending[50:]
        else:
            assert response.status_code == 503, response.get_json()
            time.sleep(0.5)
    assert not pending, "the cluster did not recover within 30 s"
    counts = client.get("/api/v1/campaigns/fruit/counts", headers=ANALYST).get_json()
    assert counts["n"] == 600
    again = client.post(REPORTS, json=batch(0, sent)).get_json()
    assert again["duplicates"] == 400

    # The promoted replica has no replica of its own (the killed node stays down): with
    # LDP_ACK_REPLICAS unset it acknowledged the reports of its shards on its copy alone,
    # and /health and /metrics say so.
    promoted = store.connection.get_node_from_key(layout.state_key(0)).name
    shards = {
        shard
        for shard in range(layout.shards)
        if store.connection.get_node_from_key(layout.state_key(shard)).name == promoted
    }
    alone = sum(1 for report_id in more if layout.route(report_id).shard in shards)
    assert alone > 0
    replication = client.get("/api/v1/health", headers=ADMIN).get_json()["replication"]
    assert replication["replicas_wanted"] == 1
    assert replication["under_replicated"] == {
        "masters": 1,
        "slots": victim_slots,
        "shards": len(shards),
        "nodes": [{"node": promoted, "replicas": 0, "slots": victim_slots, "shards": len(shards)}],
    }
    assert replication["reports_under_replicated"] == alone
    scraped = client.get("/metrics", headers=ADMIN).get_data(as_text=True)
    assert f'ldp_reports_under_replicated_total{{node="{promoted}"}} {float(alone)}' in scraped
    assert "ldp_redis_under_replicated_masters 1.0" in scraped

"""``/metrics`` of a real ``serve``: the counts of every gunicorn worker, summed; and the
Redis gauges read from every node of a real Redis Cluster.

Each request goes on a connection of its own, so gunicorn's workers share them;
whichever worker answers a scrape, it must show them all, also after a worker
was killed and replaced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from redis.cluster import RedisCluster
from support import free_port_run, running_server

from aggregator.http.metrics import RedisNodeCollector

ADMIN_TOKEN = "e2e-metrics-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SPEC = {"id": "tally", "title": "Tally", "mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b"]}
SUBMISSIONS = 40
MAX_SUBMISSIONS = 1000
WORKERS = 2
CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "redis_cluster.py"
MASTERS = 3


def accepted_reports(url: str) -> float:
    """``ldp_reports_accepted_total`` of the campaign, from one scrape on a new connection."""
    response = requests.get(f"{url}/metrics", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    text = response.text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ldp_reports_accepted_total" and sample.labels == {
                "campaign": "tally"
            }:
                return sample.value
    return 0.0


def test_a_scrape_sums_the_counts_of_every_worker_even_a_dead_one(tmp_path):
    metrics_root = tmp_path / "tmp"
    metrics_root.mkdir()
    env = {"LDP_ADMIN_TOKEN": ADMIN_TOKEN, "TMPDIR": str(metrics_root)}
    with running_server(tmp_path / "data", env=env, workers=WORKERS) as server:
        created = requests.post(
            f"{server.api}/campaigns",
            json=SPEC,
            headers=ADMIN,
            timeout=10,
        )
        assert created.status_code == 201
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401
        (metrics_dir,) = metrics_root.glob("ldp-metrics-*")
        submitted = 0
        # Until both workers have counted some (which worker accepts a connection is the
        # kernel's choice), and at least SUBMISSIONS.
        while submitted < SUBMISSIONS or len(list(metrics_dir.glob("counter_*.db"))) < WORKERS:
            assert submitted < MAX_SUBMISSIONS, "one worker took every connection"
            report = {"report_id": str(uuid.uuid4()), "value": "ab"[submitted % 2]}
            answer = requests.post(f"{server.api}/campaigns/tally/reports", json=report, timeout=10)
            assert answer.json()["accepted"] == 1
            submitted += 1
        counting = {path.name for path in metrics_dir.glob("counter_*.db")}
        assert counting == {f"counter_{pid}.db" for pid in server.workers()}
        assert [accepted_reports(server.url) for _ in range(6)] == [submitted] * 6

        victim = server.workers()[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim in server.workers() or len(server.workers()) < WORKERS:
            assert time.monotonic() < deadline, "gunicorn did not replace the killed worker"
            time.sleep(0.1)
        assert [accepted_reports(server.url) for _ in range(6)] == [submitted] * 6
    assert not metrics_dir.exists(), "the server removes its metrics directory when it stops"


def node_states(collector: RedisNodeCollector) -> dict[str, dict[str, float]]:
    """{metric name: {node: value}} of one collection."""
    states: dict[str, dict[str, float]] = {}
    for family in collector.collect():
        for sample in family.samples:
            states.setdefault(sample.name, {})[sample.labels["node"]] = sample.value
    return states


def cluster_script(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.slow  # forming the cluster takes about 14 s alone
def test_every_node_of_a_cluster_is_read_and_a_killed_one_shows_down(tmp_path):
    port = free_port_run(MASTERS)
    root = tmp_path / "cluster"
    nodes = [f"127.0.0.1:{node_port}" for node_port in range(port, port + MASTERS)]
    cluster_script("start", "--dir", str(root), "--port", str(port), "--replicas", "0")
    try:
        collector = RedisNodeCollector(RedisCluster(host="127.0.0.1", port=port), 0.9)
        states = node_states(collector)
        assert states["ldp_redis_up"] == dict.fromkeys(nodes, 1)
        assert set(states["ldp_redis_memory_used_bytes"]) == set(nodes)
        assert min(states["ldp_redis_memory_used_bytes"].values()) > 0

        pid = int((root / f"node-{port + 2}" / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        states = node_states(collector)
        assert states["ldp_redis_up"] == {**dict.fromkeys(nodes, 1), nodes[2]: 0}
        assert nodes[2] not in states["ldp_redis_memory_used_bytes"]
    finally:
        cluster_script("stop", "--dir", str(root))

"""scripts/redis_cluster.py forms a real Redis Cluster (3 masters, 3 replicas) and stops it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from support import free_port_run

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "redis_cluster.py"
NODES = 6


def cluster(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


@pytest.mark.slow
def test_the_script_forms_a_cluster_whose_keys_spread_over_three_masters(tmp_path):
    port = free_port_run(NODES)
    root = str(tmp_path / "cluster")
    try:
        started = cluster("start", "--dir", root, "--port", str(port))
        assert f"LDP_REDIS_URL=redis://127.0.0.1:{port}" in started
        client = RedisCluster(host="127.0.0.1", port=port)
        for i in range(300):
            client.set(f"key:{i}", i)
        primaries = client.get_primaries()
        assert len(primaries) == 3
        held = [client.get_redis_connection(node).dbsize() for node in primaries]
        assert sum(held) == 300 and min(held) > 50
        roles = cluster("status", "--dir", root).split()
        assert roles.count("master") == 3 and roles.count("slave") == 3
    finally:
        stopped = cluster("stop", "--dir", root)
    assert f"stopped {NODES} nodes" in stopped

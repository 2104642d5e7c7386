"""The embedded Redis: durable settings, reuse of a running server, survival of a crash."""

from __future__ import annotations

import os
import signal
import stat

import pytest
import redis
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.storage.ingest import StoredReport
from aggregator.storage.redis_server import EmbeddedRedis
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec


def test_server_runs_with_append_only_file(tmp_path):
    with EmbeddedRedis(tmp_path, appendfsync="always") as server:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("dir")["dir"] == str(tmp_path.resolve())
        client.close()
    assert not server.is_running()


def test_a_second_handle_reuses_the_running_server_and_leaves_it_running(tmp_path):
    with EmbeddedRedis(tmp_path) as owner:
        pid = owner.pid
        other = EmbeddedRedis(tmp_path)
        assert other.start() == owner.url
        assert other.process is None
        other.stop()
        assert owner.is_running()
        assert owner.pid == pid


def test_bad_fsync_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(tmp_path, appendfsync="sometimes")


def test_acknowledged_reports_survive_a_redis_crash(tmp_path):
    """SIGKILL right after the acknowledgement, restart on the same directory: nothing lost."""
    spec = CampaignSpec.from_dict(KRR_SPEC)
    server = EmbeddedRedis(tmp_path)
    store = CampaignStore(redis.Redis.from_url(server.start()))
    store.create_campaign(spec)
    sent = [StoredReport(new_id(), i % 4, spec.domain[i % 4]) for i in range(300)]
    for start in range(0, 300, 50):
        assert store.ingest(spec.id, sent[start : start + 50]).accepted == 50
    pid = server.pid
    os.kill(pid, signal.SIGKILL)
    assert server.process.wait(timeout=10) == -signal.SIGKILL
    store.connection.close()

    restarted = EmbeddedRedis(tmp_path)
    try:
        store = CampaignStore(redis.Redis.from_url(restarted.start()))
        assert restarted.pid != pid
        assert store.get_campaign(spec.id).n_reports == 300
        assert store.counts(spec.id) == {y: 75 for y in range(4)}
        # The dedupe keys survived too: a retry after the crash is still a duplicate.
        assert store.ingest(spec.id, sent[:10]).duplicates == 10
        store.connection.close()
    finally:
        restarted.stop()


def test_data_directory_and_files_are_private(tmp_path):
    data_dir = tmp_path / "data"
    with EmbeddedRedis(data_dir) as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        client.close()
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        for name in ("appendonly.aof", "redis.conf", "redis.log"):
            assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
    # A directory left open by an earlier version is tightened on the next start.
    data_dir.chmod(0o755)
    (data_dir / "appendonly.aof").chmod(0o644)
    with EmbeddedRedis(data_dir):
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((data_dir / "appendonly.aof").stat().st_mode) == 0o600

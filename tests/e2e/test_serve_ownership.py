"""One ``serve`` per data directory, and no redis-server outliving its owner.

Real processes: ``ldp-aggregator serve`` killed with SIGKILL takes its
embedded Redis with it; a Redis orphaned by another dead owner is shut down
and replaced by the next ``serve`` with every stored report intact; a second
``serve`` on a directory in use is refused with the first one's pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis
import requests
from support import free_port, running_server, server_env

from aggregator.storage.redis_server import EmbeddedRedis

ADMIN_TOKEN = "ownership-admin-token-0123456789abcdef"
SPEC = {"id": "own", "title": "Ownership", "mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b"]}


def _env(data_dir: Path, **settings: str) -> dict[str, str]:
    return server_env(data_dir, {"LDP_ADMIN_TOKEN": ADMIN_TOKEN, **settings})


def _serve(data_dir: Path, log: Path):
    """One ``serve`` with a single worker on ``data_dir``, as a context manager."""
    return running_server(
        data_dir, env={"LDP_ADMIN_TOKEN": ADMIN_TOKEN}, workers=1, log_path=log, startup_s=30
    )


def _redis_pid(data_dir: Path) -> int:
    client = redis.Redis(unix_socket_path=str(data_dir / "redis.sock"), socket_timeout=2)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
            return True  # a zombie: exited, waiting for its (new) parent to reap it
        time.sleep(0.05)
    return False


def _send(url: str, n: int) -> int:
    reports = [{"report_id": str(uuid.uuid4()), "value": "ab"[i % 2]} for i in range(n)]
    response = requests.post(f"{url}/campaigns/own/reports", json={"reports": reports}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["accepted"]


def _n_reports(url: str) -> int:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    response = requests.get(f"{url}/campaigns/own/counts", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["n"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")
def test_kill_9_of_serve_takes_its_redis_along_and_the_next_serve_has_every_report(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "serve.log"
    with _serve(data_dir, log) as first:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert requests.post(f"{first.api}/campaigns", json=SPEC, headers=headers, timeout=10).ok
        accepted = _send(first.api, 200)
        redis_pid = _redis_pid(data_dir)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        assert _gone(redis_pid, within_s=10), "the embedded redis-server outlived serve"
    with _serve(data_dir, log) as second:
        assert _redis_pid(data_dir) != redis_pid
        assert _n_reports(second.api) == accepted == 200
    assert not EmbeddedRedis(data_dir).is_running()


def test_a_redis_left_by_a_dead_owner_is_shut_down_and_its_data_kept(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "serve.log"
    # An owner that starts the embedded Redis without tying it to its own life, stores
    # reports, then dies by SIGKILL: its redis-server is left running (an orphan).
    owner_script = textwrap.dedent(
        f"""
        import sys, time, uuid
        import redis
        from aggregator.storage.redis_server import EmbeddedRedis
        from aggregator.storage.store import CampaignStore
        from aggregator.storage.ingest import StoredReport
        from shared.spec import CampaignSpec
        spec = CampaignSpec.from_dict({SPEC!r})
        store = CampaignStore(redis.Redis.from_url(EmbeddedRedis({str(data_dir)!r}).start()))
        store.create_campaign(spec)
        reports = [StoredReport(str(uuid.uuid4()), i % 2, "ab"[i % 2]) for i in range(300)]
        print(store.ingest(spec.id, reports).accepted, flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_script],
        env=_env(data_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout.readline().strip() == "300"
        orphan_pid = _redis_pid(data_dir)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert EmbeddedRedis(data_dir).is_running()  # the orphan

    with _serve(data_dir, log) as serve:
        assert _gone(orphan_pid, within_s=10)
        assert _redis_pid(data_dir) != orphan_pid
        assert _n_reports(serve.api) == 300
        text = log.read_text()
        assert "left running" in text and str(orphan_pid) in text


def test_a_second_serve_on_the_same_data_directory_is_refused(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "serve.log"
    with _serve(data_dir, log) as first:
        second = subprocess.run(
            [sys.executable, "-m", "aggregator.cli", "serve", "--port", str(free_port())],
            cwd=tmp_path,
            env=_env(data_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"pid {first.process.pid}" in second.stderr
        assert str(data_dir) in second.stderr
        # The first server is unharmed, and keeps its gunicorn control socket to itself.
        assert requests.get(f"{first.api}/health", timeout=5).status_code == 200
        assert (data_dir / "gunicorn.ctl").exists()
    assert not EmbeddedRedis(data_dir).is_running()


def test_serve_refuses_a_weak_token_before_starting_anything(tmp_path):
    data_dir = tmp_path / "data"
    env = _env(data_dir, LDP_ADMIN_TOKEN="change-me")
    result = subprocess.run(
        [sys.executable, "-m", "aggregator.cli", "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2  # a bad setting, like a bad option
    assert "LDP_ADMIN_TOKEN" in result.stderr and "change-me" not in result.stderr
    assert not data_dir.exists()

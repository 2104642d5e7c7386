"""The tests' server helper (``support.running_server``): start, answer, stop, and say why not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from support import free_port, running_server, server_env

from aggregator.storage.redis_server import EmbeddedRedis

ADMIN_TOKEN = "helper-admin-token-0123456789abcdefghij"
# Seconds a worker takes at most to build its app once it answers or is forked.
BOOTED_S = 5


def test_the_environment_is_this_process_without_its_ldp_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LDP_REDIS_URL", "redis://127.0.0.1:9")
    monkeypatch.setenv("LDP_ANALYST_TOKEN", "inherited")
    monkeypatch.setenv("HOME_FOR_THE_TEST", "kept")
    env = server_env(tmp_path, {"LDP_ADMIN_TOKEN": ADMIN_TOKEN, "HOME_FOR_THE_TEST": None})
    assert env["LDP_DATA_DIR"] == str(tmp_path) and env["LDP_ADMIN_TOKEN"] == ADMIN_TOKEN
    assert "LDP_REDIS_URL" not in env and "LDP_ANALYST_TOKEN" not in env
    assert "HOME_FOR_THE_TEST" not in env


def test_the_server_answers_in_the_block_and_is_stopped_after_it(tmp_path, capsys):
    data_dir = tmp_path / "data"
    settings = {"LDP_ADMIN_TOKEN": ADMIN_TOKEN}
    with (
        pytest.raises(LookupError),
        running_server(data_dir, env=settings, workers=1) as server,
    ):
        assert requests.get(f"{server.api}/health", timeout=5).status_code == 200
        assert len(server.workers()) == 1
        assert EmbeddedRedis(data_dir).is_running()
        raise LookupError("a failing test")
    assert server.process.returncode == 0  # SIGTERM: a clean shutdown
    assert not EmbeddedRedis(data_dir).is_running()
    assert f"--- server log ({server.log_path}) ---" in capsys.readouterr().err


def test_a_server_that_cannot_start_is_an_error_with_its_log(tmp_path):
    with (
        pytest.raises(RuntimeError) as failure,
        running_server(tmp_path / "data", env={"LDP_ADMIN_TOKEN": "change-me"}),
    ):
        pytest.fail("the block ran")
    message = str(failure.value)
    assert "the server exited with status 2" in message  # a bad setting
    assert "LDP_ADMIN_TOKEN" in message  # the server's own explanation, from its log


def test_ctrl_c_stops_the_server_without_a_traceback(tmp_path):
    """Ctrl-C sends SIGINT to the terminal's whole process group, the workers included: each
    gevent worker logged a ``SystemExit: 0`` traceback as it stopped."""
    port = free_port()
    log_path = tmp_path / "server.log"
    env = server_env(tmp_path / "data", {"LDP_ADMIN_TOKEN": ADMIN_TOKEN})
    with open(log_path, "wb") as log:
        # A session of its own, so that the group's SIGINT reaches this server alone.
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "aggregator.cli", "serve"),
                *("--host", "127.0.0.1", "--port", str(port), "--workers", "2"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while log_path.read_text().count("Booting worker") < 2 or not _answers(port):
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        # A worker still booting ends at once on SIGINT (wsgi._stop_while_booting), which
        # is not the path under test: give both time to have built their app.
        time.sleep(BOOTED_S)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    log = log_path.read_text()
    assert "Handling signal: int" in log
    assert log.count("Worker exiting") == 2  # both had booted: each stopped as it does
    assert "Traceback" not in log and "SystemExit" not in log, log
    assert not EmbeddedRedis(tmp_path / "data").is_running()


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).ok
    except requests.RequestException:
        return False

"""The tests' server helper (``support.running_server``): start, answer, stop, and say why not."""

from __future__ import annotations

import pytest
import requests
from support import running_server, server_env

from aggregator.storage.redis_server import EmbeddedRedis

ADMIN_TOKEN = "helper-admin-token-0123456789abcdefghij"


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
    assert "the server exited with status 1" in message
    assert "LDP_ADMIN_TOKEN" in message  # the server's own explanation, from its log

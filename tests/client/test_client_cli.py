"""The ldp-client command line without a server: usage, errors, status, forget's warning."""

from __future__ import annotations

import json
import re
import socket

import pytest
from click.testing import CliRunner
from client_fakes import SERVER, FakeAggregator

from client.cli import cli
from client.reporter import Reporter


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.delenv("LDP_SERVER_URL", raising=False)
    monkeypatch.setenv("LDP_CLIENT_HOME", str(tmp_path / "state"))

    def invoke(*args: str, input: str | None = None):
        return CliRunner().invoke(cli, list(args), input=input)

    return invoke


def dead_server() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "fruit"], "give VALUE"),
        (["report", "where", "--lat", "48.1"], "--lat and --lon go together"),
        (["report", "where", "x", "--lat", "1", "--lon", "2"], "not both"),
        (["--budget", "0", "status"], "0"),
        (["--max-epsilon", "nan", "status"], "nan"),
    ],
)
def test_usage_errors_exit_2(run, args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output


def test_version_and_short_help_on_every_command(run):
    version = run("--version")
    assert version.exit_code == 0
    assert version.output.startswith("ldp-client, version ")
    for command in [[], *([name] for name in cli.commands)]:
        result = run(*command, "-h")
        assert result.exit_code == 0, (command, result.output)
        assert result.stdout.startswith(f"Usage: cli {' '.join(command)}".rstrip())


def test_report_without_a_server_is_an_error(run):
    result = run("report", "fruit", "apple")
    assert result.exit_code == 1
    assert "Error: no server: give --server or set LDP_SERVER_URL" in result.output


def test_an_unreachable_server_is_a_clear_error_and_json_error(run, tmp_path):
    result = run("--server", dead_server(), "report", "fruit", "apple", "--json")
    assert result.exit_code == 1
    first_line = result.output.splitlines()[0]
    error = json.loads(first_line)["error"]
    assert error["code"] == "server_unavailable"
    assert "nothing was spent or sent" in error["message"]
    assert "Error: cannot reach the server" in result.output
    assert not (tmp_path / "state" / "state.json").exists()


def test_status_of_a_fresh_device(run):
    result = run("status")
    assert result.exit_code == 0, result.output
    assert "Budget: spent 0 of 10 (10 left)" in result.output
    as_json = json.loads(run("--budget", "3", "status", "--json").output)
    assert as_json["budget"] == {"total": 3.0, "spent": 0.0, "left": 3.0, "forgotten": 0.0}
    assert as_json["queue"]["pending"] == 0


def test_forget_warns_and_asks(run):
    result = run("--server", "http://127.0.0.1:1", "forget", "fruit", input="n\n")
    assert result.exit_code == 1
    assert "weakens your longitudinal protection" in result.output
    assert "Aborted" in result.output
    result = run("--server", "http://127.0.0.1:1", "forget", "fruit", "--yes")
    assert result.exit_code == 1
    assert "weakens your longitudinal protection" in result.output
    assert "Error: campaign 'fruit' on http://127.0.0.1:1 is not in the state" in result.output


def test_a_bad_server_url_is_an_error(run):
    result = run("--server", "ftp://x", "report", "fruit", "apple")
    assert result.exit_code == 1
    assert "Error: the server URL must be http:// or https://" in result.output


def test_flush_with_an_empty_queue(run):
    result = run("flush")
    assert result.exit_code == 0
    assert "Sent 0 new, 0 already received; 0 still waiting." in result.output


class _FakeUnderAPrefix(FakeAggregator):
    """The fake aggregator served under one extra path segment."""

    def send(self, request, **kwargs):
        request.url = re.sub(r"^(http://[^/]+)/[^/]+", r"\1", request.url)
        return super().send(request, **kwargs)


def test_status_prints_the_server_with_control_characters_escaped(run, fake, tmp_path):
    prefixed = _FakeUnderAPrefix()
    prefixed.specs, prefixed.status, prefixed.received = fake.specs, fake.status, fake.received
    server = f"{SERVER}/\x1b]0;owned\x07"
    with Reporter(server, state_dir=str(tmp_path / "state"), session=prefixed.session()) as device:
        device.report("fruit", "apple")
    result = run("status")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert f"fruit @ {SERVER}/\\x1b]0;owned\\x07: krr" in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["report", "fruit", "apple"],
        ["status"],
        ["flush"],
        ["enroll", "fruit", "a-token-of-16-chars"],
        ["forget", "fruit", "--yes"],
    ],
)
def test_every_command_reports_a_library_error_the_same_way(run, tmp_path, command):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "state.json").write_text("{not json")
    server = ["--server", dead_server()]
    result = run(*server, *command)
    assert result.exit_code == 1, result.output
    assert "Error: " in result.output and "state.json is damaged" in result.output
    assert "Traceback" not in result.output
    as_json = run(*server, *command, "--json")
    assert as_json.exit_code == 1
    error = json.loads(as_json.stdout.splitlines()[0])["error"]
    assert error["code"] == "state_error" and "is damaged" in error["message"]
    assert error["field"] is None

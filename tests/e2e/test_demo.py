"""The README's first command: the demo fills its campaigns through the real client and says where to look."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import click
import pytest
import requests
from click.testing import CliRunner
from support import free_port

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOKEN = "demo-analyst-token-0123456789abcdefghij"


def load_demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


class _Running:
    """A server process that has not exited."""

    def poll(self):
        return None


class _SlowToBoot(BaseHTTPRequestHandler):
    """Accepts at once, like gunicorn's arbiter, but answers only once "the workers" boot."""

    booted_at = 0.0

    def do_GET(self):
        time.sleep(max(self.booted_at - time.monotonic(), 0) + 0.01)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the client gave up on a request (its timeout): expected here


@pytest.fixture
def slow_server():
    _SlowToBoot.booted_at = time.monotonic() + 2.5  # longer than one request's 1 s timeout
    server = _QuietServer(("127.0.0.1", 0), _SlowToBoot)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_start_up_waits_through_read_timeouts(slow_server):
    demo = load_demo()
    demo._wait_until_up(_Running(), slow_server, seconds=20)
    assert time.monotonic() >= _SlowToBoot.booted_at


def test_a_server_that_never_answers_is_a_clear_error(slow_server):
    demo = load_demo()
    with pytest.raises(click.ClickException, match=r"did not answer .* within 1\.5 s"):
        demo._wait_until_up(_Running(), slow_server, seconds=1.5)


def test_demo_options_with_short_help():
    result = CliRunner().invoke(load_demo().main, ["-h"])
    assert result.exit_code == 0
    assert "--exit-after-setup" in result.stdout


def test_demo_fills_campaigns_and_prints_the_dashboard(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LDP_ANALYST_TOKEN": DEMO_TOKEN}
    env.pop("LDP_REDIS_URL", None)
    result = subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "demo.py"), "--port", str(port)),
            *("--data-dir", str(tmp_path / "data"), "--users", "40", "--exit-after-setup"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"Dashboard:      http://127.0.0.1:{port}/dashboard/" in out
    assert f"Analyst token:  {DEMO_TOKEN}" in out
    delivered = dict(re.findall(r"^([a-z-]+): (\d+) reports delivered", out, flags=re.M))
    assert delivered == {"commute-mode": "40", "flu-shot": "40", "sf-downtown": "80"}
    # The server is gone once the demo returns.
    try:
        requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1)
        raise AssertionError("the demo left its server running")
    except requests.ConnectionError:
        pass


def test_the_demo_refuses_a_port_already_in_use(tmp_path):
    # Before, another server's health check passed for the demo's own, which then failed on
    # its first request with that server's tokens (401).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            load_demo().main, ["--port", str(port), "--data-dir", str(tmp_path / "data")]
        )
    assert result.exit_code == 1
    assert f"127.0.0.1:{port} is already in use" in result.output

"""The README's first command: the demo fills its campaigns through the real client and says where to look.

It says which data each campaign's users come from, keeps the reports of an earlier run and
says so (``--fresh`` starts afresh), answers ``--help`` at once, before anything is
installed, and ends quietly on Ctrl-C.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from support import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOKEN = "demo-analyst-token-0123456789abcdefghij"
# --help answers within this many seconds (installing first took 85 s).
HELP_SECONDS = 5
# How long the demo may take to stop after Ctrl-C.
STOP_SECONDS = 60
DELIVERED = re.compile(r"^([a-z-]+): (\d+) reports delivered", flags=re.M)


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
    with pytest.raises(demo.DemoError, match=r"did not answer .* within 1\.5 s"):
        demo._wait_until_up(_Running(), slow_server, seconds=1.5)


def test_demo_options_with_short_help(capsys):
    with pytest.raises(SystemExit) as exited:
        load_demo().main(["-h"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--exit-after-setup" in out and "--fresh" in out


def test_help_answers_at_once_before_installing_and_names_the_script(tmp_path):
    """``bash scripts/demo.sh --help`` installed first (85 s of silence) and named demo.py."""
    scripts = tmp_path / "clone" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("demo.sh", "demo.py"):
        shutil.copy(ROOT / "scripts" / name, scripts / name)
    env = {key: value for key, value in os.environ.items() if key != "DEMO_COMMAND"}
    for flag in ("--help", "-h"):
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "clone/scripts/demo.sh", flag],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
        assert result.returncode == 0, result.stdout + result.stderr
        assert took < HELP_SECONDS, f"--help took {took:.1f} s"
        assert result.stdout.startswith("usage: bash clone/scripts/demo.sh "), result.stdout
        assert "demo.py" not in result.stdout
        assert "--fresh" in result.stdout and "Gowalla" in result.stdout
        assert not (tmp_path / "clone" / ".venv").exists()  # nothing was installed


def run_demo(data_dir: Path, port: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LDP_ANALYST_TOKEN": DEMO_TOKEN}
    env.pop("LDP_REDIS_URL", None)
    return subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "demo.py"), "--port", str(port)),
            *("--data-dir", str(data_dir), "--users", "40", "--exit-after-setup", *args),
        ],
        cwd=data_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_stopped(port: int) -> None:
    try:
        requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1)
        raise AssertionError("the demo left its server running")
    except requests.ConnectionError:
        pass


def test_demo_fills_campaigns_says_whose_data_and_prints_the_dashboard(tmp_path):
    port = free_port()
    data_dir = tmp_path / "data"
    result = run_demo(data_dir, port)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"Dashboard:      http://127.0.0.1:{port}/dashboard/" in out
    assert f"Analyst token:  {DEMO_TOKEN}" in out
    delivered = dict(DELIVERED.findall(out))
    assert delivered == {"commute-mode": "40", "flu-shot": "40", "sf-downtown": "80"}
    # Where each campaign's users come from; the map's, from the check-ins when present.
    assert "commute-mode: 40 simulated users today whose answers follow Zipf's law" in out
    # The commute campaign shows time: 13 earlier days of 40 reports, and what drifted.
    assert "commute-mode: 520 reports of the 13 days before today (40 a day) stored" in out
    assert "the share who bike rising from 8% by 2 points a day" in out
    assert "commute-mode shows time: the share who bike rose by 2 points a day" in out
    assert "flu-shot: 40 simulated users, 65% of them vaccinated" in out
    gowalla = load_demo().GOWALLA
    if gowalla.is_file():
        assert "sf-downtown: 80 simulated users placed at the Gowalla check-ins in" in out
    else:
        assert "sf-downtown: 80 simulated users placed in a synthetic city" in out
        assert f"there are no Gowalla check-ins at {gowalla}" in out
    assert_stopped(port)

    # A second run keeps the first one's reports, and says so and how to start afresh.
    again = run_demo(data_dir, port)
    assert again.returncode == 0, again.stdout + again.stderr
    assert DELIVERED.findall(again.stdout) == []
    kept = {**delivered, "commute-mode": "560"}  # 14 days of 40
    for campaign_id, n in kept.items():
        assert (
            f"{campaign_id}: kept the {n} reports of an earlier run in {data_dir}; none added "
            "(python scripts/demo.py --fresh starts afresh)."
        ) in again.stdout
    # --fresh does.
    fresh = run_demo(data_dir, port, "--fresh")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert f"Starting afresh: deleted the earlier demo data in {data_dir}." in fresh.stdout
    assert dict(DELIVERED.findall(fresh.stdout)) == delivered
    assert_stopped(port)


def test_fresh_refuses_a_data_directory_with_other_campaigns(tmp_path):
    data_dir = tmp_path / "data"
    env = {"LDP_ADMIN_TOKEN": "fresh-admin-token-0123456789abcdefghij"}
    with running_server(data_dir, env=env, workers=1) as server:
        created = requests.post(
            f"{server.api}/campaigns",
            json={"id": "pets", "title": "Pets", "mechanism": "rr", "epsilon": 1.0},
            headers={"Authorization": f"Bearer {env['LDP_ADMIN_TOKEN']}"},
            timeout=10,
        )
        assert created.status_code == 201
    result = run_demo(data_dir, free_port(), "--fresh")
    assert result.returncode == 1
    assert "--fresh would delete" in result.stderr and "(pets)" in result.stderr
    assert (data_dir / "appendonly.aof").exists()  # the store is still there


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_the_demo_quietly(tmp_path):
    """Ctrl-C reaches the demo and every process of its server: no traceback anywhere (each
    gevent worker logged ``SystemExit: 0`` with one)."""
    port = free_port()
    data_dir = tmp_path / "data"
    out_path = tmp_path / "demo.out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LDP_ANALYST_TOKEN": DEMO_TOKEN}
    env.pop("LDP_REDIS_URL", None)
    with open(out_path, "wb") as out:
        # A session of its own: the signal goes to its whole process group, as a terminal's.
        demo = subprocess.Popen(
            [
                *(sys.executable, str(ROOT / "scripts" / "demo.py"), "--port", str(port)),
                *("--data-dir", str(data_dir), "--users", "10"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # As a terminal's foreground job has it: a SIGINT ignored by the test's own process
            # (inherited from how the suite was started) must not make the demo deaf to Ctrl-C.
            preexec_fn=_default_sigint,
        )
    try:
        deadline = time.monotonic() + 300
        while b"Serving until Ctrl-C." not in out_path.read_bytes():
            assert demo.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.2)
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(timeout=STOP_SECONDS) == 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    output = out_path.read_text()
    log = (data_dir / "server.log").read_text()
    assert "Handling signal: int" in log  # the server had the Ctrl-C
    assert "Traceback" not in log and "SystemExit" not in log, log[-3000:]
    assert "Traceback" not in output, output
    assert output.rstrip().endswith("Stopping the aggregator.")
    assert_stopped(port)


def test_the_demo_refuses_a_port_already_in_use(tmp_path, capsys):
    # Before, another server's health check passed for the demo's own, which then failed on
    # its first request with that server's tokens (401).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exited:
            load_demo().main(["--port", str(port), "--data-dir", str(tmp_path / "data")])
    assert exited.value.code == 1
    assert f"127.0.0.1:{port} is already in use" in capsys.readouterr().err

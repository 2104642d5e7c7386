"""The README's examples run as written: its Python blocks in-process, its tour against a real server."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOUR_URL = "http://127.0.0.1:8000"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.M | re.S)


def test_the_two_commands_are_the_scripts_ci_runs():
    commands = re.findall(r"^(bash scripts/\S+)", blocks("sh")[0], flags=re.M)
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text().replace("exec bash", "bash")


def test_python_examples_run(capsys):
    examples = blocks("python")
    assert examples
    for source in examples:
        exec(compile(source, "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    # The estimate example prints one line per label with its interval.
    assert [line.split()[0] for line in printed.splitlines()] == ["cat", "dog", "fish", "none"]


def test_the_demo_says_it_serves_until_ctrl_c():
    demo_line = next(line for line in blocks("sh")[0].splitlines() if "scripts/demo.sh" in line)
    assert "until Ctrl-C" in demo_line
    shown = README.split("\nDashboard:", 1)[1].split("```", 1)[0]  # the demo's output
    last_line = shown.strip().splitlines()[-1]
    assert last_line == "Serving until Ctrl-C."
    assert f'"{last_line}"' in (ROOT / "scripts" / "demo.py").read_text()


def test_the_tour_runs_against_a_real_server(live_server, tmp_path):
    tour = next(block for block in blocks("sh") if "ldp-client report" in block)
    assert TOUR_URL in tour
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the tests run outside a virtual environment ({sys.executable})")
    for command in ("ldp-client", "ldp-aggregator"):
        assert (venv / "bin" / command).is_file(), f"{command} is not installed in {venv}"
    # The console scripts are found only by activating .venv, as the tour tells a newcomer.
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    path = os.pathsep.join(
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder and not shutil.which("ldp-client", path=folder)
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        "PATH": path,
        "LDP_REDIS_URL": live_server.redis_url,
        "LDP_CLIENT_HOME": str(tmp_path / "client"),
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", tour.replace(TOUR_URL, live_server.url)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert '"id": "pets"' in out  # campaign create prints the served spec
    assert '"report_id"' in out  # the dry run shows the payload
    for label in ("cat", "dog", "fish", "none"):
        assert label in out.rsplit("pets", 1)[-1]  # the estimate table lists every label
    # The tour reports "dog" twice from one device: the campaign counts the device once.
    counts = requests.get(
        f"{live_server.url}/api/v1/campaigns/pets/counts",
        headers={"Authorization": f"Bearer {live_server.analyst_token}"},
        timeout=10,
    )
    assert counts.status_code == 200, counts.text
    assert counts.json()["n"] == 1
    assert "Already reported to pets; it takes one report per device." in out


def test_the_tour_server_starts_with_the_tokens_it_exports(tmp_path):
    """The tour's server block as written: its tokens must pass the server's strength check."""
    block = next(block for block in blocks("sh") if "ldp-aggregator serve" in block)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert "--port 8000" in block
    bin_dir = Path(sys.executable).parent
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LDP_") or key == "LDP_CLIENT_HOME"
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    env["LDP_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", block.replace("--port 8000", f"--port {port}")],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass  # not listening yet, or its workers are still booting
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

"""The README's first command: the demo fills its campaigns through the real client and says where to look."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOKEN = "demo-analyst-token-0123456789abcdefghij"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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

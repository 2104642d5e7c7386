"""Suite-wide fixtures: a real aggregator server process on loopback.

``live_server`` runs ``ldp-aggregator serve`` (gunicorn, two workers) on a
free port with its own embedded Redis and data directory, for the whole
session. Tests that share it create campaigns with ids of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from support import free_port

from aggregator.storage.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
LIVE_ADMIN_TOKEN = "live-admin-token-0123456789abcdefghij"
LIVE_ANALYST_TOKEN = "live-analyst-token-0123456789abcdefghij"
STARTUP_SECONDS = 60


@dataclass
class LiveServer:
    url: str
    admin_token: str
    analyst_token: str
    redis_url: str
    data_dir: Path
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def create_campaign(self, spec: dict) -> dict:
        """Create a campaign over HTTP and return the served spec (with its hash)."""
        response = requests.post(
            f"{self.api}/campaigns",
            json=spec,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10,
        )
        assert response.status_code == 201, response.text
        return response.json()


@pytest.fixture(scope="session")
def live_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("live-server")
    data_dir = base / "data"
    log_path = base / "server.log"
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LDP_ADMIN_TOKEN": LIVE_ADMIN_TOKEN,
        "LDP_ANALYST_TOKEN": LIVE_ANALYST_TOKEN,
        "LDP_DATA_DIR": str(data_dir),
        # Every test client comes from 127.0.0.1; keep the per-address limit out of the way.
        "LDP_RATELIMIT_REPORTS": "100000 per minute",
        "LDP_REPORT_BUDGET": "10000000 per hour",
    }
    env.pop("LDP_REDIS_URL", None)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "aggregator.cli", "serve"),
                *("--host", "127.0.0.1", "--port", str(port), "--workers", "2"),
            ],
            cwd=base,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log_path.read_text()}")
            try:
                if requests.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:  # refused, or accepted before a worker booted
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield LiveServer(
            url=url,
            admin_token=LIVE_ADMIN_TOKEN,
            analyst_token=LIVE_ANALYST_TOKEN,
            redis_url=EmbeddedRedis(data_dir).url,
            data_dir=data_dir,
            log_path=log_path,
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

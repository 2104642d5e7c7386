"""Suite-wide fixtures: a real aggregator server process on loopback.

``live_server`` runs ``ldp-aggregator serve`` (gunicorn, two workers) on a
free port with its own embedded Redis and data directory, for the whole
session. Tests that share it create campaigns with ids of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from support import running_server

from aggregator.storage.redis_server import EmbeddedRedis

LIVE_ADMIN_TOKEN = "live-admin-token-0123456789abcdefghij"
LIVE_ANALYST_TOKEN = "live-analyst-token-0123456789abcdefghij"


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
    settings = {
        "LDP_ADMIN_TOKEN": LIVE_ADMIN_TOKEN,
        "LDP_ANALYST_TOKEN": LIVE_ANALYST_TOKEN,
        # Every test client comes from 127.0.0.1; keep the per-address limit out of the way.
        "LDP_RATELIMIT_REPORTS": "100000 per minute",
        "LDP_REPORT_BUDGET": "10000000 per hour",
    }
    with running_server(data_dir, env=settings, workers=2) as server:
        yield LiveServer(
            url=server.url,
            admin_token=LIVE_ADMIN_TOKEN,
            analyst_token=LIVE_ANALYST_TOKEN,
            redis_url=EmbeddedRedis(data_dir).url,
            data_dir=data_dir,
            log_path=server.log_path,
        )

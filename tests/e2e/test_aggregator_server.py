"""``ldp-aggregator serve`` as a real process: gunicorn workers, embedded Redis, HTTP clients.

Clients that retry with their original report ids must see every report
counted exactly once, even when a worker is killed mid-stream or the whole
server restarts on the same data directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from support import RunningServer, running_server

ADMIN_TOKEN = "e2e-admin-token-0123456789abcdefghijkl"
ANALYST_TOKEN = "e2e-analyst-token-0123456789abcdefghijkl"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
SPEC = {
    "id": "e2e",
    "title": "End to end",
    "mechanism": "krr",
    "epsilon": 2.0,
    "domain": ["red", "green", "blue"],
}
TIMEOUT = 10


class Server:
    """``serve`` on one data directory, which a test can stop and start again."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.url = ""
        self._running: RunningServer | None = None
        self._stack = contextlib.ExitStack()

    def start(self) -> None:
        settings = {"LDP_ADMIN_TOKEN": ADMIN_TOKEN, "LDP_ANALYST_TOKEN": ANALYST_TOKEN}
        self._running = self._stack.enter_context(
            running_server(self.data_dir, env=settings, workers=2)
        )
        self.url = self._running.api

    def workers(self) -> list[int]:
        """The gunicorn workers (the master's other child is the embedded redis-server)."""
        assert self._running is not None
        return self._running.workers()

    def stop(self) -> None:
        self._stack.close()


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "data")
    srv.start()
    yield srv
    srv.stop()


def send_with_retries(url: str, batches: list[list[dict]], accepted: list[int]) -> None:
    """A client: each batch is retried with the same ids until the server acknowledges it."""
    session = requests.Session()
    for batch in batches:
        for _attempt in range(50):
            try:
                response = session.post(url, json={"reports": batch}, timeout=TIMEOUT)
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                # Refused, reset, or cut mid-response by a killed worker: not acknowledged.
                time.sleep(0.05)
                continue
            if response.status_code == 200:
                accepted.append(response.json()["accepted"])
                break
            time.sleep(0.05)
        else:
            raise AssertionError(
                f"batch never acknowledged: {response.status_code} {response.text}"
            )


def make_batches(n_clients: int, n_batches: int, size: int) -> list[list[list[dict]]]:
    labels = SPEC["domain"]
    return [
        [
            [
                {"report_id": str(uuid.uuid4()), "value": labels[(c + b + i) % 3]}
                for i in range(size)
            ]
            for b in range(n_batches)
        ]
        for c in range(n_clients)
    ]


def run_clients(server: Server, per_client: list[list[list[dict]]], during=None) -> int:
    """Run one thread per client; ``during(accepted)`` runs meanwhile, seeing the acks so far.

    A client that gives up fails the test with its own error.
    """
    url = f"{server.url}/campaigns/e2e/reports"
    accepted: list[int] = []
    with ThreadPoolExecutor(max_workers=len(per_client)) as pool:
        clients = [pool.submit(send_with_retries, url, batches, accepted) for batches in per_client]
        if during is not None:
            during(accepted)
        for client in clients:
            client.result(timeout=120)
    return sum(accepted)


def counts(server: Server) -> dict[str, int]:
    body = requests.get(
        f"{server.url}/campaigns/e2e/counts", headers=ANALYST, timeout=TIMEOUT
    ).json()
    return {row["label"]: row["count"] for row in body["counts"]}


def expected_counts(per_client) -> dict[str, int]:
    out = dict.fromkeys(SPEC["domain"], 0)
    for batches in per_client:
        for batch in batches:
            for report in batch:
                out[report["value"]] += 1
    return out


def test_concurrent_clients_with_retries_are_counted_once(server):
    created = requests.post(f"{server.url}/campaigns", json=SPEC, headers=ADMIN, timeout=TIMEOUT)
    assert created.status_code == 201
    per_client = make_batches(n_clients=6, n_batches=5, size=40)
    assert run_clients(server, per_client) == 6 * 5 * 40
    # Every client sends everything again, as after a lost acknowledgement.
    assert run_clients(server, per_client) == 0
    assert counts(server) == expected_counts(per_client)
    estimate = requests.get(
        f"{server.url}/campaigns/e2e/estimate?method=inversion", headers=ANALYST, timeout=TIMEOUT
    ).json()
    assert estimate["n"] == 1200
    assert [row["label"] for row in estimate["estimates"]] == SPEC["domain"]


def test_a_killed_worker_loses_no_acknowledged_report(server):
    requests.post(f"{server.url}/campaigns", json=SPEC, headers=ADMIN, timeout=TIMEOUT)
    per_client = make_batches(n_clients=4, n_batches=60, size=20)
    total_batches = 4 * 60
    victims = server.workers()
    assert len(victims) == 2
    acks_at_kill = []

    def kill_a_worker(accepted):
        # Mid-stream: once a quarter of the batches are acknowledged.
        deadline = time.monotonic() + 60
        while len(accepted) < total_batches // 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        acks_at_kill.append(len(accepted))
        os.kill(victims[0], signal.SIGKILL)

    run_clients(server, per_client, during=kill_a_worker)
    assert total_batches // 4 <= acks_at_kill[0] < total_batches
    assert counts(server) == expected_counts(per_client)
    deadline = time.monotonic() + 30
    while victims[0] in server.workers() or len(server.workers()) != 2:
        assert time.monotonic() < deadline, "gunicorn did not replace the killed worker"
        time.sleep(0.1)


def test_reports_survive_a_server_restart(server):
    requests.post(f"{server.url}/campaigns", json=SPEC, headers=ADMIN, timeout=TIMEOUT)
    per_client = make_batches(n_clients=2, n_batches=3, size=50)
    run_clients(server, per_client)
    before = counts(server)
    server.stop()
    assert not (server.data_dir / "redis.sock").exists() or not _answers(server.data_dir)
    server.start()
    assert counts(server) == before == expected_counts(per_client)
    assert run_clients(server, per_client) == 0


def _answers(data_dir: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(data_dir / "redis.sock"))
        except OSError:
            return False
    return True

"""Aggregator ingestion benchmark: the Lua ingest path and the HTTP API under load.

Writes section ``ingest`` of ``BENCHMARKS.md`` (through ``scripts/benchlib.py``):

* store level: reports per second through ``CampaignStore.ingest`` (one Lua
  call per batch: dedupe, count, stream) against the embedded Redis, by batch
  size and ``appendfsync`` policy;
* HTTP: ``ldp-aggregator serve`` (gunicorn, 2 workers, embedded Redis) as a
  real process, with client threads posting batches; reports per second and
  median / 95th-percentile request latency;
* the estimate endpoint: latency of ``GET .../estimate`` for a k-RR campaign
  (k = 100) and a planar campaign (about 60 x 60 cells), including reading
  the counts from Redis.

The client threads run on the same machine as the server, so HTTP figures
are lower bounds for a dedicated server. Run from the repository root::

    python scripts/bench_ingest.py           # full run (about a minute on 2 cores)
    python scripts/bench_ingest.py --quick   # smoke run, prints only
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import write_section  # noqa: E402

from aggregator.redis_server import EmbeddedRedis  # noqa: E402
from aggregator.store import CampaignStore, StoredReport  # noqa: E402
from shared.mechanisms import Mechanism  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

ADMIN = {"Authorization": "Bearer bench-admin"}
K = 100
KRR_SPEC = {
    "id": "bench",
    "title": "Benchmark",
    "mechanism": "krr",
    "epsilon": 2.0,
    "domain": [f"c{i}" for i in range(K)],
}
PLANAR_SPEC = {
    "id": "bench-geo",
    "title": "Benchmark (locations)",
    "mechanism": "planar_laplace",
    "epsilon": 0.01,
    "region": {"lat_min": 37.76, "lat_max": 37.82, "lon_min": -122.46, "lon_max": -122.39},
    "cell_size_m": 110,
}


def store_rows(total: int) -> list[str]:
    spec = CampaignSpec.from_dict(KRR_SPEC)
    rows = []
    for fsync in ("everysec", "always"):
        for batch in (1, 100, 1000):
            with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp, appendfsync=fsync) as srv:
                store = CampaignStore(redis.Redis.from_url(srv.url))
                store.create_campaign(spec)
                reports = [
                    StoredReport(str(uuid.uuid4()), i % K, spec.domain[i % K]) for i in range(total)
                ]
                started = time.perf_counter()
                for start in range(0, total, batch):
                    store.ingest(spec.id, reports[start : start + batch])
                elapsed = time.perf_counter() - started
                assert store.get_campaign(spec.id).n_reports == total
                store.connection.close()
            rows.append(
                f"| store, 1 connection | {fsync} | {batch} | {total / elapsed:,.0f} | - | - |"
            )
            print(rows[-1], flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(data_dir: Path, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LDP_ADMIN_TOKEN": "bench-admin",
        "LDP_ANALYST_TOKEN": "bench-analyst",
        "LDP_RATELIMIT_REPORTS": '"1000000 per minute"',
    }
    env.pop("LDP_REDIS_URL", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggregator.cli",
            "--data-dir",
            str(data_dir),
            "serve",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).ok:
                time.sleep(1)  # let the second worker boot
                return process
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


def http_rows(base: str, total: int, threads: int) -> list[str]:
    rows = []
    rng = random.Random(1)
    for batch in (1, 100):
        n_requests = max(threads, total // batch if batch > 1 else min(total, 4000))
        bodies = [
            {
                "reports": [
                    {"report_id": str(uuid.uuid4()), "value": f"c{rng.randrange(K)}"}
                    for _ in range(batch)
                ]
            }
            for _ in range(n_requests)
        ]
        latencies: list[float] = []
        lock = threading.Lock()

        def client(chunk: list[dict], latencies: list[float], lock: threading.Lock) -> None:
            session = requests.Session()
            mine = []
            for body in chunk:
                sent = time.perf_counter()
                response = session.post(f"{base}/campaigns/bench/reports", json=body, timeout=30)
                mine.append(time.perf_counter() - sent)
                assert response.status_code == 200, response.text
            with lock:
                latencies.extend(mine)

        workers = [
            threading.Thread(target=client, args=(bodies[i::threads], latencies, lock))
            for i in range(threads)
        ]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        latencies.sort()
        p50 = statistics.median(latencies) * 1000
        p95 = latencies[int(0.95 * (len(latencies) - 1))] * 1000
        rate = n_requests * batch / elapsed
        rows.append(
            f"| HTTP, 2 workers, {threads} client threads | everysec | {batch} | {rate:,.0f} "
            f"| {p50:.1f} | {p95:.1f} |"
        )
        print(rows[-1], flush=True)
    return rows


def estimate_rows(base: str, data_dir: Path, n_reports: int) -> list[str]:
    """Fill both campaigns through the store, then time the estimate endpoint."""
    store = CampaignStore(redis.Redis.from_url(f"unix://{data_dir / 'redis.sock'}"))
    rng = random.Random(2)
    rows = []
    # The ingestion campaign already holds reports: estimate a fresh k-RR campaign.
    for spec_dict in ({**KRR_SPEC, "id": "bench-est"}, PLANAR_SPEC):
        spec = CampaignSpec.from_dict(spec_dict)
        store.create_campaign(spec)
        mechanism = Mechanism.from_spec(spec)
        n_out = mechanism.n_outputs
        for start in range(0, n_reports, 1000):
            chunk = []
            for _ in range(min(1000, n_reports - start)):
                y = mechanism.perturb_index(rng.randrange(n_out), rng)
                chunk.append(StoredReport(str(uuid.uuid4()), y, mechanism.report_value(y)))
            store.ingest(spec.id, chunk)
        for method in ("inversion", "ibu") if spec.mechanism == "krr" else ("ibu",):
            times = []
            for _ in range(3):
                sent = time.perf_counter()
                response = requests.get(
                    f"{base}/campaigns/{spec.id}/estimate?method={method}",
                    headers=ADMIN,
                    timeout=300,
                )
                times.append(time.perf_counter() - sent)
                assert response.status_code == 200, response.text
            size = (
                f"k = {K}"
                if spec.mechanism == "krr"
                else f"{spec.grid.rows} x {spec.grid.cols} cells"
            )
            rows.append(
                f"| {spec.mechanism}, {size}, n = {n_reports:,} | {method} "
                f"| {statistics.median(times) * 1000:,.0f} |"
            )
            print(rows[-1], flush=True)
    store.connection.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; print only")
    args = parser.parse_args()
    total = 2_000 if args.quick else 20_000
    ingest = store_rows(total)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        port = free_port()
        server = start_server(data_dir, port)
        base = f"http://127.0.0.1:{port}/api/v1"
        try:
            created = requests.post(f"{base}/campaigns", json=KRR_SPEC, headers=ADMIN, timeout=10)
            assert created.status_code == 201, created.text
            ingest += http_rows(base, total, threads=4)
            estimates = estimate_rows(base, data_dir, 2_000 if args.quick else 100_000)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    table = "\n".join(
        [
            "Report ingestion (each report deduplicated by id, counted and appended to the stream):",
            "",
            "| path | appendfsync | reports per request | reports / s | p50 ms | p95 ms |",
            "|---|---|---|---|---|---|",
            *ingest,
            "",
            "Estimate endpoint, median of 3 requests (counts read from Redis, channel built, "
            "estimate with intervals):",
            "",
            "| campaign | method | ms |",
            "|---|---|---|",
            *estimates,
        ]
    )
    print()
    print(table)
    if not args.quick:
        print("\nwrote", write_section("ingest", table))


if __name__ == "__main__":
    main()

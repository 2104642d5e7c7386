"""How the aggregator holds against one abusive address: memory, budgets, token guessing.

Three measurements against real processes, written to the ``abuse`` section of
RELIABILITY.md (unless ``--no-write``):

1. Bytes of Redis memory per stored report (``used_memory`` before and after
   ``--reports`` reports through the ingestion script, k-RR over 4 labels).
2. A flood from one address on ``ldp-aggregator serve`` with the default limits:
   batches of 1,000 as fast as one client can send them for ``--seconds``; how
   many reports were stored, when the first refusal came, and how fast
   refusals are answered. Then the same flood with the per-address budget lifted
   and the embedded Redis capped at ``--maxmemory``: when reports stop (507),
   how full Redis is then, and whether health, reads and sign-in still answer.
3. 300 wrong bearer tokens from one address: the statuses and the time taken.

Usage: ``python scripts/flood_check.py [--reports 100000] [--seconds 10]
[--maxmemory 48mb] [--no-write]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from aggregator.storage.ingest import StoredReport  # noqa: E402
from aggregator.storage.redis_server import EmbeddedRedis  # noqa: E402
from aggregator.storage.store import CampaignStore  # noqa: E402
from scripts.benchlib import free_port  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

SPEC = {
    "id": "flood",
    "title": "Flood",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": ["apple", "banana", "cherry", "damson"],
}
ADMIN_TOKEN = secrets.token_urlsafe(32)
ANALYST_TOKEN = secrets.token_urlsafe(32)
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def bytes_per_report(workdir: Path, n_reports: int) -> tuple[float, int]:
    """Redis ``used_memory`` added per report, and the reports stored."""
    spec = CampaignSpec.from_dict(SPEC)
    with EmbeddedRedis(workdir / "bytes", maxmemory=0) as server:
        connection = redis.Redis.from_url(server.url)
        store = CampaignStore(connection)
        store.create_campaign(spec)
        before = connection.info("memory")["used_memory"]
        for start in range(0, n_reports, 1000):
            count = min(1000, n_reports - start)
            reports = [
                StoredReport(str(uuid.uuid4()), i % 4, spec.domain[i % 4]) for i in range(count)
            ]
            store.ingest(spec.id, reports)
        after = connection.info("memory")["used_memory"]
        connection.close()
    return (after - before) / n_reports, n_reports


class Serve:
    """``ldp-aggregator serve`` on a fresh data directory with the given extra settings."""

    def __init__(self, data_dir: Path, **settings: str) -> None:
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        self.root = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LDP_")},
            "PYTHONPATH": str(ROOT),
            "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
            "LDP_ANALYST_TOKEN": ANALYST_TOKEN,
            "LDP_DATA_DIR": str(data_dir),
            **settings,
        }
        self.log = open(data_dir.parent / f"serve-{self.port}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aggregator.cli", "serve", "--port", str(self.port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("serve exited")
            try:
                if requests.get(f"{self.api}/health", timeout=1).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not start")
            time.sleep(0.2)
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        requests.post(f"{self.api}/campaigns", json=SPEC, headers=admin, timeout=10)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        self.log.close()


MAX_REFUSALS = 500


def flood(serve: Serve, seconds: float) -> dict:
    """Batches of 1,000 new reports from one address for ``seconds``; what happened.

    Stops early after :data:`MAX_REFUSALS` refusals (enough for their latency).
    """
    session = requests.Session()
    url = f"{serve.api}/campaigns/flood/reports"
    statuses: collections.Counter[int] = collections.Counter()
    stored, first_refusal, refusal_latency = 0, None, []
    start = time.monotonic()
    while time.monotonic() - start < seconds and len(refusal_latency) < MAX_REFUSALS:
        body = {
            "reports": [
                {"report_id": str(uuid.uuid4()), "value": SPEC["domain"][i % 4]}
                for i in range(1000)
            ]
        }
        sent = time.monotonic()
        response = session.post(url, json=body, timeout=30)
        statuses[response.status_code] += 1
        if response.status_code == 200:
            stored += response.json()["accepted"]
        else:
            refusal_latency.append(time.monotonic() - sent)
            if first_refusal is None:
                first_refusal = (time.monotonic() - start, response.status_code, stored)
    return {
        "seconds": time.monotonic() - start,
        "statuses": dict(statuses),
        "stored": stored,
        "first_refusal": first_refusal,
        "refusal_ms": 1000 * statistics.median(refusal_latency) if refusal_latency else None,
    }


def still_serving(serve: Serve) -> dict[str, int]:
    """Statuses of health, a read, an estimate and a dashboard sign-in at that moment."""
    analyst = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
    dashboard = requests.Session()
    page = dashboard.get(f"{serve.root}/dashboard/login", timeout=10)
    csrf = CSRF.search(page.text).group(1)
    sign_in = dashboard.post(
        f"{serve.root}/dashboard/login",
        data={"csrf_token": csrf, "token": ANALYST_TOKEN},
        allow_redirects=False,
        timeout=10,
    )
    return {
        "health": requests.get(f"{serve.api}/health", timeout=10).status_code,
        "counts": requests.get(
            f"{serve.api}/campaigns/flood/counts", headers=analyst, timeout=10
        ).status_code,
        "estimate": requests.get(
            f"{serve.api}/campaigns/flood/estimate", headers=analyst, timeout=60
        ).status_code,
        "sign-in": sign_in.status_code,
    }


def guess_tokens(serve: Serve, attempts: int = 300) -> tuple[dict[int, int], float]:
    session = requests.Session()
    statuses: collections.Counter[int] = collections.Counter()
    start = time.monotonic()
    for _ in range(attempts):
        headers = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
        statuses[
            session.get(
                f"{serve.api}/campaigns/flood/counts", headers=headers, timeout=10
            ).status_code
        ] += 1
    return dict(statuses), time.monotonic() - start


def _statuses(statuses: dict[int, int]) -> str:
    return ", ".join(f"{count} x {status}" for status, count in sorted(statuses.items()))


def markdown(args: argparse.Namespace, results: dict) -> str:
    per_report, n = results["bytes"]
    default, capped = results["default_flood"], results["capped_flood"]
    lines = [
        "| Measurement | Result |",
        "|---|---|",
        f"| Redis memory per stored report (k-RR, {n:,} reports in batches of 1,000) "
        f"| {per_report:.0f} bytes |",
    ]
    first = default["first_refusal"]
    lines.append(
        f"| Flood, default limits: one address, batches of 1,000 for {default['seconds']:.1f} s "
        f"| {default['stored']:,} reports stored; first refusal ({first[1]}) after "
        f"{first[0]:.2f} s; then {_statuses(default['statuses'])}; a refusal answered in "
        f"{default['refusal_ms']:.1f} ms (median) |"
        if first
        else f"| Flood, default limits | no refusal in {default['seconds']:.1f} s |"
    )
    first = capped["first_refusal"]
    lines.append(
        f"| Flood, budget lifted, Redis capped at {args.maxmemory}: batches of 1,000 "
        f"| {capped['stored']:,} reports stored; reports refused ({first[1]}) after "
        f"{first[0]:.2f} s at {results['used_fraction']:.0%} of maxmemory; then "
        f"{_statuses(capped['statuses'])}; a refusal answered in {capped['refusal_ms']:.1f} ms "
        "(median) |"
        if first
        else f"| Flood, capped Redis | no refusal in {capped['seconds']:.1f} s |"
    )
    serving = ", ".join(f"{name} {status}" for name, status in results["serving"].items())
    lines.append(f"| While refusing reports at the cap | {serving} |")
    statuses, elapsed = results["guesses"]
    lines.append(
        f"| 300 wrong bearer tokens from one address | {_statuses(statuses)} in {elapsed:.2f} s |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--maxmemory", default="48mb")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        results["bytes"] = bytes_per_report(workdir, args.reports)
        serve = Serve(workdir / "default")
        try:
            results["default_flood"] = flood(serve, args.seconds)
            results["guesses"] = guess_tokens(serve)
        finally:
            serve.stop()
        serve = Serve(
            workdir / "capped",
            LDP_REDIS_MAXMEMORY=args.maxmemory,
            LDP_REPORT_BUDGET="1000000000 per hour",
            LDP_RATELIMIT_REPORTS="1000000000 per minute",
        )
        try:
            results["capped_flood"] = flood(serve, args.seconds * 6)
            info = redis.Redis(unix_socket_path=str(serve.data_dir / "redis.sock")).info("memory")
            results["used_fraction"] = info["used_memory"] / info["maxmemory"]
            results["serving"] = still_serving(serve)
        finally:
            serve.stop()
    table = markdown(args, results)
    print(table)
    if not args.no_write:
        from benchlib import write_section

        write_section("abuse", table, path=ROOT / "RELIABILITY.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Redis memory and commands per accepted report, by what the store keeps.

    python scripts/bench_store_memory.py [--reports 1000000] [--batch 1000] [--no-write]

Each configuration gets a fresh embedded Redis (the server the aggregator starts,
with its own configuration) and one k-RR campaign (k = 16); reports with fresh
UUID4 ids go through :meth:`CampaignStore.ingest` in batches, as the report
endpoint sends them. Memory per report is ``INFO memory`` ``used_memory`` after
minus before, divided by the reports accepted; commands per report come from
``INFO commandstats``. Configurations:

- the default settings (16 shards, deduplication sets sized for the default
  quota of 10^7 reports, raw reports off);
- the same with the raw reports kept (``LDP_RAW_REPORTS=keep``);
- the previous layout (a key per report id and the stream), driven by the
  previous version's scripts kept in ``tests/aggregator/layout1``, over a tenth of
  the reports (its cost per report does not fall with size).

Writes the table into the "Store memory" section of BENCHMARKS.md with the
capacity it gives (reports per GB of Redis memory).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "aggregator"))

import benchlib

from aggregator.storage.redis_server import EmbeddedRedis
from aggregator.storage.store import CampaignStore, StoredReport
from shared.spec import CampaignSpec

K = 16
SPEC = {
    "id": "memory",
    "title": "Memory per report",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": [f"label-{i}" for i in range(K)],
}


def batches(total: int, size: int):
    for start in range(0, total, size):
        yield [
            StoredReport(str(uuid.uuid4()), (start + i) % K, f"label-{(start + i) % K}")
            for i in range(min(size, total - start))
        ]


def command_calls(connection: redis.Redis) -> int:
    stats = connection.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())


def measure(name: str, reports: int, batch: int, ingest_with) -> dict:
    with tempfile.TemporaryDirectory() as data_dir:
        server = EmbeddedRedis(Path(data_dir), appendfsync="no", maxmemory=0)
        connection = redis.Redis.from_url(server.start())
        try:
            ingest = ingest_with(connection)
            connection.execute_command("CONFIG", "RESETSTAT")
            before = int(connection.info("memory")["used_memory"])
            calls_before = command_calls(connection)
            started = time.perf_counter()
            accepted = 0
            for chunk in batches(reports, batch):
                accepted += ingest(chunk)
            elapsed = time.perf_counter() - started
            after = int(connection.info("memory")["used_memory"])
            calls = command_calls(connection) - calls_before
        finally:
            connection.close()
            server.stop()
    per_report = (after - before) / accepted
    return {
        "name": name,
        "reports": accepted,
        "bytes": per_report,
        "per_gb": 2**30 / per_report,
        "calls": calls / accepted,
        "rate": accepted / elapsed,
    }


def sharded(raw_reports: str):
    def open_store(connection: redis.Redis):
        store = CampaignStore(connection, raw_reports=raw_reports)
        store.create_campaign(CampaignSpec.from_dict(SPEC))
        return lambda chunk: store.ingest("memory", chunk).accepted

    return open_store


def layout1(connection: redis.Redis):
    from test_migrate import Layout1

    old = Layout1(connection)
    spec = CampaignSpec.from_dict(SPEC)
    old.create(spec, time.time())

    def ingest(chunk):
        old.ingest(spec, chunk, time.time())
        return len(chunk)

    return ingest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args()
    rows = [
        measure("default (counts only)", options.reports, options.batch, sharded("off")),
        measure("raw reports kept", options.reports, options.batch, sharded("keep")),
        measure("previous layout", max(options.reports // 10, 1), options.batch, layout1),
    ]
    lines = [
        "| store | reports | Redis bytes / report | reports / GB | commands / report | "
        "reports / s (one client) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['reports']:,} | {row['bytes']:.1f} | "
            f"{row['per_gb'] / 1e6:,.1f} M | {row['calls']:.3f} | {row['rate']:,.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not options.no_write:
        notes = (
            "Bytes per report are `INFO memory` `used_memory` after minus before, over the "
            "reports accepted (batches of "
            f"{options.batch}, k = {K}, fresh UUID4 report ids, one process calling the "
            "store directly); the default deduplication window included. Reports per GB is "
            "2^30 bytes over that figure: the capacity of a Redis node's memory for reports "
            "remembered for deduplication, before replicas and fragmentation."
        )
        benchlib.write_section("store-memory", f"{table}\n\n{notes}")


if __name__ == "__main__":
    main()

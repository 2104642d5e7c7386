"""Redis memory and commands per accepted report, by what the store keeps; memory per period.

    python scripts/bench_store_memory.py [--reports 1000000] [--batch 1000] [--no-write]
        [--section all|reports|periods]

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

``--section periods`` measures instead what one campaign's counts of one period
take (:mod:`aggregator.storage.periods`): for k-RR over 10 and 1,000 labels and
planar Laplace over a 64 x 64 grid (16 shards, the default), N reports spread
uniformly over the outputs are received in one period, and the period's keys of
every shard are summed with ``MEMORY USAGE``; beside it, the same counts kept
as hashes only (as the all-time counts are), to show what the dense form saves.
Writes the "store-memory-periods" section.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "aggregator"))

import benchlib

from aggregator.storage import layout as layouts
from aggregator.storage import periods
from aggregator.storage.ingest import StoredReport
from aggregator.storage.redis_server import EmbeddedRedis
from aggregator.storage.store import CampaignStore
from shared.mechanisms import Mechanism
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


# Campaigns whose counts per period are measured (k-RR by day; planar Laplace over 64 x 64
# cells of 50 m), and the reports received in the period.
PERIOD_CAMPAIGNS = {
    "k-RR, k = 10": {
        "mechanism": "krr",
        "epsilon": 1.0,
        "domain": [f"label-{i}" for i in range(10)],
    },
    "k-RR, k = 1,000": {
        "mechanism": "krr",
        "epsilon": 1.0,
        "domain": [f"label-{i}" for i in range(1000)],
    },
    "planar Laplace, 64 x 64 cells": {
        "mechanism": "planar_laplace",
        "epsilon": 0.02,
        "region": benchlib.equator_grid(64, 64, 50.0).region.to_dict(),
        "cell_size_m": 50.0,
    },
}
PERIOD_REPORTS = (100, 1_000, 10_000, 100_000)
# Noon UTC of a day: every report of a run falls in that day.
PERIOD_NOON = 1_796_040_000.0


def period_bytes(store: CampaignStore, campaign_id: str, key: str) -> int:
    """``MEMORY USAGE`` of one period's counts, every shard's (hash or dense string)."""
    layout = store.layout(campaign_id)
    total = 0
    for shard in range(layout.shards):
        for name in (layout.period_key(shard, key), layout.period_dense_key(shard, key)):
            total += int(store.connection.memory_usage(name, samples=0) or 0)
    return total


def measure_periods(batch: int, seed: int = 0) -> list[dict]:
    """Bytes of one period's counts per campaign shape and number of reports."""
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        server = EmbeddedRedis(Path(data_dir), appendfsync="no", maxmemory=0)
        connection = redis.Redis.from_url(server.start())
        try:
            store = CampaignStore(connection, clock=lambda: PERIOD_NOON)
            for number, (name, fields) in enumerate(PERIOD_CAMPAIGNS.items()):
                for reports in PERIOD_REPORTS:
                    row = {"campaign": name, "reports": reports}
                    for mode in ("dense", "hash"):
                        campaign_id = f"c{number}-{reports}-{mode}"
                        spec = CampaignSpec.from_dict(
                            {"id": campaign_id, "title": name, "period": "day", **fields}
                        )
                        store.create_campaign(spec)
                        mechanism = Mechanism.from_spec(spec)
                        rng = random.Random(seed)
                        dense_from = layouts.dense_from if mode == "dense" else _never_dense
                        with mock.patch.object(layouts, "dense_from", dense_from):
                            for start in range(0, reports, batch):
                                chunk = []
                                for _ in range(min(batch, reports - start)):
                                    y = rng.randrange(mechanism.n_outputs)
                                    chunk.append(
                                        StoredReport(
                                            str(uuid.uuid4()), y, mechanism.report_value(y)
                                        )
                                    )
                                store.ingest(campaign_id, chunk)
                        key = periods.key_at(spec_unit(spec), PERIOD_NOON)
                        row[mode] = period_bytes(store, campaign_id, key)
                        row["outputs"] = mechanism.n_outputs
                    rows.append(row)
        finally:
            connection.close()
            server.stop()
    return rows


def _never_dense(n_outputs: int, hash_entries: int) -> int:
    return 2**31


def spec_unit(spec: CampaignSpec) -> str:
    return periods.unit_of(spec.period)


def periods_section(rows: list[dict]) -> str:
    lines = [
        "| campaign | reports in the period | bytes per period | a year of such days | "
        "as hashes only |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['campaign']} | {row['reports']:,} | {row['dense']:,} | "
            f"{row['dense'] * 365 / 2**20:,.1f} MiB | {row['hash']:,} |"
        )
    notes = (
        "One campaign's counts of one period (a day), every shard's (16, the default), by "
        "`MEMORY USAGE` on the embedded Redis (6.2, libc malloc); reports drawn uniformly over "
        "the outputs, the case with the most outputs per shard (real populations concentrate, "
        "and cost less). A shard's period is a hash while few outputs have reports, and a "
        "dense string of 4-byte counts (4 x outputs bytes) once the hash has a field for an "
        "eighth of the outputs or would leave Redis's compact encoding "
        "(`aggregator/storage/layout.py`, `dense_from`): a dense period is much faster to "
        "read, and costs more than the compact hash only in between (k = 1,000 at 10,000 "
        'reports). "As hashes only" is what the same counts take kept as hashes, as the '
        "all-time counts are. Counts per period expire "
        "`LDP_PERIOD_RETENTION_DAYS` (400 by default) after their period, so a campaign "
        "counted by day holds at most about 400 of them."
    )
    return "\n".join(lines) + "\n\n" + notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--section",
        choices=("all", "reports", "periods"),
        default="all",
        help="measure memory per report, per period, or both",
    )
    options = parser.parse_args()
    if options.section in ("all", "periods"):
        text = periods_section(measure_periods(options.batch))
        print(text)
        if not options.no_write:
            benchlib.write_section("store-memory-periods", text)
    if options.section == "periods":
        return
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

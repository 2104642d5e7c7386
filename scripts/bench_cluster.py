"""Scale-out benchmark: one Redis node against a 3-master Redis Cluster, same traffic.

For each store, one embedded-configuration Redis (``appendfsync everysec``, as the
cluster's nodes) and then a fresh cluster of 3 masters and 3 replicas
(``scripts/redis_cluster.py``), it starts two ``ldp-aggregator serve`` processes,
creates a k-RR campaign with ``LDP_SHARDS`` shards (default 16) and one with
``LDP_SHARDS=1``, and measures:

* ingest throughput: ``--reports`` reports in batches of 100 from ``--clients``
  threads over HTTP, reports/s (wall time of the whole send);
* Redis commands per report (``INFO commandstats`` delta over the masters /
  reports; commands run inside the ingestion script count), Redis CPU seconds per
  report (``INFO cpu``) and the aggregator processes' CPU per report (``/proc``);
* bytes per report (``INFO memory`` ``used_memory`` delta over the masters / reports,
  dedup state and everything else a report leaves, replicas not included);
* the campaign's keys and slots per master (max/min share of keys);
* estimate latency of the sharded campaign against the unsharded one at the same
  counts (a new report before each request, so every estimate is computed).

Then a capacity model for 10^9 reports. Run from the repository root::

    python scripts/bench_cluster.py                   # 100,000 reports per store
    python scripts/bench_cluster.py --reports 20000 --no-write

It prints the tables and writes section ``scale-out`` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402

from aggregator.storage.redis_server import EmbeddedRedis  # noqa: E402
from scripts import clusterlib  # noqa: E402
from scripts.benchlib import BENCHMARKS_FILE, write_section  # noqa: E402

SHARDED = "scale"
UNSHARDED = "scale-1"
ESTIMATE_REPEATS = 7
REPORTS_TARGET = 10**9
# The per-report memory figure of scripts/bench_store_memory.py, if BENCHMARKS.md has it.
STORE_MEMORY_SECTION = "store-memory"
NODE_MEMORY_GB = 64  # a storage host of the capacity model
HIGH_WATER = 0.9  # LDP_STORAGE_HIGH_WATER's default: reports stop at 90 % of maxmemory
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class StoreFigures:
    """What one store (one node, or the cluster) measured."""

    name: str
    masters: int = 1
    reports: int = 0
    seconds: float = 0.0
    commands: Counter = field(default_factory=Counter)
    memory_bytes: int = 0
    redis_cpu_s: float = 0.0
    aggregator_cpu_s: float = 0.0
    keys_per_master: list[int] = field(default_factory=list)
    memory_per_master: list[int] = field(default_factory=list)
    slots_per_master: list[int] = field(default_factory=list)
    estimate_ms: dict[str, float] = field(default_factory=dict)
    counts_ms: dict[str, float] = field(default_factory=dict)

    @property
    def reports_per_s(self) -> float:
        return self.reports / self.seconds if self.seconds else float("nan")

    def per_report(self, value: float) -> float:
        return value / self.reports if self.reports else float("nan")


def process_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (Linux ``/proc``)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def redis_readings(addresses: list[tuple[str, int] | str]) -> tuple[list[int], float]:
    """``used_memory`` of each of ``addresses``, and their CPU seconds summed."""
    memory, cpu = [], 0.0
    for address in addresses:
        connection = clusterlib.node(address)
        try:
            memory.append(int(connection.info("memory")["used_memory"]))
            info = connection.info("cpu")
            cpu += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        finally:
            connection.close()
    return memory, cpu


@contextlib.contextmanager
def single_node(root: Path) -> Iterator[str]:
    """The embedded server's Redis (its configuration, with AOF ``everysec`` as the cluster's)."""
    embedded = EmbeddedRedis(root, appendfsync="everysec", maxmemory=0)
    try:
        yield embedded.start()
    finally:
        embedded.stop()


def timed_get(session: requests.Session, url: str) -> float:
    started = time.perf_counter()
    response = session.get(url, headers=clusterlib.analyst_headers(), timeout=120)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed * 1000


def read_latencies(server_url: str, figures: StoreFigures, seed: int) -> None:
    """Median estimate (recomputed) and counts latency of both campaigns, interleaved."""
    fresh = iter(clusterlib.make_reports(ESTIMATE_REPEATS * 2, seed + 99))
    samples: dict[str, dict[str, list[float]]] = {
        campaign: {"estimate": [], "counts": []} for campaign in (SHARDED, UNSHARDED)
    }
    with requests.Session() as session:
        for _ in range(ESTIMATE_REPEATS):
            for campaign in (SHARDED, UNSHARDED):
                api = f"{server_url}/api/v1/campaigns/{campaign}"
                # One new report, so that the estimate is computed rather than cached.
                session.post(f"{api}/reports", json=next(fresh), timeout=30).raise_for_status()
                samples[campaign]["estimate"].append(timed_get(session, f"{api}/estimate"))
                samples[campaign]["counts"].append(timed_get(session, f"{api}/counts"))
    for campaign, kinds in samples.items():
        figures.estimate_ms[campaign] = clusterlib.median(kinds["estimate"])
        figures.counts_ms[campaign] = clusterlib.median(kinds["counts"])


def measure_store(
    name: str, url: str, args: argparse.Namespace, log_dir: Path, cluster: bool
) -> StoreFigures:
    figures = StoreFigures(name)
    settings = {
        "LDP_SHARDS": str(args.shards),
        "LDP_RATELIMIT_REPORTS": "100000000 per minute",
        "LDP_REPORT_BUDGET": "1000000000 per hour",
    }
    with clusterlib.aggregator_servers(url, 1, log_dir, env={**settings, "LDP_SHARDS": "1"}) as one:
        clusterlib.create_campaign(one[0].url, UNSHARDED)
    addresses: list[tuple[str, int] | str] = [url]
    if cluster:
        seed_node = redis.Redis.from_url(url)
        addresses = list(clusterlib.masters(seed_node))
        seed_node.close()
    figures.masters = len(addresses)
    reports = clusterlib.make_reports(args.reports, args.seed)
    traffic = clusterlib.Traffic(
        clients=args.clients, single_share=0.0, min_batch=100, retry_share=0.0, seed=args.seed
    )
    with clusterlib.aggregator_servers(
        url, 2, log_dir, workers=args.workers, env=settings
    ) as servers:
        urls = [server.url for server in servers]
        clusterlib.create_campaign(urls[0], SHARDED)
        workers = [pid for server in servers for pid in server.workers()]
        calls_before = clusterlib.command_calls(addresses)
        memory_before, redis_cpu_before = redis_readings(addresses)
        cpu_before = process_cpu_s(workers)
        started = time.monotonic()
        deliveries = clusterlib.send_all(urls, SHARDED, reports, traffic)
        figures.seconds = time.monotonic() - started
        figures.aggregator_cpu_s = process_cpu_s(workers) - cpu_before
        memory_after, redis_cpu_after = redis_readings(addresses)
        figures.commands = clusterlib.command_calls(addresses) - calls_before
        figures.memory_per_master = [
            after - before for after, before in zip(memory_after, memory_before, strict=True)
        ]
        figures.memory_bytes = sum(figures.memory_per_master)
        figures.redis_cpu_s = redis_cpu_after - redis_cpu_before
        figures.reports = sum(len(d.acknowledged) for d in deliveries)
        if figures.reports != len(reports):
            raise RuntimeError(f"only {figures.reports} of {len(reports)} reports acknowledged")
        figures.keys_per_master = [
            len(clusterlib.campaign_keys(address, SHARDED)) for address in addresses
        ]
        if cluster:
            connection = redis.Redis.from_url(url)
            layout = clusterlib.campaign_layout(url, SHARDED)
            placed = clusterlib.shard_masters(connection, layout)
            connection.close()
            held = Counter(placed.values())
            figures.slots_per_master = [held.get(address, 0) for address in addresses]
        # The unsharded campaign gets the same reports, so both are read at the same counts.
        clusterlib.send_all(urls, UNSHARDED, reports, traffic)
        read_latencies(urls[0], figures, args.seed)
    return figures


def stored_bytes_per_report() -> tuple[float, str] | None:
    """The bytes per report of BENCHMARKS.md's store-memory section, with its wording."""
    if not BENCHMARKS_FILE.exists():
        return None
    text = BENCHMARKS_FILE.read_text()
    section = re.search(
        rf"<!-- section: {STORE_MEMORY_SECTION} -->(.*?)<!-- end: {STORE_MEMORY_SECTION} -->",
        text,
        re.DOTALL,
    )
    if section is None:
        return None
    # Its table's row of the default settings: | default (counts only) | reports | bytes | ...
    figure = re.search(r"^\| default[^|]*\|[^|]*\|\s*([\d.]+)\s*\|", section.group(1), re.M)
    if figure is None:
        return None
    return float(figure.group(1)), "the store-memory section of BENCHMARKS.md (10^6 reports)"


def _share(values: list[int]) -> str:
    total = sum(values)
    if not total:
        return "n/a"
    shares = [v / total for v in values]
    ratio = max(values) / min(values) if min(values) else float("inf")
    return f"{' / '.join(f'{s:.0%}' for s in shares)} (max/min {ratio:.2f})"


def markdown(stores: list[StoreFigures], args: argparse.Namespace) -> str:
    header = "| | " + " | ".join(s.name for s in stores) + " |"
    lines = [header, "|---|" + "---|" * len(stores)]

    def row(label: str, render) -> None:
        lines.append(f"| {label} | " + " | ".join(render(s) for s in stores) + " |")

    row("masters", lambda s: str(s.masters))
    row("ingest throughput (batches of 100, HTTP)", lambda s: f"{s.reports_per_s:,.0f} reports/s")
    row(
        "Redis commands per report (all masters)",
        lambda s: f"{s.per_report(sum(s.commands.values())):.2f}",
    )
    row(
        "... of which the top three",
        lambda s: ", ".join(
            f"{name} {s.per_report(n):.2f}" for name, n in s.commands.most_common(3)
        ),
    )
    row(
        "Redis memory per report (used_memory delta)",
        lambda s: f"{s.per_report(s.memory_bytes):.1f} B",
    )
    row("Redis CPU per report", lambda s: f"{s.per_report(s.redis_cpu_s) * 1e6:.1f} µs")
    row("aggregator CPU per report", lambda s: f"{s.per_report(s.aggregator_cpu_s) * 1e6:.1f} µs")
    row("campaign keys per master", lambda s: _share(s.keys_per_master))
    row(
        f"shards per master ({args.shards} shards)",
        lambda s: _share(s.slots_per_master) if len(s.slots_per_master) > 1 else "one node",
    )
    row(
        "memory growth per master",
        lambda s: _share(s.memory_per_master) if len(s.memory_per_master) > 1 else "one node",
    )
    row(
        f"estimate, {args.shards} shards vs 1 (ms, median of {ESTIMATE_REPEATS}, recomputed)",
        lambda s: f"{s.estimate_ms[SHARDED]:.1f} vs {s.estimate_ms[UNSHARDED]:.1f}",
    )
    row(
        f"counts read, {args.shards} shards vs 1 (ms, median)",
        lambda s: f"{s.counts_ms[SHARDED]:.1f} vs {s.counts_ms[UNSHARDED]:.1f}",
    )
    lines += [
        "",
        f"{args.reports:,} reports per store from {args.clients} client threads to 2 "
        f"`ldp-aggregator serve` processes x {args.workers} workers; everything (clients, "
        "servers, 1 or 6 Redis processes) on the same 2 shared cores, so the throughput "
        "compares the stores' costs on one machine, not the scale-out a cluster of hosts "
        "gives. Timings are single runs on a shared machine. Memory per report at "
        f"{args.reports:,} reports still carries the deduplication sets' per-key cost, "
        "which more reports share (the campaigns have the default quota, 10^7 reports, "
        "which sizes their buckets).",
    ]
    return "\n".join(lines)


def cores(amount: float) -> str:
    """``amount`` worker cores, rounded up, in words."""
    whole = max(1, math.ceil(amount))
    return f"{whole} worker core{'s' if whole > 1 else ''} ({amount:.2f} busy)"


def capacity_model(cluster: StoreFigures, bytes_per_report: float, source: str) -> str:
    """Nodes, memory and reports/s for 10^9 reports, from the measured per-report costs."""
    data_gb = REPORTS_TARGET * bytes_per_report / 1e9
    usable_gb = NODE_MEMORY_GB * HIGH_WATER
    masters = max(3, math.ceil(data_gb / usable_gb))
    redis_core_rate = 1 / cluster.per_report(cluster.redis_cpu_s)
    aggregator_core_rate = 1 / cluster.per_report(cluster.aggregator_cpu_s)
    return "\n".join(
        [
            f"**Capacity model for 10^9 reports** (per-report memory {bytes_per_report:.1f} B "
            f"from {source}; CPU per report measured above on the cluster):",
            "",
            f"- memory: 10^9 x {bytes_per_report:.1f} B = {data_gb:,.1f} GB of reports' state "
            f"on the masters, as much again on their replicas; with {NODE_MEMORY_GB} GB "
            f"nodes filled to the {HIGH_WATER:.0%} high-water mark: {masters} masters + "
            f"{masters} replicas (a campaign needs at least as many shards as masters; "
            "16 covers up to 16), about "
            f"{1e9 * usable_gb / bytes_per_report / 1e9:,.1f} x 10^9 reports per master.",
            f"- Redis: {cluster.per_report(cluster.redis_cpu_s) * 1e6:.1f} µs of CPU per report "
            f"in batches of 100, about {redis_core_rate:,.0f} reports/s per master (one core "
            f"each); {masters} masters: about {masters * redis_core_rate:,.0f} reports/s.",
            f"- aggregator: {cluster.per_report(cluster.aggregator_cpu_s) * 1e6:.1f} µs of CPU "
            f"per report, about {aggregator_core_rate:,.0f} reports/s per worker core; "
            f"10^9 reports in a day (11,574 reports/s on average) need "
            f"{cores(REPORTS_TARGET / 86400 / aggregator_core_rate)}, in a week "
            f"{cores(REPORTS_TARGET / 7 / 86400 / aggregator_core_rate)}.",
            "- Per-report CPU was measured with every process on 2 shared cores; on dedicated "
            "hosts it is lower, so these counts are upper bounds. Single reports cost the "
            "aggregator several times a batched report's CPU (BENCHMARKS.md, ingest).",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per process")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ldp-bench-cluster-"))
    try:
        with single_node(base / "single") as url:
            single = measure_store("1 node", url, args, base / "logs", cluster=False)
        with clusterlib.local_cluster(base / "cluster") as url:
            cluster = measure_store("3-master cluster", url, args, base / "logs", cluster=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    table = markdown([single, cluster], args)
    stored = stored_bytes_per_report()
    if stored is None:
        stored = (
            cluster.per_report(cluster.memory_bytes),
            f"this run's used_memory delta over {cluster.reports:,} reports on the cluster "
            "(BENCHMARKS.md has no store-memory figure at 10^6 reports yet)",
        )
    model = capacity_model(cluster, *stored)
    text = f"### Scale-out: one Redis node vs a 3-master cluster\n\n{table}\n\n{model}"
    print(text)
    if not args.no_write:
        write_section("scale-out", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

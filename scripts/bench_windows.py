"""Windows, trends and comparisons: what they cost on a real server, and the comparison's coverage.

    python scripts/bench_windows.py [--days 35] [--per-day 10000] [--repeats 10]
        [--pairs 500] [--no-write]

**Cost.** Starts ``ldp-aggregator serve`` (one gevent worker) on an embedded Redis
that this script also opens, creates a k-RR campaign over k = 1,000 labels
counted by day (epsilon 2, 16 shards), and stores ``--per-day`` reports on each
of the last ``--days`` days, received at that day's time (a Zipf(1.1)
population whose ranking drifts by one label a day). It then times, as a
client sees them over HTTP:

* the estimate of a 7-day window (``since``/``until``): the first request for
  a past week, the same after a new report today, the last 7 days after a new
  report in them, and cached;
* the trend of the last 30 days for the top 10 labels, with every period's
  estimate cold, after one new report, and cached;
* the comparison of two 7-day windows, computed and cached;
* the all-time estimate after a new report, for reference.

Each figure is the median (and the largest) of ``--repeats`` requests.

**Coverage.** The comparison's interval (``aggregator/http/trends.py``) on
simulated pairs of windows of the same campaign: window a's reports from one
population, window b's from another, ``--pairs`` pairs; the share of intervals
holding the true difference ``p_b - p_a``, over every category, and the share of
the categories that did change that are marked ``excludes_zero``. Run for k-RR
(k = 10, the inversion's variance) and the geometric mechanism (IBU, the
intervals' widths).

Writes sections ``windows`` and ``window-comparison-coverage`` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for, default_method, poisoning  # noqa: E402
from aggregator.http.estimates import count_vector, estimate_response  # noqa: E402
from aggregator.http.trends import comparison_body  # noqa: E402
from aggregator.http.windows import WindowRead  # noqa: E402
from aggregator.storage import periods  # noqa: E402
from aggregator.storage.ingest import StoredReport  # noqa: E402
from aggregator.storage.periods import Window  # noqa: E402
from aggregator.storage.redis_server import EmbeddedRedis  # noqa: E402
from aggregator.storage.store import Campaign, CampaignStore  # noqa: E402
from scripts.benchlib import free_port, write_section  # noqa: E402
from shared.mechanisms import Mechanism  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghijklmnop"
ANALYST_TOKEN = "bench-analyst-token-0123456789abcdefghijklmnop"
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
K = 1000
SPEC = {
    "id": "window-bench",
    "title": "k-RR, k = 1,000, by day (benchmark)",
    "mechanism": "krr",
    "epsilon": 2.0,
    "domain": [f"v{i:04d}" for i in range(K)],
    "period": "day",
}
DAY_S = 86_400
BATCH = 1000
# Targets of the issue: a 7-period window of a k = 1,000 campaign, a 30-period trend of 10.
WINDOW_TARGET_S = 0.2
TREND_TARGET_S = 1.0


def start_server(data_dir: Path, redis_url: str, **settings: str) -> tuple[subprocess.Popen, str]:
    """``ldp-aggregator serve`` (one worker) on the Redis at ``redis_url``, with ``settings``
    (``ESTIMATE_TIMEOUT_S="2"``: ``LDP_ESTIMATE_TIMEOUT_S=2``); its API's URL."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
        "LDP_ANALYST_TOKEN": ANALYST_TOKEN,
        "LDP_RATELIMIT_ENABLED": "false",
        "LDP_REDIS_URL": redis_url,
        **{f"LDP_{name}": value for name, value in settings.items()},
    }
    port = free_port()
    log = (data_dir / "server.log").open("wb")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "aggregator.cli", "serve"),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((data_dir / "server.log").read_text(errors="replace"))
        try:
            if requests.get(f"{api}/health", timeout=1).status_code == 200:
                return process, api
        except requests.RequestException:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not start")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def population(day: int) -> np.ndarray:
    """Zipf(1.1) over the labels, its ranking moved by one label a day."""
    weights = 1.0 / np.arange(1, K + 1) ** 1.1
    return np.roll(weights / weights.sum(), day)


def fill(store: CampaignStore, days: int, per_day: int, now: float, seed: int) -> None:
    """About ``per_day`` reports (0.8 to 1.2 times, so that each day's n is its own) received
    on each of the last ``days`` days and today, at that day's time."""
    spec = CampaignSpec.from_dict(SPEC)
    store.create_campaign(spec, now=now - days * DAY_S)
    mechanism = Mechanism.from_spec(spec)
    channel = channel_for(mechanism)
    rng = np.random.default_rng(seed)
    for day in range(days, -1, -1):
        moment = now - day * DAY_S
        shares = channel.forward(population(days - day))
        size = int(rng.integers(int(0.8 * per_day), int(1.2 * per_day) + 1))
        outputs = rng.choice(K, size=size, p=shares / shares.sum())
        for start in range(0, size, BATCH):
            chunk = [
                StoredReport(str(uuid.uuid4()), int(y), SPEC["domain"][y])
                for y in outputs[start : start + BATCH]
            ]
            store.ingest(SPEC["id"], chunk, now=moment)


def drop_cache(connection: redis.Redis) -> None:
    keys = list(connection.scan_iter(match=f"ldp:{{c:{SPEC['id']}}}:estimate:*", count=1000))
    if keys:
        connection.delete(*keys)


def timed(
    api: str,
    path: str,
    params: Callable[[int], dict],
    repeats: int,
    before: Callable[[], None] | None = None,
    cache: str | None = None,
) -> dict[str, Any]:
    """Median and largest wall time of ``repeats`` GETs (the i-th with ``params(i)``), each
    after ``before``; ``cache`` is the X-Estimate-Cache each must answer, if any."""
    times, body = [], None
    session = requests.Session()
    for i in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        response = session.get(
            f"{api}/campaigns/{SPEC['id']}/{path}",
            params=params(i),
            headers=ANALYST,
            timeout=120,
        )
        times.append(time.perf_counter() - started)
        response.raise_for_status()
        got = response.headers.get("X-Estimate-Cache")
        assert cache is None or got == cache, (path, got, cache)
        body = response.json()
    return {"median": statistics.median(times), "max": max(times), "body": body}


def bench_costs(days: int, per_day: int, repeats: int, seed: int) -> list[tuple[str, dict, str]]:
    rows: list[tuple[str, dict, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        with EmbeddedRedis(data_dir / "redis", appendfsync="no", maxmemory=0) as server:
            connection = redis.Redis.from_url(server.url)
            store = CampaignStore(connection)
            now = time.time()
            fill(store, days, per_day, now, seed)
            process, api = start_server(data_dir, server.url)
            try:
                rows = _costs(api, connection, now, repeats)
                rows += _parts(store, now, repeats)
            finally:
                stop_server(process)
                connection.close()
    return rows


def _costs(api: str, connection: redis.Redis, now: float, repeats: int) -> list:
    today = periods.key_at(periods.DAY, now)

    def day(offset: int) -> str:
        return periods.shifted(periods.DAY, today, offset)

    def week(end: int) -> dict:
        """The 7 days ending ``end`` days from today."""
        return {"since": day(end - 6), "until": day(end)}

    def new_report() -> None:
        y = int(np.random.default_rng().integers(K))
        report = {"report_id": str(uuid.uuid4()), "value": SPEC["domain"][y]}
        answer = requests.post(f"{api}/campaigns/{SPEC['id']}/reports", json=report, timeout=30)
        answer.raise_for_status()

    def cold() -> None:
        drop_cache(connection)

    # The worker's first estimate builds what every later one reuses (the channel, imports).
    timed(api, "estimate", lambda i: {}, 1)
    rows = []
    # A different past week each time: its own n, so nothing of it is cached in the process.
    rows.append(
        (
            "7-day window estimate, first request (a past week; its own n)",
            timed(api, "estimate", lambda i: week(-1 - i), repeats, None, "miss"),
            "window",
        )
    )
    rows.append(
        (
            "7-day window estimate, after a new report today (a past week: counts unchanged)",
            timed(api, "estimate", lambda i: week(-1), repeats, new_report, "hit"),
            "window",
        )
    )
    rows.append(
        (
            "7-day window estimate, after a new report in it (the last 7 days: a new n)",
            timed(api, "estimate", lambda i: week(0), repeats, new_report, "miss"),
            "window",
        )
    )
    rows.append(
        (
            "7-day window estimate, cached",
            timed(api, "estimate", lambda i: week(-1), repeats, None, "hit"),
            "window",
        )
    )
    trend = {"periods": 30, "top": 10}
    label = "30-day trend, top 10"
    rows.append(
        (
            label + ", every period computed",
            timed(api, "trend", lambda i: trend, repeats, cold),
            "trend",
        )
    )
    rows.append(
        (
            label + ", after a new report today",
            timed(api, "trend", lambda i: trend, repeats, new_report),
            "trend",
        )
    )
    rows.append((label + ", cached", timed(api, "trend", lambda i: trend, repeats), "trend"))

    def pair(i: int) -> dict:
        a, b = week(-8 - i), week(-1 - i)
        return {"a_since": a["since"], "a_until": a["until"]} | {
            "b_since": b["since"],
            "b_until": b["until"],
        }

    name = "comparison of two 7-day windows"
    rows.append((name + ", computed", timed(api, "compare", pair, repeats, None, "miss"), ""))
    rows.append(
        (name + ", cached", timed(api, "compare", lambda i: pair(0), repeats, None, "hit"), "")
    )
    rows.append(
        (
            "all-time estimate, after a new report (reference)",
            timed(api, "estimate", lambda i: {}, repeats, new_report, "miss"),
            "",
        )
    )
    return rows


def _parts(store: CampaignStore, now: float, repeats: int) -> list:
    """In this process, on the same store: the parts of a first 7-day window estimate."""
    campaign = store.get_campaign(SPEC["id"])
    today = periods.key_at(periods.DAY, now)
    read_s, estimate_s, check_s = [], [], []
    body: dict = {}
    for i in range(repeats):
        # Weeks the server was not asked for: their n are new to this process too.
        until = periods.shifted(periods.DAY, today, -20 - i)
        keys = Window(periods.DAY, periods.shifted(periods.DAY, until, -6), until).period_keys()
        started = time.perf_counter()
        counts = store.window_counts(SPEC["id"], keys)
        read_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        body = estimate_response(
            campaign, counts, default_method(campaign.mechanism), 0.95, poisoning_check=False
        )
        estimate_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        poisoning.check(campaign.mechanism, count_vector(counts, K))
        check_s.append(time.perf_counter() - started)

    def row(name: str, times: list[float]) -> tuple[str, dict, str]:
        return (name, {"median": statistics.median(times), "max": max(times), "body": body}, "")

    return [
        row("of a first window estimate: reading and summing its 7 x 16 shard-days", read_s),
        row("of a first window estimate: the estimate and its body, without the check", estimate_s),
        row("of a first window estimate: the poisoning check (its n new)", check_s),
    ]


def reports(body: dict) -> int:
    """The reports a body is over (a comparison's: both windows')."""
    if "n" in body:
        return int(body["n"])
    return int(body["a"]["n"]) + int(body["b"]["n"])


def costs_section(rows: list[tuple[str, dict, str]], days: int, per_day: int) -> str:
    lines = ["| request | median | largest | n | target |", "|---|---:|---:|---:|---|"]
    for name, result, kind in rows:
        target = {"window": WINDOW_TARGET_S, "trend": TREND_TARGET_S}.get(kind)
        verdict = ""
        if target is not None:
            verdict = f"< {target:g} s: {'met' if result['max'] < target else 'missed'}"
        lines.append(
            f"| {name} | {result['median'] * 1000:,.1f} ms | {result['max'] * 1000:,.1f} ms | "
            f"{reports(result['body']):,} | {verdict} |"
        )
    notes = (
        f"A k-RR campaign over k = 1,000 labels counted by day, about {per_day:,} reports "
        f"(0.8 to 1.2 times) received on each of {days + 1} days (16 shards; every shard's "
        "day is dense), served by `ldp-aggregator serve` with one gevent worker on the "
        "embedded Redis; wall time of the client's GET, median and largest of the repeats, "
        "after one all-time estimate has warmed the worker. An estimate of a window of past "
        "periods does not change when reports arrive today: it is found by its counts' digest. "
        "Every estimate of the estimate endpoint, windowed or not, runs the poisoning check, "
        "whose simulation of the noise floor (`aggregator/estimation/poisoning.py`) takes "
        "most of a first request at k = 1,000 for each new n (last row). The trend's "
        "estimates leave the check out (it does not show it): computed, it reads its 30 days "
        "in one pipeline and runs 31 estimates; after a new report it recomputes today's and "
        "the whole window's and finds the 29 others by their counts' digest. The last three "
        "rows time the parts of a first window estimate in the benchmark's own process, on "
        "weeks the server was not asked for. n is the "
        "window's reports (the trend's: its whole window's; the comparison's: both windows')."
    )
    return "\n".join(lines) + "\n\n" + notes


def simulated_coverage(
    spec: dict,
    shares: tuple[np.ndarray, np.ndarray],
    n: int,
    pairs: int,
    confidence: float,
    seed: int,
) -> dict[str, Any]:
    """Coverage of the comparison's intervals over ``pairs`` simulated pairs of windows."""
    parsed = CampaignSpec.from_dict(spec)
    mechanism = Mechanism.from_spec(parsed)
    campaign = Campaign(parsed, "open", 0.0, 0, mechanism)
    channel = channel_for(mechanism)
    rng = np.random.default_rng(seed)
    truth = shares[1] - shares[0]
    windows = (
        WindowRead(Window("day", "2026-11-01", "2026-11-07"), None),
        WindowRead(Window("day", "2026-11-08", "2026-11-14"), None),
    )
    covered = flagged = changed = total = 0
    method = ""
    for _ in range(pairs):
        counts = []
        for p in shares:
            q = channel.forward(p)
            drawn = rng.multinomial(n, q / q.sum())
            counts.append({y: int(c) for y, c in enumerate(drawn) if c})
        body = comparison_body(
            campaign,
            (counts[0], counts[1]),
            _method(mechanism),
            confidence,
            windows,
            channel=channel,
        )
        method = body["interval_method"].split(";")[0]
        for row, true in zip(body["differences"], truth, strict=True):
            covered += row["ci_low"] <= true <= row["ci_high"]
            total += 1
            if abs(true) > 1e-12:
                changed += 1
                flagged += row["excludes_zero"]
    return {
        "coverage": covered / total,
        "intervals": total,
        "power": flagged / max(changed, 1),
        "changed": changed,
        "method": method,
    }


def _method(mechanism: Mechanism) -> str:
    from aggregator.estimation import default_method

    return default_method(mechanism)


def coverage_section(pairs: int, seed: int) -> str:
    krr = {
        "id": "c",
        "title": "c",
        "mechanism": "krr",
        "epsilon": 1.0,
        "domain": [f"l{i}" for i in range(10)],
    }
    krr_a = np.array([0.25, 0.2, 0.15, 0.1, 0.08, 0.07, 0.06, 0.04, 0.03, 0.02])
    krr_b = np.array([0.2, 0.2, 0.17, 0.1, 0.1, 0.07, 0.06, 0.05, 0.03, 0.02])
    geometric = {
        "id": "g",
        "title": "g",
        "mechanism": "geometric",
        "epsilon": 0.5,
        "lo": 0,
        "hi": 30,
    }
    x = np.arange(31)
    bell_a = np.exp(-0.5 * ((x - 12) / 4) ** 2)
    bell_b = np.exp(-0.5 * ((x - 14) / 4) ** 2)
    cases = [
        ("k-RR, k = 10, epsilon 1", krr, (krr_a, krr_b), 20_000),
        (
            "geometric, 0..30, epsilon 0.5 per unit",
            geometric,
            (bell_a / bell_a.sum(), bell_b / bell_b.sum()),
            5000,
        ),
    ]
    confidence = 0.95
    lines = [
        "| campaign | reports per window | pairs | intervals | coverage | 99.9% band | changed categories marked | interval |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for name, spec, shares, n in cases:
        result = simulated_coverage(spec, shares, n, pairs, confidence, seed)
        half = 3.29 * math.sqrt(confidence * (1 - confidence) / result["intervals"])
        band = f"{confidence - half:.3f} to {confidence + half:.3f}"
        lines.append(
            f"| {name} | {n:,} | {pairs} | {result['intervals']:,} | {result['coverage']:.3f} | "
            f"{band} | {result['power']:.2f} of {result['changed'] // pairs} | {result['method']} |"
        )
    notes = (
        "Each pair: window a's reports drawn from population a through the mechanism, window "
        "b's from population b; the comparison (`GET .../compare`'s body, default method, "
        "confidence 0.95) computed from their counts. Coverage is the share of all intervals, "
        "every category of every pair, that hold the true difference p_b - p_a; the band is "
        "0.95 +- 3.29 binomial standard errors for that many intervals (the categories of one "
        'pair are not independent, so it is a guide, not a test). "Changed categories '
        'marked" is the share of the categories whose share did change that are marked '
        "`excludes_zero` (the changes are 0.5 to 5 points of share). "
        "`tests/aggregator/test_windows.py` runs the k-RR case with 200 pairs as a test."
    )
    return "\n".join(lines) + "\n\n" + notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=35)
    parser.add_argument("--per-day", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args()
    costs = costs_section(
        bench_costs(options.days, options.per_day, options.repeats, options.seed),
        options.days,
        options.per_day,
    )
    print(costs)
    coverage = coverage_section(options.pairs, options.seed)
    print(coverage)
    if not options.no_write:
        write_section("windows", costs)
        write_section("window-comparison-coverage", coverage)


if __name__ == "__main__":
    main()

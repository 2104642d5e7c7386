"""Estimate endpoint benchmark: cold, recomputed and cached estimates on a real server.

Starts ``ldp-aggregator serve`` (one gevent worker, embedded Redis in a temporary
directory), seeds campaigns through the HTTP API and times
``GET /api/v1/campaigns/<id>/estimate`` (default method and confidence) as a
client sees it:

* a 64 x 64 planar Laplace campaign (100 m cells, epsilon ln 2 per 100 m) with
  100,000 reports from a clustered population;
* a k-RR campaign with k = 1,000 (epsilon 2, Zipf(1.1) truth) with 100,000 reports.

For each: the first request (cache miss; the worker also builds the channel),
a recomputation after one more report (miss, channel already built; median of
``--repeats``), and a cached answer (hit; median of 10). The work units one
estimate charges (:mod:`aggregator.estimation.budget`) are counted in-process on
the same counts, to compare with ``LDP_ESTIMATE_MAX_WORK``.

With ``--big`` it also asks a second server, whose time limit is
``--big-timeout-s``, for the estimate of a 512 x 512 planar campaign and
records how long the answer took and its status (503 when the limit stopped
it); a request still unanswered after ``--big-wait-s`` is recorded as such.

Writes section ``estimates`` of ``BENCHMARKS.md`` (``--no-write``: print only)::

    python scripts/bench_estimates.py --big
"""

from __future__ import annotations

import argparse
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import budget  # noqa: E402
from aggregator.estimation.decision import default_method  # noqa: E402
from aggregator.http.estimates import (  # noqa: E402
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_WORK,
    DEFAULT_TIMEOUT_S,
    estimate_response,
)
from aggregator.storage.store import Campaign  # noqa: E402
from scripts.benchlib import free_port, write_section  # noqa: E402
from shared.mechanisms import Mechanism  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

ADMIN_TOKEN = secrets.token_urlsafe(32)
ANALYST_TOKEN = secrets.token_urlsafe(32)
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
BATCH = 1000
CACHED_REPEATS = 10
# 100 m cells; a degree of latitude is about 111.2 km, of longitude cos(37.77 deg) of that.
_LAT_PER_M = 1 / 111_195
_LON_PER_M = 1 / (111_195 * math.cos(math.radians(37.77)))


def square_region(cells: int, cell_m: float) -> dict[str, float]:
    """A square region of ``cells`` x ``cells`` cells of ``cell_m`` metres."""
    side = cells * cell_m * 0.999
    return {
        "lat_min": 37.70,
        "lat_max": 37.70 + side * _LAT_PER_M,
        "lon_min": -122.50,
        "lon_max": -122.50 + side * _LON_PER_M,
    }


def grid_spec(campaign_id: str, cells: int, cell_m: float = 100.0) -> dict[str, Any]:
    """A planar campaign of ``cells`` x ``cells`` cells of ``cell_m`` metres (ln 2 per 100 m)."""
    return {
        "id": campaign_id,
        "title": f"{cells} x {cells} grid (benchmark)",
        "mechanism": "planar_laplace",
        "epsilon": math.log(2) / 100,
        "region": square_region(cells, cell_m),
        "cell_size_m": cell_m,
    }


def krr_spec(campaign_id: str, k: int) -> dict[str, Any]:
    return {
        "id": campaign_id,
        "title": f"k-RR, k = {k} (benchmark)",
        "mechanism": "krr",
        "epsilon": 2.0,
        "domain": [f"v{i:04d}" for i in range(k)],
    }


def clustered_points(spec: dict, n: int, rng: random.Random) -> list[dict[str, float]]:
    """Points of a city with 8 Gaussian hotspots (sd 150-500 m) and 10% uniform background."""
    region = spec["region"]
    hotspots = [
        (
            rng.uniform(region["lat_min"], region["lat_max"]),
            rng.uniform(region["lon_min"], region["lon_max"]),
            rng.uniform(150, 500),
        )
        for _ in range(8)
    ]
    points = []
    while len(points) < n:
        if rng.random() < 0.1:
            lat = rng.uniform(region["lat_min"], region["lat_max"])
            lon = rng.uniform(region["lon_min"], region["lon_max"])
        else:
            lat0, lon0, sd = rng.choice(hotspots)
            lat = rng.gauss(lat0, sd * _LAT_PER_M)
            lon = rng.gauss(lon0, sd * _LON_PER_M)
        if (
            region["lat_min"] <= lat < region["lat_max"]
            and region["lon_min"] <= lon < (region["lon_max"])
        ):
            points.append({"lat": lat, "lon": lon})
    return points


def zipf_values(spec: dict, n: int, rng: random.Random) -> list[str]:
    domain = spec["domain"]
    weights = [1 / (i + 1) ** 1.1 for i in range(len(domain))]
    return rng.choices(domain, weights, k=n)


@dataclass
class Server:
    process: subprocess.Popen
    port: int

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(data_dir: Path, **settings: str) -> Server:
    """``ldp-aggregator serve`` with one worker and its own embedded Redis in ``data_dir``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LDP_ADMIN_TOKEN": ADMIN_TOKEN,
        "LDP_ANALYST_TOKEN": ANALYST_TOKEN,
        "LDP_RATELIMIT_ENABLED": "false",
        # Every report comes from this one address.
        "LDP_REPORT_BUDGET": "1000000000 per hour",
        **{f"LDP_{name}": value for name, value in settings.items()},
    }
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "aggregator.cli", "--data-dir", str(data_dir), "serve"),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(data_dir.parent / f"{data_dir.name}.log").open("wb"),
    )
    server = Server(process, port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (data_dir.parent / f"{data_dir.name}.log").read_text(errors="replace")
            raise RuntimeError(f"the server exited with status {process.returncode}:\n{log}")
        try:
            if requests.get(f"{server.api}/health", timeout=1).status_code == 200:
                return server
        except requests.RequestException:  # refused, or accepted before a worker booted
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("the server did not start")


def seed_campaign(server: Server, spec: dict, values: list, rng: random.Random) -> Mechanism:
    """Create the campaign and post every value perturbed, in batches."""
    response = requests.post(f"{server.api}/campaigns", json=spec, headers=ADMIN, timeout=30)
    response.raise_for_status()
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
    post_reports(server, spec["id"], [mechanism.perturb(value, rng) for value in values])
    return mechanism


def post_reports(server: Server, campaign_id: str, reports: list) -> None:
    session = requests.Session()
    for start in range(0, len(reports), BATCH):
        body = {
            "reports": [
                {"report_id": str(uuid.uuid4()), "value": value}
                for value in reports[start : start + BATCH]
            ]
        }
        answer = session.post(
            f"{server.api}/campaigns/{campaign_id}/reports", json=body, timeout=60
        )
        answer.raise_for_status()


@dataclass
class Timed:
    seconds: float
    status: int
    cache: str | None
    body: dict | None


def get_estimate(server: Server, campaign_id: str, timeout_s: float) -> Timed:
    started = time.perf_counter()
    response = requests.get(
        f"{server.api}/campaigns/{campaign_id}/estimate", headers=ANALYST, timeout=timeout_s
    )
    elapsed = time.perf_counter() - started
    return Timed(
        elapsed, response.status_code, response.headers.get("X-Estimate-Cache"), response.json()
    )


def work_units(spec: dict, server: Server) -> int:
    """The units one default estimate charges, counted in this process on the stored counts."""
    counts_body = requests.get(
        f"{server.api}/campaigns/{spec['id']}/counts", headers=ANALYST, timeout=60
    ).json()
    counts = {i: row["count"] for i, row in enumerate(counts_body["counts"]) if row["count"]}
    parsed = CampaignSpec.from_dict(spec)
    campaign = Campaign(parsed, "open", 0.0, 0, Mechanism.from_spec(parsed))
    with budget.limited():
        estimate_response(campaign, counts, default_method(campaign.mechanism), DEFAULT_CONFIDENCE)
        return budget.spent()


def bench_campaign(
    server: Server, spec: dict, values: list, repeats: int, rng: random.Random
) -> dict[str, Any]:
    mechanism = seed_campaign(server, spec, values, rng)
    first = get_estimate(server, spec["id"], 600)
    if first.status != 200:
        raise RuntimeError(f"{spec['id']}: {first.status} {first.body}")
    recomputed, computed_s = [], []
    for i in range(repeats):
        post_reports(server, spec["id"], [mechanism.perturb(values[i], rng)])
        timed = get_estimate(server, spec["id"], 600)
        assert timed.status == 200 and timed.cache == "miss", (timed.status, timed.cache)
        recomputed.append(timed.seconds)
        computed_s.append(timed.body["seconds"])
    cached = []
    for _ in range(CACHED_REPEATS):
        timed = get_estimate(server, spec["id"], 60)
        assert timed.status == 200 and timed.cache == "hit", (timed.status, timed.cache)
        cached.append(timed.seconds)
    return {
        "first_s": first.seconds,
        "recomputed_s": statistics.median(recomputed),
        "estimator_s": statistics.median(computed_s),
        "cached_s": statistics.median(cached),
        "n_iter": first.body.get("n_iter"),
        "interval_method": first.body.get("interval_method"),
        "estimator": first.body.get("estimator", "(not reported)"),
        "units": work_units(spec, server),
    }


def bench_big(data_dir: Path, timeout_s: float, wait_s: float, rng: random.Random) -> str:
    """How a 512 x 512 planar estimate ends on a server with the given time limit."""
    server = start_server(data_dir, ESTIMATE_TIMEOUT_S=str(timeout_s))
    try:
        spec = grid_spec("grid512", 512, 100.0)
        seed_campaign(server, spec, clustered_points(spec, 5000, rng), rng)
        started = time.perf_counter()
        try:
            timed = get_estimate(server, spec["id"], wait_s)
        except requests.Timeout:
            return f"no answer within {wait_s:g} s (the estimate was not stopped)"
        body = timed.body or {}
        error = body.get("error", {})
        ended = (
            f"{timed.status} {error.get('code', '')} after {time.perf_counter() - started:.1f} s"
        ).replace("  ", " ")
        if "seconds" in body:  # finished: how much of the wait was the estimate itself
            ended += f" (the estimate itself {body['seconds']:.1f} s)"
        return ended
    finally:
        server.stop()  # also ends an estimate still computing in its worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="reports per campaign")
    parser.add_argument("--repeats", type=int, default=3, help="recomputations per campaign")
    parser.add_argument("--big", action="store_true", help="also a 512 x 512 campaign")
    parser.add_argument("--big-timeout-s", type=float, default=2.0)
    parser.add_argument("--big-wait-s", type=float, default=90.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    rng = random.Random(2024)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-estimates-") as tmp:
        server = start_server(Path(tmp) / "main")
        try:
            grid = grid_spec("grid64", 64)
            results["planar 64 x 64, 100 m cells, eps ln2/100 m"] = bench_campaign(
                server, grid, clustered_points(grid, args.n, rng), args.repeats, rng
            )
            krr = krr_spec("krr1000", 1000)
            results["k-RR k = 1,000, eps 2, Zipf(1.1)"] = bench_campaign(
                server, krr, zipf_values(krr, args.n, rng), args.repeats, rng
            )
        finally:
            server.stop()
        big = (
            bench_big(Path(tmp) / "big", args.big_timeout_s, args.big_wait_s, rng)
            if args.big
            else None
        )
    lines = [
        f"### Estimate endpoint (`GET .../estimate`, default method and confidence, n = {args.n:,} "
        "reports; one gevent worker, embedded Redis; client wall time)",
        "",
        "| campaign | first request (miss, builds channel) | recomputed after 1 report (miss) "
        "| estimator's own `seconds` | cached (hit) | work units | IBU iterations | intervals |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(
            f"| {name} | {row['first_s']:.2f} s | {row['recomputed_s']:.2f} s "
            f"| {row['estimator_s']:.2f} s | {row['cached_s'] * 1000:.1f} ms "
            f"| {row['units']:,} | {'—' if row['n_iter'] is None else row['n_iter']} "
            f"| {row['interval_method']} |"
        )
    lines += [
        "",
        f"Recomputed: median of {args.repeats}; cached: median of {CACHED_REPEATS}. "
        f"Estimator per response `estimator`: "
        + "; ".join(f"{name}: {row['estimator']}" for name, row in results.items())
        + f". Default limits: {DEFAULT_MAX_WORK:,} work units, {DEFAULT_TIMEOUT_S:g} s. "
        f"Threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}.",
    ]
    if big is not None:
        lines += [
            "",
            f"512 x 512 planar campaign (5,000 reports), server limit "
            f"LDP_ESTIMATE_TIMEOUT_S={args.big_timeout_s:g}: {big}. The time limit stops an "
            "estimate only where the estimation loops charge their work "
            "(`aggregator/estimation/budget.py`): building the channel and shaping the "
            "response are not limited, so a 200 can come after the limit when the estimate's "
            "own steps ended before it.",
        ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("estimates", text)


if __name__ == "__main__":
    main()

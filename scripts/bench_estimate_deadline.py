"""The estimate's time limit under load: how long after it a stopped estimate answers.

    python scripts/bench_estimate_deadline.py [--timeout-s 2] [--clients 12] [--rounds 3]
        [--reports 50000] [--no-write]

Starts ``ldp-aggregator serve`` (one gevent worker) with
``LDP_ESTIMATE_TIMEOUT_S=--timeout-s`` on an embedded Redis that this script also
opens, and stores ``--reports`` reports in each of five campaigns whose estimates
take longer than that limit for most methods (drawn through each mechanism's channel
from a spiky truth, a Dirichlet(0.05) draw over the values):

* planar Laplace over 256 x 256 and 128 x 128 cells of 100 m (epsilon ln 2 per 100 m);
* the Euclidean exponential mechanism over 64 x 64 cells of 100 m (epsilon 0.005 per m);
* the geometric mechanism over 0..99,999 (epsilon 0.1);
* k-RR over the 100 x 100 cells of 200 m of a region (epsilon 1).

Each round adds one report to every campaign (so that no estimate comes from the
cache) and then asks for every (campaign, method) kind at each of the offered
confidence levels, from ``--clients`` threads at once (more than the CPUs and than the
worker's 10 estimate threads: the server is under load), in a shuffled order. For
each request it records the status and its overrun: the client's wall time from
sending the request to reading the answer, minus the limit. An estimate asked for
while another request computes the very same one waits for it (503
``estimate_pending`` at the limit).

Writes section ``estimate-deadline`` of ``BENCHMARKS.md`` (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make the project importable
    sys.path.insert(0, str(ROOT))

from aggregator.estimation import channel_for  # noqa: E402
from aggregator.http.estimates import CONFIDENCE_LEVELS  # noqa: E402
from aggregator.storage.redis_server import EmbeddedRedis  # noqa: E402
from aggregator.storage.store import CampaignStore, StoredReport  # noqa: E402
from scripts.bench_estimates import square_region  # noqa: E402
from scripts.bench_windows import ANALYST, start_server, stop_server  # noqa: E402
from scripts.benchlib import write_section  # noqa: E402
from shared.mechanisms import Mechanism  # noqa: E402
from shared.spec import CampaignSpec  # noqa: E402

BATCH = 1000
# A request unanswered after this long counts as "no answer", with this wait as its time.
ANSWER_WAIT_S = 60.0


def grid_campaign(
    campaign_id: str, mechanism: str, cells: int, cell_m: float = 100.0, **fields: Any
) -> dict[str, Any]:
    """A campaign over ``cells`` x ``cells`` cells of ``cell_m`` metres."""
    return {
        "id": campaign_id,
        "title": f"{mechanism}, {cells} x {cells} cells (benchmark)",
        "mechanism": mechanism,
        "region": square_region(cells, cell_m),
        "cell_size_m": cell_m,
        **fields,
    }


@dataclass(frozen=True)
class Kind:
    """A campaign and the methods asked of it."""

    name: str
    spec: dict[str, Any]
    methods: tuple[str, ...]


KINDS = (
    Kind(
        "planar Laplace, 256 x 256 cells",
        grid_campaign("planar-256", "planar_laplace", 256, epsilon=math.log(2) / 100),
        ("ibu", "mle", "clip", "inversion"),
    ),
    Kind(
        "planar Laplace, 128 x 128 cells",
        grid_campaign("planar-128", "planar_laplace", 128, epsilon=math.log(2) / 100),
        ("ibu", "mle", "projection"),
    ),
    Kind(
        "exponential grid, 64 x 64 cells",
        grid_campaign("exponential-64", "exponential_grid", 64, epsilon=0.005, metric="euclidean"),
        ("ibu", "mle"),
    ),
    Kind(
        "geometric, 100,000 values",
        {
            "id": "geometric-100k",
            "title": "geometric, 0..99,999 (benchmark)",
            "mechanism": "geometric",
            "epsilon": 0.1,
            "lo": 0,
            "hi": 99_999,
        },
        ("ibu", "mle"),
    ),
    Kind(
        "k-RR over 100 x 100 cells",
        grid_campaign("krr-cells", "krr", 100, 200.0, epsilon=1.0),
        ("ibu", "smoothed_projection"),
    ),
)


def fill(store: CampaignStore, kind: Kind, reports: int, seed: int) -> None:
    """Create the campaign and store ``reports`` reports drawn through its channel."""
    spec = CampaignSpec.from_dict(kind.spec)
    store.create_campaign(spec)
    channel = channel_for(Mechanism.from_spec(spec))
    rng = np.random.default_rng(seed)
    truth = rng.dirichlet(np.full(channel.n_inputs, 0.05))
    shares = np.maximum(channel.forward(truth), 0.0)
    outputs = rng.choice(channel.n_outputs, size=reports, p=shares / shares.sum())
    for start in range(0, reports, BATCH):
        chunk = [StoredReport(str(uuid.uuid4()), int(y), None) for y in outputs[start:][:BATCH]]
        store.ingest(spec.id, chunk)


def one_more_report(store: CampaignStore, kind: Kind) -> None:
    """A new report, so that every estimate of the campaign is computed again."""
    store.ingest(kind.spec["id"], [StoredReport(str(uuid.uuid4()), 0, None)])


def requests_of_a_round(seed: int) -> list[tuple[Kind, str, float]]:
    """Every kind's methods at every confidence level, shuffled."""
    asked = [
        (kind, method, confidence)
        for kind in KINDS
        for method in kind.methods
        for confidence in CONFIDENCE_LEVELS
    ]
    random.Random(seed).shuffle(asked)
    return asked


def ask_all(
    api: str, asked: list[tuple[Kind, str, float]], clients: int
) -> list[tuple[Kind, str, float, str]]:
    """Send the requests from ``clients`` threads at once; (kind, method, seconds, outcome)
    for each, the outcome the status and, for an error, its code."""
    queue: Iterator[tuple[Kind, str, float]] = iter(asked)
    taking = threading.Lock()
    results: list[tuple[Kind, str, float, str]] = []

    def client() -> None:
        session = requests.Session()
        while True:
            with taking:
                item = next(queue, None)
            if item is None:
                return
            kind, method, confidence = item
            started = time.perf_counter()
            try:
                response = session.get(
                    f"{api}/campaigns/{kind.spec['id']}/estimate",
                    params={"method": method, "confidence": confidence},
                    headers=ANALYST,
                    timeout=ANSWER_WAIT_S,
                )
            except requests.Timeout:
                outcome = "no answer"
                session = requests.Session()  # the old connection still waits for its answer
            else:
                outcome = str(response.status_code)
                if response.status_code != 200:
                    outcome += " " + response.json()["error"]["code"]
            elapsed = time.perf_counter() - started
            with taking:
                results.append((kind, method, elapsed, outcome))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def run(timeout_s: float, clients: int, rounds: int, reports: int, seed: int) -> list:
    results: list[tuple[Kind, str, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        with EmbeddedRedis(data_dir / "redis", appendfsync="no", maxmemory=0) as server:
            connection = redis.Redis.from_url(server.url)
            store = CampaignStore(connection)
            for number, kind in enumerate(KINDS):
                fill(store, kind, reports, seed + number)
            process, api = start_server(data_dir, server.url, ESTIMATE_TIMEOUT_S=f"{timeout_s:g}")
            try:
                for round_number in range(rounds):
                    for kind in KINDS:
                        one_more_report(store, kind)
                    asked = requests_of_a_round(seed + round_number)
                    results += ask_all(api, asked, clients)
                    print(
                        f"round {round_number + 1} of {rounds}: {len(asked)} requests", flush=True
                    )
            finally:
                stop_server(process)
                connection.close()
    return results


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def table(results: list, timeout_s: float) -> str:
    lines = [
        "| kind | method | requests | answers | overrun median | p90 | max |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    # In the order of KINDS and their methods.
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {
        (kind.name, method): [] for kind in KINDS for method in kind.methods
    }
    for kind, method, elapsed, outcome in results:
        groups.setdefault((kind.name, method), []).append((elapsed - timeout_s, outcome))
    rows = [(key, group) for key, group in groups.items() if group]
    rows.append((("all", ""), [answer for group in groups.values() for answer in group]))
    for (name, method), group in rows:
        overruns = [overrun for overrun, _ in group]
        outcomes: dict[str, int] = {}
        for _, outcome in group:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        answers = ", ".join(f"{count} x {outcome}" for outcome, count in sorted(outcomes.items()))
        lines.append(
            f"| {name} | {method} | {len(group)} | {answers} | "
            f"{statistics.median(overruns):+.2f} s | {percentile(overruns, 0.9):+.2f} s | "
            f"{max(overruns):+.2f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reports", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    options = parser.parse_args()
    results = run(options.timeout_s, options.clients, options.rounds, options.reports, options.seed)
    text = table(results, options.timeout_s) + "\n\n" + notes(options)
    print(text)
    if not options.no_write:
        write_section("estimate-deadline", text)


def notes(options: argparse.Namespace) -> str:
    return (
        f"`LDP_ESTIMATE_TIMEOUT_S={options.timeout_s:g}`; one gevent worker (10 estimate "
        f"threads) on the embedded Redis; {options.clients} client threads at once, "
        f"{options.rounds} rounds of every kind and method at each of the "
        f"{len(CONFIDENCE_LEVELS)} confidence levels, one new report per campaign before each "
        f"round; {options.reports:,} reports per campaign. Overrun: the client's wall time "
        "of a request less the limit (negative: answered before it). `503 estimate_timed_out`: "
        "stopped at the limit; `503 estimate_pending`: waited for another request's computation "
        "of the same estimate until the limit; `no answer`: none within "
        f"{ANSWER_WAIT_S:g} s (counted as that)."
    )


if __name__ == "__main__":
    main()

"""The demo behind the README's first command.

Starts ``ldp-aggregator serve`` on an embedded Redis (or on ``LDP_REDIS_URL``),
creates three demo campaigns, fills each with a simulated population reporting
through the real client library, says which data each campaign's users come
from, and prints where to look. The server keeps running until Ctrl-C
(``--exit-after-setup`` stops it once the campaigns are filled, for tests).

A second run keeps the reports of the first (the data directory is the
server's store) and says so; ``--fresh`` starts afresh, deleting the demo's
data directory first, and refuses when that directory holds campaigns that are
not the demo's.

The commute campaign shows time: it is counted by day and holds DRIFT_DAYS days
of reports ending today, the share who bike rising day by day. A server stamps a
report with the time it received it and no request can backdate one, so the
days before today are written into the server's store directly, each at its
day's time (the store's ``ingest``, as the server would have stored them then;
each report perturbed by the client's mechanism); today's go through the client.

Only the standard library is imported before the options are read, so that
``--help`` answers before anything is installed (``scripts/demo.sh`` asks it
first); ``DEMO_COMMAND`` is the command the help names.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOWALLA = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
STARTUP_SECONDS = 60
STOP_SECONDS = 30
# The command the help and the messages name: scripts/demo.sh sets it to how it was called.
COMMAND = os.environ.get("DEMO_COMMAND") or "python scripts/demo.py"

COMMUTE: dict[str, Any] = {
    "id": "commute-mode",
    "title": "How did you get to work today?",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": ["walk", "bike", "bus", "train", "car", "scooter", "other"],
    # One report per device per day: the campaign the demo fills over several days.
    "period": "day",
}
COMMUTE_ZIPF = 1.1
# The commute campaign shows time: DRIFT_DAYS days of reports ending today, the share who
# bike rising by DRIFT_STEP a day from DRIFT_START (8% to 34%), the other modes keeping their
# Zipf proportions among the rest.
DRIFT_DAYS = 14
DRIFT_MODE = "bike"
DRIFT_START = 0.08
DRIFT_STEP = 0.02
DAY_S = 86400
VACCINATED: dict[str, Any] = {
    "id": "flu-shot",
    "title": "Did you get a flu shot this year?",
    "mechanism": "rr",
    "epsilon": 1.0,
}
VACCINATED_YES = 0.65
DOWNTOWN: dict[str, Any] = {
    "id": "sf-downtown",
    "title": "Where are you? (San Francisco downtown)",
    "mechanism": "planar_laplace",
    "region": {"lat_min": 37.772, "lat_max": 37.8, "lon_min": -122.424, "lon_max": -122.389},
    "cell_size_m": 150.0,
    "privacy_level": math.log(2),
    "privacy_radius_m": 100.0,
}
CITY_SEED = 7
DEMO_IDS = frozenset(spec["id"] for spec in (COMMUTE, VACCINATED, DOWNTOWN))


class DemoError(Exception):
    """A failure the demo explains in one message (printed as ``Error: ...``, exit status 1)."""


def _shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it or its parent."""
    here = Path.cwd()
    for base, prefix in ((here, ""), (here.parent, "../")):
        try:
            return prefix + str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def _populations(users: int) -> list[tuple[dict, Any, int, str]]:
    """(spec, population, users, where the users' answers come from) of each demo campaign."""
    from shared.spec import CampaignSpec
    from simulate import Population

    grid = CampaignSpec.from_dict(DOWNTOWN).grid
    if GOWALLA.is_file():
        places = Population.from_csv_points(GOWALLA, grid)
        where = f"placed at the Gowalla check-ins in {_shown_path(GOWALLA)}"
    else:
        places = Population.clustered_city(grid, seed=CITY_SEED)
        where = (
            f"placed in a synthetic city (clustered hotspots, seed {CITY_SEED}): there are no "
            f"Gowalla check-ins at {_shown_path(GOWALLA)}"
        )
    modes = COMMUTE["domain"]
    return [
        (
            COMMUTE,
            Population.from_weights(_commute_shares(DRIFT_DAYS - 1), modes),
            users,
            f"simulated users today whose answers follow Zipf's law (exponent {COMMUTE_ZIPF:g}) "
            f"over the {len(modes)} modes, in the order listed, but for the share who "
            f"{DRIFT_MODE}: {_commute_shares(DRIFT_DAYS - 1)[modes.index(DRIFT_MODE)]:.0%} today",
        ),
        (
            VACCINATED,
            Population.from_weights([1 - VACCINATED_YES, VACCINATED_YES], ["no", "yes"]),
            users,
            f"simulated users, {VACCINATED_YES:.0%} of them vaccinated",
        ),
        (DOWNTOWN, places, 2 * users, f"simulated users {where}"),
    ]


def _commute_shares(day: int) -> list[float]:
    """The commute population's shares on day ``day`` of DRIFT_DAYS (0 the first): Zipf's law
    over the modes, but DRIFT_MODE's share is DRIFT_START + DRIFT_STEP * day."""
    modes = COMMUTE["domain"]
    zipf = [1 / (rank + 1) ** COMMUTE_ZIPF for rank in range(len(modes))]
    drifting = modes.index(DRIFT_MODE)
    share = DRIFT_START + DRIFT_STEP * day
    rest = sum(weight for i, weight in enumerate(zipf) if i != drifting)
    return [share if i == drifting else (1 - share) * w / rest for i, w in enumerate(zipf)]


def _fill_earlier_days(env: dict[str, str], users: int) -> int:
    """Create the commute campaign DRIFT_DAYS - 1 days ago and store ``users`` reports for each
    day before today, stamped with their day (noon UTC); the number stored.

    A server stamps a report with the time it received it, and no request can backdate one:
    so the earlier days are written into the server's store directly, as the server would have
    stored them then (the store's ``ingest`` at that time), each report perturbed by the same
    mechanism the client runs. Today's reports go through the client and the server.
    """
    import random
    import uuid

    from aggregator.services import open_store
    from aggregator.settings import Settings
    from aggregator.storage.ingest import StoredReport
    from aggregator.storage.redis_server import EmbeddedRedis
    from shared.mechanisms import Mechanism
    from shared.spec import CampaignSpec

    url = env.get("LDP_REDIS_URL") or EmbeddedRedis(env["LDP_DATA_DIR"]).url
    store = open_store(url, Settings.from_env(env)).store
    spec = CampaignSpec.from_dict(COMMUTE)
    mechanism = Mechanism.from_spec(spec)
    today = int(time.time() // DAY_S) * DAY_S
    first = today - (DRIFT_DAYS - 1) * DAY_S
    rng = random.Random()
    stored = 0
    try:
        store.create_campaign(spec, now=first)
        for day in range(DRIFT_DAYS - 1):
            values = rng.choices(COMMUTE["domain"], _commute_shares(day), k=users)
            reports = []
            for value in values:
                output = mechanism.parse_report_value(mechanism.perturb(value, rng), field="value")
                reports.append(
                    StoredReport(str(uuid.uuid4()), output, mechanism.report_value(output))
                )
            for start in range(0, len(reports), 1000):
                batch = reports[start : start + 1000]
                store.ingest(spec.id, batch, now=first + day * DAY_S + DAY_S / 2)
            stored += len(reports)
    finally:
        store.close()
    return stored


def _say_what_drifted(url: str, analyst_token: str) -> None:
    """The compare API's change of DRIFT_MODE, the last 7 days against the 7 before."""
    import requests

    today = int(time.time() // DAY_S) * DAY_S

    def day(offset: int) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(today - offset * DAY_S))

    window = {"a_since": day(13), "a_until": day(7), "b_since": day(6), "b_until": day(0)}
    answer = requests.get(
        f"{url}/api/v1/campaigns/{COMMUTE['id']}/compare",
        params=window,
        headers={"Authorization": f"Bearer {analyst_token}"},
        timeout=60,
    )
    answer.raise_for_status()
    row = next(r for r in answer.json()["differences"] if r["label"] == DRIFT_MODE)
    verdict = (
        "clearly up"
        if row["excludes_zero"] and row["difference"] > 0
        else ("clearly down" if row["excludes_zero"] else "not clearly changed at this n")
    )
    print(
        f"{COMMUTE['id']} shows time: the share who {DRIFT_MODE} rose by "
        f"{100 * DRIFT_STEP:g} points a day over {DRIFT_DAYS} days; estimated change, last 7 "
        f"days against the 7 before: {100 * row['difference']:+.1f} points (95% interval "
        f"{100 * row['ci_low']:+.1f} to {100 * row['ci_high']:+.1f}), {verdict}. See its "
        "page's window picker, trend and comparison.",
        flush=True,
    )


def _wait_until_up(process: Any, url: str, seconds: float = STARTUP_SECONDS) -> None:
    """Return once ``/health`` answers 200; DemoError if the server exits or never does.

    gunicorn accepts connections before its workers have booted, so a request may
    time out or be cut off while it starts: any request error means "not yet".
    """
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DemoError("the aggregator exited during start-up")
        try:
            if requests.get(f"{url}/api/v1/health", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise DemoError(f"the aggregator did not answer on {url} within {seconds:g} s")


def _refuse_a_taken_port(host: str, port: int) -> None:
    """DemoError if something already accepts connections on ``host:port``: its health
    check would pass for the demo's own server, and the demo's tokens would not be its."""
    try:
        with socket.create_connection((host, port), timeout=1):
            pass
    except OSError:
        return
    raise DemoError(
        f"{host}:{port} is already in use (another aggregator or program): stop it, or choose "
        "another port with --port"
    )


def _existing_reports(url: str, campaign_id: str, analyst_token: str) -> int:
    import requests

    response = requests.get(
        f"{url}/api/v1/campaigns/{campaign_id}/counts",
        headers={"Authorization": f"Bearer {analyst_token}"},
        timeout=10,
    )
    return int(response.json()["n"]) if response.ok else 0


def _campaign_ids(url: str, token: str) -> set[str]:
    import requests

    response = requests.get(
        f"{url}/api/v1/campaigns", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    response.raise_for_status()
    return {campaign["id"] for campaign in response.json()["campaigns"]}


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the server has not stopped within STOP_SECONDS."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Run the aggregator with three demo campaigns filled through the real "
        "client, and print the dashboard's address and tokens. A second run keeps the first "
        "run's reports (and says so); --fresh starts afresh.",
        epilog="LDP_ADMIN_TOKEN, LDP_ANALYST_TOKEN (random when unset) and LDP_REDIS_URL (an "
        "external Redis instead of the embedded one) are honoured. The map campaign's users "
        f"are placed at the Gowalla check-ins in {_shown_path(GOWALLA)} when that file is "
        "there, in a synthetic city otherwise.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--port", default=8000, type=_port, help="port to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--data-dir",
        default=".ldp-data",
        metavar="DIR",
        help="where the server writes its log and the embedded Redis keeps its data (none "
        "with LDP_REDIS_URL) (default: %(default)s)",
    )
    parser.add_argument(
        "--users",
        default=1500,
        type=_users,
        metavar="N",
        help="simulated users per categorical campaign, twice as many for the map (10 to "
        "1,000,000; default: %(default)s)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start afresh: delete the data directory of an earlier demo run first (refused "
        "when it holds other campaigns, and with LDP_REDIS_URL)",
    )
    parser.add_argument(
        "--exit-after-setup",
        action="store_true",
        help="stop the server once the demo is filled",
    )
    return parser


def _bounded(low: int, high: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be {low} to {high:,}, got {value}")
        return value

    return parse


_port = _bounded(1, 65535, "the port")
_users = _bounded(10, 1_000_000, "the number of users")


class _Server:
    """The aggregator the demo runs: ``serve`` with the demo's settings, its log appended to
    ``server.log`` in the data directory."""

    def __init__(self, host: str, port: int, data_dir: Path, env: dict[str, str]) -> None:
        self.url = f"http://{host}:{port}"
        self.command = [
            *(sys.executable, "-m", "aggregator.cli", "serve"),
            *("--host", host, "--port", str(port)),
        ]
        self.data_dir = data_dir
        self.log_path = data_dir / "server.log"
        self.env = env
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            _wait_until_up(self.process, self.url)
        except DemoError as exc:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise DemoError(f"{exc}; its log: {self.log_path}\n{tail}") from None

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)


def _start_afresh(server: _Server, analyst_token: str, external_redis: bool) -> None:
    """--fresh: delete the data directory of an earlier run, once sure it holds only the
    demo's campaigns, and start the server again on an empty one."""
    if external_redis:
        raise DemoError(
            "--fresh deletes the embedded Redis' data directory; with LDP_REDIS_URL, delete "
            "the demo's campaigns there yourself or use another Redis"
        )
    found = _campaign_ids(server.url, analyst_token)
    others = found - DEMO_IDS
    if not found:
        return  # nothing from an earlier run
    if others:
        raise DemoError(
            f"--fresh would delete {server.data_dir}, which also holds campaigns that are not "
            f"the demo's ({', '.join(sorted(others))}): choose another --data-dir"
        )
    server.stop()
    shutil.rmtree(server.data_dir)
    print(f"Starting afresh: deleted the earlier demo data in {server.data_dir}.")
    server.start()


def _fill(
    server: _Server,
    users: int,
    admin_token: str,
    analyst_token: str,
    where: str,
    env: dict[str, str],
) -> None:
    """Fill each demo campaign not filled yet, saying where its users' answers come from."""
    from aggregator.http.estimates import default_method
    from shared.mechanisms import Mechanism
    from shared.spec import CampaignSpec
    from simulate import run_via_server

    for spec, population, n, source in _populations(users):
        already = _existing_reports(server.url, spec["id"], analyst_token)
        if already:
            print(
                f"{spec['id']}: kept the {already:,} reports of an earlier run in {where}; "
                f"none added ({COMMAND} --fresh starts afresh)."
            )
            continue
        if spec is COMMUTE:
            earlier = _fill_earlier_days(env, n)
            print(
                f"{spec['id']}: {earlier} reports of the {DRIFT_DAYS - 1} days before today "
                f"({n} a day) stored with their day's time, the share who {DRIFT_MODE} rising "
                f"from {DRIFT_START:.0%} by {100 * DRIFT_STEP:g} points a day (a server stamps "
                "the time it received a report, so earlier days are written into its store "
                "directly).",
                flush=True,
            )
        print(f"{spec['id']}: {n} {source}; they report through the client ...")
        method = default_method(Mechanism.from_spec(CampaignSpec.from_dict(spec)))
        result = run_via_server(
            server.url,
            spec,
            population,
            n,
            admin_token=admin_token,
            analyst_token=analyst_token,
            methods=(method,),
            progress=sys.stderr.isatty(),
        )
        score = result.scores.get(method)
        accuracy = f", {method} total variation {score.tv:.3f}" if score else ""
        if spec is COMMUTE:
            accuracy = ""  # the estimate is over every day, the population today's only
        print(f"{spec['id']}: {result.delivered} reports delivered{accuracy}.", flush=True)
        if spec is COMMUTE:
            _say_what_drifted(server.url, analyst_token)


def run(args: argparse.Namespace) -> None:
    """The demo, once the options are read."""
    import requests

    admin_token = os.environ.get("LDP_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    analyst_token = os.environ.get("LDP_ANALYST_TOKEN") or secrets.token_urlsafe(32)
    data_dir = Path(args.data_dir)
    env = {
        **os.environ,
        "LDP_ADMIN_TOKEN": admin_token,
        "LDP_ANALYST_TOKEN": analyst_token,
        "LDP_DATA_DIR": str(data_dir.resolve()),
        # Every simulated user fetches the campaign's spec and reports from this machine's
        # address: the per-address limits would pace the demo to minutes.
        "LDP_RATELIMIT_REPORTS": os.environ.get("LDP_RATELIMIT_REPORTS", "1000000 per minute"),
        "LDP_RATELIMIT_PUBLIC": os.environ.get("LDP_RATELIMIT_PUBLIC", "1000000 per minute"),
        "LDP_REPORT_BUDGET": os.environ.get("LDP_REPORT_BUDGET", "1000000 per hour"),
    }
    external_redis = bool(env.get("LDP_REDIS_URL"))
    where = "the Redis at LDP_REDIS_URL" if external_redis else str(data_dir)
    _refuse_a_taken_port(args.host, args.port)
    server = _Server(args.host, args.port, data_dir, env)
    try:
        server.start()
        if args.fresh:
            _start_afresh(server, analyst_token, external_redis)
        print(f"Aggregator up at {server.url} (Redis: {where}).", flush=True)
        _fill(server, args.users, admin_token, analyst_token, where, env)
        print("")
        print(f"Dashboard:      {server.url}/dashboard/")
        print(f"Analyst token:  {analyst_token}   (sign in with it)")
        print(f"Admin token:    {admin_token}")
        print(f"API:            {server.url}/api/v1/openapi.json")
        print(f"Server log:     {server.log_path}", flush=True)
        if args.exit_after_setup:
            return
        print("Serving until Ctrl-C.", flush=True)
        assert server.process is not None
        server.process.wait()
    except requests.RequestException as exc:
        raise DemoError(
            f"the aggregator stopped answering ({exc}); its log: {server.log_path}"
        ) from exc
    except KeyboardInterrupt:
        # Ctrl-C reached the server's processes too: they stop on their own, quietly.
        print("\nStopping the aggregator.", flush=True)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        run(args)
    except DemoError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

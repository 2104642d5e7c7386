"""The demo behind the README's first command.

Starts ``ldp-aggregator serve`` on an embedded Redis (or on ``LDP_REDIS_URL``),
creates three demo campaigns, fills each with a simulated population reporting
through the real client library, and prints where to look. The server keeps
running until Ctrl-C (``--exit-after-setup`` stops it once the campaigns are
filled, for tests).
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import requests

from aggregator.http.estimates import default_method
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec
from simulate import Population, run_via_server

ROOT = Path(__file__).resolve().parents[1]
GOWALLA = ROOT.parent / "shared" / "data" / "gowalla_sf_downtown.csv"
STARTUP_SECONDS = 60

COMMUTE = {
    "id": "commute-mode",
    "title": "How did you get to work today?",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": ["walk", "bike", "bus", "train", "car", "scooter", "other"],
}
VACCINATED = {
    "id": "flu-shot",
    "title": "Did you get a flu shot this year?",
    "mechanism": "rr",
    "epsilon": 1.0,
}
DOWNTOWN = {
    "id": "sf-downtown",
    "title": "Where are you? (San Francisco downtown)",
    "mechanism": "planar_laplace",
    "region": {"lat_min": 37.772, "lat_max": 37.8, "lon_min": -122.424, "lon_max": -122.389},
    "cell_size_m": 150.0,
    "privacy_level": math.log(2),
    "privacy_radius_m": 100.0,
}


def _populations(users: int) -> list[tuple[dict, Population, int]]:
    grid = CampaignSpec.from_dict(DOWNTOWN).grid
    if GOWALLA.is_file():
        places = Population.from_csv_points(GOWALLA, grid)
    else:
        places = Population.clustered_city(grid, seed=7)
    return [
        (COMMUTE, Population.zipf(len(COMMUTE["domain"]), 1.1, COMMUTE["domain"]), users),
        (VACCINATED, Population.from_weights([0.35, 0.65], ["no", "yes"]), users),
        (DOWNTOWN, places, 2 * users),
    ]


def _wait_until_up(process: subprocess.Popen, url: str, seconds: float = STARTUP_SECONDS) -> None:
    """Return once ``/health`` answers 200; ClickException if the server exits or never does.

    gunicorn accepts connections before its workers have booted, so a request may
    time out or be cut off while it starts: any request error means "not yet".
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise click.ClickException("the aggregator exited during start-up")
        try:
            if requests.get(f"{url}/api/v1/health", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise click.ClickException(f"the aggregator did not answer on {url} within {seconds:g} s")


def _refuse_a_taken_port(host: str, port: int) -> None:
    """ClickException if something already accepts connections on ``host:port``: its health
    check would pass for the demo's own server, and the demo's tokens would not be its."""
    try:
        with socket.create_connection((host, port), timeout=1):
            pass
    except OSError:
        return
    raise click.ClickException(
        f"{host}:{port} is already in use (another aggregator or program): stop it, or choose "
        "another port with --port"
    )


def _existing_reports(url: str, campaign_id: str, analyst_token: str) -> int:
    response = requests.get(
        f"{url}/api/v1/campaigns/{campaign_id}/counts",
        headers={"Authorization": f"Bearer {analyst_token}"},
        timeout=10,
    )
    return int(response.json()["n"]) if response.ok else 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--data-dir",
    default=".ldp-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the embedded Redis keeps its data (ignored with LDP_REDIS_URL).",
)
@click.option(
    "--users",
    default=1500,
    show_default=True,
    type=click.IntRange(10, 1_000_000),
    help="Simulated users per categorical campaign (twice as many for the map).",
)
@click.option("--exit-after-setup", is_flag=True, help="Stop the server once the demo is filled.")
def main(host: str, port: int, data_dir: str, users: int, exit_after_setup: bool) -> None:
    """Run the aggregator with demo campaigns filled through the real client."""
    admin_token = os.environ.get("LDP_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    analyst_token = os.environ.get("LDP_ANALYST_TOKEN") or secrets.token_urlsafe(32)
    env = {
        **os.environ,
        "LDP_ADMIN_TOKEN": admin_token,
        "LDP_ANALYST_TOKEN": analyst_token,
        "LDP_DATA_DIR": str(Path(data_dir).resolve()),
        # Every simulated user fetches the campaign's spec and reports from this machine's
        # address: the per-address limits would pace the demo to minutes.
        "LDP_RATELIMIT_REPORTS": os.environ.get("LDP_RATELIMIT_REPORTS", "1000000 per minute"),
        "LDP_RATELIMIT_PUBLIC": os.environ.get("LDP_RATELIMIT_PUBLIC", "1000000 per minute"),
        "LDP_REPORT_BUDGET": os.environ.get("LDP_REPORT_BUDGET", "1000000 per hour"),
    }
    url = f"http://{host}:{port}"
    _refuse_a_taken_port(host, port)
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--host", host, "--port", str(port)]
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(data_dir) / "server.log"
    with open(log_path, "ab") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            _wait_until_up(server, url)
        except click.ClickException as exc:
            exc.message += f"; its log: {log_path}\n{log_path.read_text()[-2000:]}"
            raise
        click.echo(f"Aggregator up at {url} (Redis: {env.get('LDP_REDIS_URL') or data_dir}).")
        for spec, population, n in _populations(users):
            already = _existing_reports(url, spec["id"], analyst_token)
            if already:
                click.echo(f"{spec['id']}: already holds {already} reports; not adding more.")
                continue
            click.echo(f"{spec['id']}: {n} simulated users report through the client ...")
            method = default_method(Mechanism.from_spec(CampaignSpec.from_dict(spec)))
            result = run_via_server(
                url,
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
            click.echo(f"{spec['id']}: {result.delivered} reports delivered{accuracy}.")
        click.echo("")
        click.echo(f"Dashboard:      {url}/dashboard/")
        click.echo(f"Analyst token:  {analyst_token}   (sign in with it)")
        click.echo(f"Admin token:    {admin_token}")
        click.echo(f"API:            {url}/api/v1/openapi.json")
        click.echo(f"Server log:     {log_path}")
        if exit_after_setup:
            return
        click.echo("Serving until Ctrl-C.")
        server.wait()
    except requests.RequestException as exc:
        raise click.ClickException(
            f"the aggregator stopped answering ({exc}); its log: {log_path}"
        ) from exc
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    main()

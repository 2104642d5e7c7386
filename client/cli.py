"""``ldp-client``: report to a local-DP campaign from the command line.

Library errors become ``Error: ...`` on standard error and exit status 1
(with ``--json``, the error object is also printed on standard output);
usage errors exit with 2. Nothing printed ever holds the true value.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from typing import Any

import click

from client.errors import ClientError
from client.ledger import period_rule, period_when
from client.policy import (
    DEFAULT_LOCATION_RADIUS_M,
    DEFAULT_MAX_EPSILON,
    DEFAULT_TOTAL_BUDGET,
    DEFAULT_VALUE_RADIUS,
    Policy,
)
from client.reporter import ALREADY_REPORTED, DRY_RUN, DUPLICATE, QUEUED, Reporter, ReportResult
from client.transport import DEFAULT_TIMEOUT
from shared.errors import LDPError, ValidationError
from shared.schema import is_positive_finite
from shared.terminal import printable

FORGET_WARNING = (
    "Forgetting a campaign weakens your longitudinal protection: its pinned spec and the record "
    "of which values you reported are dropped, so the next report pins whatever spec the server "
    "serves then, and if that spec differs, the same true value gets fresh noise that the server "
    "can combine with your earlier reports. The budget already spent stays spent."
)


# click is generic in its converted type only from 8.4 on (this package supports 8.1), and a
# subscripted base would fail there at import.
class _PositiveFinite(click.ParamType):  # type: ignore[type-arg]
    """A finite number above 0 (``click.FloatRange`` lets NaN through)."""

    name = "number"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not is_positive_finite(number):
            self.fail(f"{value!r} is not a finite number above 0", param, ctx)
        return number


_POSITIVE = _PositiveFinite()


class CLIError(click.ClickException):
    """A library error on its way out: ``Error: ...``, and the JSON object with ``--json``."""

    def __init__(self, error: dict[str, Any], as_json: bool):
        super().__init__(printable(error["message"]))
        self.error = error
        self.as_json = as_json

    def show(self, file: Any = None) -> None:
        if self.as_json:
            click.echo(json.dumps({"error": self.error}))
        super().show(file)


def _json_option(function: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(function)


def _fail(exc: LDPError, as_json: bool) -> CLIError:
    if isinstance(exc, (ClientError, ValidationError)):
        error = exc.to_dict()
    else:
        error = {"code": "error", "message": str(exc), "field": None}
    return CLIError(error, as_json)


def _time(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds")


class _Context:
    def __init__(self, server: str | None, state_dir: str | None, policy: Policy, timeout: float):
        self.server = server
        self.state_dir = state_dir
        self.policy = policy
        self.timeout = timeout

    @contextlib.contextmanager
    def reporter(self, as_json: bool, *, need_server: bool = True) -> Iterator[Reporter]:
        """A reporter for one command, closed after it; the library's errors leave as CLIError.

        Every command goes through here, so every failure looks the same: ``Error: ...``
        and exit status 1, with the ``{"code", "message", "field"}`` object under ``--json``.
        """
        server = self.server
        if server is None:
            if need_server:
                raise CLIError(
                    {
                        "code": "no_server",
                        "message": "no server: give --server or set LDP_SERVER_URL",
                        "field": "server",
                    },
                    as_json,
                )
            server = "http://localhost"
        try:
            reporter = Reporter(
                server,
                state_dir=self.state_dir,
                policy=self.policy,
                timeout=(min(self.timeout, DEFAULT_TIMEOUT[0]), self.timeout),
            )
        except ValueError as exc:
            raise CLIError(
                {"code": "invalid_server", "message": str(exc), "field": "server"}, as_json
            ) from exc
        with reporter:
            try:
                yield reporter
            except LDPError as exc:
                raise _fail(exc, as_json) from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ldp-collect", prog_name="ldp-client")
@click.option(
    "--server", envvar="LDP_SERVER_URL", metavar="URL", help="Aggregator base URL [LDP_SERVER_URL]."
)
@click.option(
    "--state-dir",
    envvar="LDP_CLIENT_HOME",
    type=click.Path(file_okay=False),
    help="Secret, pins, ledger and queue [LDP_CLIENT_HOME; default ~/.local/state/ldp-client].",
)
@click.option(
    "--max-epsilon",
    envvar="LDP_MAX_EPSILON",
    type=_POSITIVE,
    default=DEFAULT_MAX_EPSILON,
    show_default=True,
    help="Refuse campaigns that cost more than this per report [LDP_MAX_EPSILON].",
)
@click.option(
    "--budget",
    envvar="LDP_BUDGET",
    type=_POSITIVE,
    default=DEFAULT_TOTAL_BUDGET,
    show_default=True,
    help="Total epsilon this user ever spends [LDP_BUDGET].",
)
@click.option(
    "--location-radius",
    envvar="LDP_LOCATION_RADIUS_M",
    type=_POSITIVE,
    default=DEFAULT_LOCATION_RADIUS_M,
    show_default=True,
    help="Metres within which your locations should look alike [LDP_LOCATION_RADIUS_M].",
)
@click.option(
    "--value-radius",
    envvar="LDP_VALUE_RADIUS",
    type=click.IntRange(min=1),
    default=DEFAULT_VALUE_RADIUS,
    show_default=True,
    help="For integer ranges (geometric campaigns): values this close should look alike "
    "[LDP_VALUE_RADIUS].",
)
@click.option(
    "--timeout",
    type=_POSITIVE,
    default=DEFAULT_TIMEOUT[1],
    show_default=True,
    help="Seconds per request.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    server: str | None,
    state_dir: str | None,
    max_epsilon: float,
    budget: float,
    location_radius: float,
    value_radius: int,
    timeout: float,
) -> None:
    """Report to local differential privacy campaigns: only noisy answers leave this device.

    The device enforces your policy whatever the server says: a cap on the
    epsilon of one report, a total budget, and the campaign spec pinned at
    first use. The same answer to the same campaign always gives the same
    noisy report and spends nothing more.
    """
    policy = Policy(
        max_epsilon=max_epsilon,
        total_budget=budget,
        location_radius_m=location_radius,
        value_radius=value_radius,
    )
    ctx.obj = _Context(server, state_dir, policy, timeout)


@cli.command()
@click.argument("campaign")
@click.argument("value", required=False)
@click.option("--lat", type=float, help="Latitude, for location campaigns.")
@click.option("--lon", type=float, help="Longitude, for location campaigns.")
@click.option("--dry-run", is_flag=True, help="Show the exact payload; spend and send nothing.")
@_json_option
@click.pass_obj
def report(
    obj: _Context,
    campaign: str,
    value: str | None,
    lat: float | None,
    lon: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Answer CAMPAIGN with VALUE (a label, or an integer of a range or of a domain size), or
    with --lat/--lon for a location."""
    if (lat is None) != (lon is None):
        raise click.UsageError("--lat and --lon go together")
    if lat is not None and value is not None:
        raise click.UsageError("give either VALUE or --lat/--lon, not both")
    if lat is None and value is None:
        raise click.UsageError("give VALUE, or --lat and --lon for a location campaign")
    answer: Any = value if lat is None else {"lat": lat, "lon": lon}
    with obj.reporter(as_json) as reporter:
        result = reporter.report(campaign, answer, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    if result.outcome == DRY_RUN:
        click.echo(
            "Dry run: nothing was spent, stored or sent. "
            f"This would be POSTed to {printable(result.url)}:"
        )
        click.echo(json.dumps(result.payload, indent=2))
        if result.repeat:
            click.echo(f"{_already_reported(result)} This is that report: {result.detail}.")
        else:
            click.echo(
                "(the report_id is this device's for the campaign's period, so the server counts "
                "it once; the value is memoized)"
            )
    elif result.repeat:
        if result.outcome == ALREADY_REPORTED:
            then = "The server has that report, so nothing was sent again."
        elif result.outcome == QUEUED:
            then = (
                f"That report waits on this device ({printable(result.detail)}); "
                "`ldp-client flush` sends it."
            )
        else:
            then = "Re-sent the same report (the server counts it once)."
        click.echo(f"{_already_reported(result)} {then}")
    elif result.outcome == QUEUED:
        click.echo(
            f"Queued on this device: {printable(result.detail)}. "
            "It will be sent by `ldp-client flush`."
        )
    elif result.outcome == DUPLICATE:
        click.echo("The server already had this report.")
    else:
        click.echo(f"Sent a noisy report to {result.campaign_id}.")
    if result.repeat:
        click.echo("No budget spent.")
    elif result.memoized:
        click.echo("Same answer as before: the same noisy report, no budget spent.")
    else:
        verb = "Would spend" if result.outcome == DRY_RUN else "Spent"
        click.echo(f"{verb} epsilon {result.charged:.4g}.")
    click.echo(f"Budget left: {result.budget_left:.4g} of {obj.policy.total_budget:.4g}.")


def _already_reported(result: ReportResult) -> str:
    """The first sentence about a repeat within a period: where, when, and the campaign's rule."""
    return (
        f"Already reported to {result.campaign_id}{period_when(result.period, result.period_key)}; "
        f"it takes {period_rule(result.period)}."
    )


@cli.command()
@_json_option
@click.pass_obj
def status(obj: _Context, as_json: bool) -> None:
    """Budget spent and left per campaign, and reports waiting to be sent."""
    with obj.reporter(as_json, need_server=False) as reporter:
        info = reporter.status()
    if obj.server is None:
        info["server"] = None
    if as_json:
        click.echo(json.dumps(info))
        return
    budget = info["budget"]
    click.echo(
        f"Budget: spent {budget['spent']:.4g} of {budget['total']:.4g} ({budget['left']:.4g} left"
        + (f"; {budget['forgotten']:.4g} in forgotten campaigns" if budget["forgotten"] else "")
        + ")"
    )
    if not info["campaigns"]:
        click.echo("No campaigns yet.")
    for c in info["campaigns"]:
        click.echo(
            f"  {printable(c['campaign'])} @ {printable(c['server'])}: {c['mechanism']}, "
            f"cost {c['cost_per_value']:.4g} "
            f"per new value, {c['values_reported']} value(s), spent {c['spent']:.4g}, "
            f"{c['queued']} queued"
        )
    queue = info["queue"]
    click.echo(f"Queue: {queue['pending']} report(s) waiting")
    if queue["pending"]:
        click.echo(f"  next attempt: {_time(queue['next_attempt_at'])}")
        for error in queue["last_errors"]:
            click.echo(f"  last error: {printable(error)}")
    if info["rejected"]:
        click.echo(f"Rejected by the server: {len(info['rejected'])} (details with --json)")


@cli.command()
@click.option("--due-only", is_flag=True, help="Only reports whose retry backoff has expired.")
@_json_option
@click.pass_obj
def flush(obj: _Context, due_only: bool, as_json: bool) -> None:
    """Send the reports waiting on this device, with their original report ids."""
    with obj.reporter(as_json, need_server=False) as reporter:
        result = reporter.flush(due_only=due_only)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        click.echo(
            f"Sent {result.accepted} new, "
            f"{result.duplicates} already received; {result.remaining} still waiting."
        )
        for error in result.errors:
            click.echo(f"  not reachable: {printable(error)}")
        for rejected in result.rejected:
            click.echo(f"  rejected by the server: {printable(rejected['message'])}")
    if result.errors or result.rejected:
        raise CLIError(
            {
                "code": "flush_incomplete",
                "message": (
                    f"{result.remaining} report(s) still waiting, {len(result.rejected)} rejected"
                ),
                "field": None,
            },
            False,
        )


@cli.command()
@click.argument("campaign")
@click.argument("token")
@_json_option
@click.pass_obj
def enroll(obj: _Context, campaign: str, token: str, as_json: bool) -> None:
    """Keep an enrollment TOKEN for CAMPAIGN: each token admits one report.

    Campaigns with enrollment take reports only with a token their organiser
    handed out; the next report to CAMPAIGN carries the token and spends it.
    """
    with obj.reporter(as_json) as reporter:
        kept = reporter.enroll(campaign, token)
    if as_json:
        click.echo(json.dumps({"campaign": campaign, "tokens": kept}))
    else:
        click.echo(f"Enrolled in {campaign}: {kept} unused token(s) on this device.")


@cli.command()
@click.argument("campaign")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_json_option
@click.pass_obj
def forget(obj: _Context, campaign: str, yes: bool, as_json: bool) -> None:
    """Drop CAMPAIGN's pinned spec and the record of what you reported to it."""
    click.echo(f"Warning: {FORGET_WARNING}", err=True)
    if not yes:
        click.confirm(f"Forget campaign {campaign!r}?", abort=True, err=True)
    with obj.reporter(as_json) as reporter:
        spent = reporter.forget(campaign)
    if as_json:
        click.echo(json.dumps({"campaign": campaign, "forgotten": True, "spent": spent}))
    else:
        click.echo(f"Forgot {campaign}; its {spent:.4g} epsilon stays counted in your budget.")


def main(argv: list[str] | None = None) -> None:
    """The ``ldp-client`` console script."""
    cli.main(args=argv, prog_name="ldp-client")


if __name__ == "__main__":
    main()

"""``ldp-aggregator``: run the server and administer campaigns from the command line.

The commands other than ``serve`` work on the store directly (``--redis-url``
or the embedded server in ``--data-dir``, started if it is not running), so
they need no token: whoever can reach the store is already trusted with it.
Only ``serve`` creates a store; the others refuse a data directory that holds
none, and every command says on standard error which store it opened.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import redis

from aggregator.estimation.advised_spec import spec_and_advice
from aggregator.http import estimates, export, windows
from aggregator.http.enrollment import new_token
from aggregator.services import open_store
from aggregator.settings import Settings, SettingsError
from aggregator.storage.redis_server import (
    DEFAULT_DATA_DIR,
    DEFAULT_FSYNC,
    FSYNC_POLICIES,
    DataDirBusy,
    DataDirLock,
    EmbeddedRedis,
    connect_url,
)
from aggregator.storage.retention import DAY_S, trim_all
from aggregator.storage.store import CLOSED, OPEN, Campaign, CampaignStore
from shared.errors import LDPError
from shared.mechanisms import GridMechanism
from shared.terminal import json_text, printable

# Cells ``estimate`` shows for a location campaign unless told --top N or --all.
DEFAULT_TOP_CELLS = 20
# What the embedded Redis leaves in its data directory from its first start on.
_STORE_FILES = ("appendonly.aof", "appendonlydir", "dump.rdb")


def holds_store(data_dir: str | os.PathLike) -> bool:
    """Whether ``data_dir`` holds an embedded Redis's data (it has been served from)."""
    return any((Path(data_dir) / name).exists() for name in _STORE_FILES)


def describe_url(url: str) -> str:
    """A Redis URL as it may be printed: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


# gunicorn's control socket (gunicornc), one per data directory so that servers do not share it.
CONTROL = "gunicorn.ctl"


class StoreOpener:
    """Opens the store once per command; stops an embedded server it had to start.

    Parameters
    ----------
    redis_url, data_dir, fsync
        The group's options: an external Redis, else the embedded one in ``data_dir``.
    may_create : bool
        Whether an empty or missing ``data_dir`` may become a new store (``serve``).
        Otherwise opening it is an error naming the directory looked in, so that an
        admin command run from the wrong directory does not report on an empty store.
    """

    def __init__(
        self, redis_url: str | None, data_dir: str, fsync: str, *, may_create: bool = False
    ) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.fsync = fsync
        self.may_create = may_create
        self._url: str | None = None
        self.embedded: EmbeddedRedis | None = None
        self._store: CampaignStore | None = None

    def url(self, **embedded_options: Any) -> str:
        """The store's URL; ``embedded_options`` go to the embedded server if one is started."""
        if self._url is None:
            where = Path(self.data_dir).resolve()
            if not self.redis_url and not self.may_create and not holds_store(where):
                raise click.ClickException(
                    f"no report store in {where}: run `ldp-aggregator serve` there first, or "
                    "point to the server's store with --data-dir DIR (LDP_DATA_DIR) or "
                    "--redis-url URL (LDP_REDIS_URL)"
                )
            self._url, self.embedded = connect_url(
                self.redis_url, self.data_dir, self.fsync, **embedded_options
            )
            store = describe_url(self._url) if self.redis_url else f"embedded Redis in {where}"
            click.echo(f"Store: {printable(store)}", err=True)
        return self._url

    def store(self) -> CampaignStore:
        """The store as the environment's settings (``LDP_SHARDS``, ...) say."""
        if self._store is None:
            settings = read_settings()
            self._store = open_store(self.url(), settings).store
        return self._store

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


def _fail(error: Exception) -> click.ClickException:
    if isinstance(error, redis.RedisError):
        return click.ClickException(f"the report store is unavailable: {printable(error)}")
    return click.ClickException(printable(getattr(error, "message", error)))


class SettingsRefused(click.ClickException):
    """A bad setting: ``Error: LDP_... must be ...`` and exit status 2, as for a bad option."""

    exit_code = 2


def read_settings(**options: Any) -> Settings:
    """The server's settings: the environment's, with the options given (None: not given)."""
    try:
        settings = Settings.from_env(os.environ)
        return settings.replace(**{k: v for k, v in options.items() if v is not None})
    except SettingsError as exc:
        raise SettingsRefused(str(exc)) from exc


def _checked_setting(field_name: str) -> Any:
    """An option's callback: check its value (from the command line or the environment)
    as the setting ``field_name``, so that a bad one is refused naming its variable."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return Settings.value_from_text(field_name, value)
        except SettingsError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return check


class _Group(click.Group):
    """Turns the library's errors into ``Error: ...`` with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (LDPError, redis.RedisError) as exc:
            raise _fail(exc) from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ldp-collect", prog_name="ldp-aggregator")
@click.option(
    "--redis-url",
    envvar="LDP_REDIS_URL",
    callback=_checked_setting("redis_url"),
    help="External Redis: redis://, rediss:// or unix:// URL [LDP_REDIS_URL; default: embedded].",
)
@click.option(
    "--data-dir",
    envvar="LDP_DATA_DIR",
    default=DEFAULT_DATA_DIR,
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory of the embedded Redis (append-only file, snapshot, socket) "
    "[LDP_DATA_DIR]. Only serve creates it; the other commands need one that serve used.",
)
@click.option(
    "--fsync",
    envvar="LDP_REDIS_FSYNC",
    default=DEFAULT_FSYNC,
    show_default=True,
    callback=_checked_setting("redis_fsync"),
    help=f"The embedded Redis's appendfsync policy: {', '.join(FSYNC_POLICIES)} [LDP_REDIS_FSYNC].",
)
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, data_dir: str, fsync: str) -> None:
    """Aggregator of locally differentially private reports."""
    opener = StoreOpener(redis_url, data_dir, fsync, may_create=ctx.invoked_subcommand == "serve")
    ctx.obj = opener
    ctx.call_on_close(opener.close)


def _echo_json(data: Any) -> None:
    click.echo(json_text(data, indent=2))


# --since and --until: a window of the campaign's periods, as the API's since and until.
_WINDOW_HELP = (
    "{which} period of the window, included: an ISO date 2026-12-01 for a campaign counted "
    "by day (period day or once), an ISO week 2026-W48 for one counted by week; a report is "
    "in the period the server received it in (UTC) [default: {default}]."
)
_since_option = click.option(
    "--since",
    metavar="PERIOD",
    help=_WINDOW_HELP.format(which="First", default="the campaign's first, or all time"),
)
_until_option = click.option(
    "--until",
    metavar="PERIOD",
    help=_WINDOW_HELP.format(which="Last", default="the current one, or all time"),
)


def _window(
    store: CampaignStore, campaign: Campaign, since: str | None, until: str | None
) -> windows.WindowRead | None:
    """The window of --since and --until (None: all time); a bad one is an error naming the
    option."""
    now = store.clock()
    window = windows.parse_window(
        campaign, {"--since": since, "--until": until}, now=now, names=("--since", "--until")
    )
    if window is None:
        return None
    return windows.resolve(campaign, window, now=now, retention_s=store.period_retention_s)


def _use_data_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``serve --data-dir DIR``: the same setting as the group's ``--data-dir``, given later."""
    opener = ctx.find_object(StoreOpener)
    if value is not None and opener is not None:
        opener.data_dir = value


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    expose_value=False,
    callback=_use_data_dir,
    help=f"Directory of the embedded Redis, created if missing [LDP_DATA_DIR; default "
    f"{DEFAULT_DATA_DIR}]. Also accepted before 'serve'.",
)
@click.option("--host", help=f"Address to listen on [LDP_HOST; default {Settings.host}].")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help=f"Port to listen on [LDP_PORT; default {Settings.port}].",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    help=f"gunicorn worker processes [LDP_WORKERS; default {Settings.workers}].",
)
@click.option(
    "--redis-maxmemory",
    help="Memory limit of the embedded Redis: bytes or e.g. 512mb, 0 for none "
    "[LDP_REDIS_MAXMEMORY; default: a quarter of the machine's memory].",
)
@click.pass_obj
def serve(
    opener: StoreOpener,
    host: str | None,
    port: int | None,
    workers: int | None,
    redis_maxmemory: str | None,
) -> None:
    """Serve the API with gunicorn workers sharing one Redis.

    Without --redis-url the embedded Redis is started in --data-dir and stopped
    when the server stops; one left running by a server that was killed is shut
    down first. One serve per --data-dir. Tokens come from LDP_ADMIN_TOKEN and
    LDP_ANALYST_TOKEN (at least 32 characters unless LDP_ALLOW_WEAK_TOKENS=1);
    every other setting from its LDP_* variable (docs/aggregator.md). A bad
    setting stops serve before it listens, with exit status 2.
    """
    from aggregator.app import create_app
    from aggregator.http.wsgi import run_gunicorn

    settings = read_settings(
        redis_url=opener.redis_url,
        data_dir=opener.data_dir,
        redis_fsync=opener.fsync,
        host=host,
        port=port,
        workers=workers,
        redis_maxmemory=redis_maxmemory,
    )
    create_app(settings)  # what every worker will build, built once before anything starts
    # The data directory is this server's only with the embedded Redis; with an external
    # one, servers may share a machine (and gunicorn's control socket stays off).
    lock = None if settings.redis_url else DataDirLock(settings.data_dir)
    try:
        if lock is not None:
            lock.acquire()
        url = opener.url(maxmemory=settings.redis_maxmemory, exclusive=True)
    except DataDirBusy as exc:
        if lock is not None:
            lock.release()
        raise click.ClickException(str(exc)) from exc
    _warn_if_not_durable(url)
    # Campaigns of an earlier version are migrated once here, before any worker starts.
    open_store(url, settings).store.close()
    # Every worker builds its app from these settings, with the URL of the Redis just opened.
    app_factory = functools.partial(_worker_app, settings.replace(redis_url=url))
    control = str(lock.data_dir / CONTROL) if lock is not None else None
    try:
        run_gunicorn(
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            app_factory=app_factory,
            control_socket=control,
        )
    finally:
        opener.close()  # Redis stops before the data directory is given up
        if lock is not None:
            lock.release()


def _worker_app(settings: Settings) -> Any:
    """A worker's app, built in the worker once gunicorn has set its signal handlers; the
    worker then leaves Ctrl-C to the master.

    Ctrl-C sends SIGINT to every process of the terminal's foreground group: to the
    master, which stops each worker with SIGQUIT, and to each worker itself. A gevent
    worker answers both with gunicorn's quick exit, each in a greenlet of its own, and
    the second one's ``sys.exit(0)`` lands while the first is already ending the process:
    a ``SystemExit: 0`` traceback per worker. Ignoring SIGINT in the workers leaves them
    the master's SIGQUIT alone, which ends them quietly; SIGTERM and SIGQUIT are theirs
    as before.
    """
    from aggregator.app import create_app

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return create_app(settings)


def _warn_if_not_durable(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        appendonly = client.config_get("appendonly").get("appendonly")
    except redis.ResponseError:  # CONFIG is often disabled on managed servers
        return
    finally:
        client.close()
    if appendonly != "yes":
        click.echo(
            "Warning: the Redis server has appendonly off; acknowledged reports may be lost "
            "in a crash.",
            err=True,
        )


@main.group()
def campaign() -> None:
    """List, create, show, open and close campaigns."""


@campaign.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the campaigns as a JSON list.")
@click.pass_obj
def campaign_list(opener: StoreOpener, as_json: bool) -> None:
    """One line per campaign: id, mechanism, status, reports, title."""
    campaigns = opener.store().list_campaigns()
    if as_json:
        _echo_json([{**c.to_wire(), "n_reports": c.n_reports} for c in campaigns])
        return
    for campaign in campaigns:
        spec = campaign.spec
        click.echo(
            f"{printable(spec.id)}\t{spec.mechanism}\t{campaign.status}\t{campaign.n_reports}\t"
            f"{printable(spec.title)}"
        )


@campaign.command("create")
@click.argument("spec_file", type=click.File("r", encoding="utf-8"))
@click.pass_obj
def campaign_create(opener: StoreOpener, spec_file: Any) -> None:
    """Create a campaign from a JSON spec file ('-' reads standard input).

    Without a mechanism the file gives the domain and the mechanism is chosen as
    POST /api/v1/campaigns chooses it; the output then carries the advice.
    """
    try:
        raw = json.load(spec_file)
    except ValueError as exc:
        raise click.ClickException(f"{spec_file.name} is not valid JSON: {exc}") from exc
    spec, advice = spec_and_advice(raw)
    campaign, created = opener.store().create_campaign(spec)
    if not created:
        click.echo(f"campaign {spec.id!r} already exists with this spec", err=True)
    wire = campaign.to_wire()
    if advice is not None:
        wire["advice"] = advice
    _echo_json(wire)


@campaign.command("show")
@click.argument("campaign_id")
@click.pass_obj
def campaign_show(opener: StoreOpener, campaign_id: str) -> None:
    """Print a campaign's spec, hash, status and report count."""
    campaign = opener.store().get_campaign(campaign_id)
    _echo_json({**campaign.to_wire(), "n_reports": campaign.n_reports})


@campaign.command("close")
@click.argument("campaign_id")
@click.pass_obj
def campaign_close(opener: StoreOpener, campaign_id: str) -> None:
    """Stop accepting reports for a campaign."""
    opener.store().set_status(campaign_id, CLOSED)
    click.echo(f"campaign {campaign_id!r} closed")


@campaign.command("open")
@click.argument("campaign_id")
@click.pass_obj
def campaign_open(opener: StoreOpener, campaign_id: str) -> None:
    """Accept reports for a campaign again."""
    opener.store().set_status(campaign_id, OPEN)
    click.echo(f"campaign {campaign_id!r} open")


@main.command("estimate")
@click.argument("campaign_id")
@click.option(
    "--method",
    type=click.Choice(estimates.METHODS),
    help="Estimation method [default: the campaign's, as the API's].",
)
@click.option(
    "--confidence",
    type=click.Choice([str(level) for level in estimates.CONFIDENCE_LEVELS]),
    default=str(estimates.DEFAULT_CONFIDENCE),
    show_default=True,
)
@click.option(
    "--top",
    type=click.IntRange(1),
    help=f"Show the N outputs with the largest estimated share "
    f"[default: {DEFAULT_TOP_CELLS} cells for locations, every label in order otherwise].",
)
@click.option("--all", "show_all", is_flag=True, help="Show every output (cells by share).")
@click.option(
    "--max-work",
    metavar="N",
    envvar="LDP_ESTIMATE_MAX_WORK",
    default=str(Settings.estimate_max_work),
    show_default=True,
    callback=_checked_setting("estimate_max_work"),
    help="Work cap of the estimate (cells x iterations x replicates), as the server's "
    "[LDP_ESTIMATE_MAX_WORK; null: none].",
)
@click.option(
    "--timeout-s",
    metavar="S",
    envvar="LDP_ESTIMATE_TIMEOUT_S",
    default=str(Settings.estimate_timeout_s),
    show_default=True,
    callback=_checked_setting("estimate_timeout_s"),
    help="Time limit of the estimate in seconds, as the server's "
    "[LDP_ESTIMATE_TIMEOUT_S; null: none].",
)
@click.option("--no-limits", is_flag=True, help="Compute however long the estimate takes.")
@click.option(
    "--threads",
    metavar="N",
    envvar="LDP_ESTIMATE_THREADS",
    default=str(Settings.estimate_threads),
    show_default=True,
    callback=_checked_setting("estimate_threads"),
    help="Threads for the estimate's folds and refits, as the server's "
    "[LDP_ESTIMATE_THREADS; 0: the CPUs available, at most 4].",
)
@click.option(
    "--details",
    "show_details",
    is_flag=True,
    help="Also print how the intervals were made and the estimator's details (folds, "
    "iterations chosen, ...).",
)
@_since_option
@_until_option
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table.")
@click.pass_obj
def estimate_command(
    opener: StoreOpener,
    campaign_id: str,
    method: str | None,
    confidence: str,
    top: int | None,
    show_all: bool,
    max_work: int | None,
    timeout_s: float | None,
    no_limits: bool,
    threads: int,
    show_details: bool,
    since: str | None,
    until: str | None,
    as_json: bool,
) -> None:
    """Estimate a campaign's distribution with confidence intervals, over all its reports or
    over the window of --since and --until.

    Prints the method that ran, its one-line description and every warning
    the API gives with the estimate ("warning: ..."), then the table.
    Locations show their cells' centres, largest estimated share first.
    The estimate is bounded like the server's (LDP_ESTIMATE_MAX_WORK,
    LDP_ESTIMATE_TIMEOUT_S) unless --no-limits is given.
    """
    store = opener.store()
    campaign = store.get_campaign(campaign_id)
    if no_limits:
        max_work = timeout_s = None
    limits = estimates.EstimateLimits(max_work, timeout_s, threads)
    method = method or estimates.default_method(campaign.mechanism)
    window = _window(store, campaign, since, until)
    result, _ = estimates.cached_estimate(
        store, campaign, method, float(confidence), window=window, limits=limits
    )
    if as_json:
        _echo_json(result)
        return
    _echo_estimate_head(campaign.spec.id, result, show_details)
    rows = result["estimates"]
    planar = isinstance(campaign.mechanism, GridMechanism)
    if planar and top is None and not show_all:
        top = DEFAULT_TOP_CELLS
    shown = list(range(len(rows)))
    if planar or (top is not None and not show_all):
        shown.sort(key=lambda y: -rows[y]["frequency"])  # stable: ties keep their order
    if top is not None and not show_all and top < len(rows):
        shown = shown[:top]
        click.echo(
            f"the {top} of {len(rows)} {'cells' if planar else 'labels'} with the largest "
            "estimated share (--all for every one)"
        )
    level = f"{float(confidence):.0%}"
    interval = f"{'frequency':>10} {level + ' low':>10} {level + ' high':>10}"
    if planar:
        click.echo(f"{'cell':<12} {'lat':>10} {'lon':>11} {interval}")
    else:
        click.echo(f"{'label':<24} {interval}")
    for y in shown:
        row = rows[y]
        numbers = f"{row['frequency']:>10.4f} {row['ci_low']:>10.4f} {row['ci_high']:>10.4f}"
        if planar:
            centre = campaign.mechanism.report_value(y)
            location = f"{centre['lat']:>10.5f} {centre['lon']:>11.5f}"
            click.echo(f"{printable(row['label']):<12} {location} {numbers}")
        else:
            click.echo(f"{printable(row['label']):<24} {numbers}")


def _echo_estimate_head(campaign_id: str, result: dict[str, Any], show_details: bool) -> None:
    """What ran and what to know about it: the method the body names (the one whose numbers
    these are), its headline, the iterations, every warning, and on request the details."""
    click.echo(
        f"campaign {printable(campaign_id)}{_window_words(result)}  method {result['method']}  "
        f"n {result['n']}"
    )
    if result.get("estimator"):
        click.echo(f"estimator {printable(result['estimator'])}")
    if result.get("n_iter") is not None:
        click.echo(f"iterations {result['n_iter']}  converged {result['converged']}")
    for warning in result.get("warnings", ()):
        click.echo(f"warning: {printable(warning)}")
    if not show_details:
        return
    if result.get("interval_method"):
        click.echo(f"interval method: {printable(result['interval_method'])}")
    for key, value in (result.get("details") or {}).items():
        shown = value if isinstance(value, str) else json_text(value)
        click.echo(f"detail {printable(key)}: {printable(shown)}")


def _window_words(body: dict[str, Any]) -> str:
    """``  window 2026-12-01 to 2026-12-07`` for a body over a window, else nothing."""
    window = body.get("window")
    if not window:
        return ""
    since, until = window["since"], window["until"]
    return f"  window {since}" if since == until else f"  window {since} to {until}"


@main.command("counts")
@click.argument("campaign_id")
@_since_option
@_until_option
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table.")
@click.pass_obj
def counts_command(
    opener: StoreOpener, campaign_id: str, since: str | None, until: str | None, as_json: bool
) -> None:
    """Reports per output symbol, over all time or the window of --since and --until.

    These are the noisy reports as received (GET .../counts), not an estimate:
    `ldp-aggregator estimate` corrects them for the noise.
    """
    store = opener.store()
    campaign = store.get_campaign(campaign_id)
    window = _window(store, campaign, since, until)
    counts = estimates.window_counts(store, campaign, window)
    labels = estimates.output_labels(campaign.mechanism)
    body = export.window_counts_body(campaign, counts, [], window)
    del body["hourly"]
    if as_json:
        _echo_json(body)
        return
    click.echo(f"campaign {printable(campaign_id)}{_window_words(body)}  n {body['n']}")
    for warning in body.get("warnings", ()):
        click.echo(f"warning: {printable(warning)}")
    click.echo(f"{'label':<24} {'count':>10}")
    for y, label in enumerate(labels):
        if counts.get(y) or not estimates.is_oracle(campaign.mechanism):
            click.echo(f"{printable(label):<24} {counts.get(y, 0):>10}")


@main.command("export")
@click.argument("campaign_id")
@click.option(
    "--data",
    type=click.Choice(("reports", "counts", "estimate")),
    default="reports",
    show_default=True,
    help="Every stored report, the counts per output symbol, or the estimate.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(export.FORMATS),
    default="json",
    show_default=True,
    help="JSON (reports: one per line) or CSV.",
)
@click.option(
    "--method",
    type=click.Choice(estimates.METHODS),
    help="Estimation method (--data estimate) [default: the campaign's, as the API's].",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=estimates.DEFAULT_CONFIDENCE,
    show_default=True,
    help="Interval confidence level (--data estimate).",
)
@click.option(
    "-o",
    "--output",
    type=click.File("w", encoding="utf-8"),
    default="-",
    help="File to write (default: standard output).",
)
@_since_option
@_until_option
@click.pass_obj
def export_command(
    opener: StoreOpener,
    campaign_id: str,
    data: str,
    output_format: str,
    method: str | None,
    confidence: float,
    output: Any,
    since: str | None,
    until: str | None,
) -> None:
    """Write a campaign's reports, counts or estimate as JSON or CSV, over all time or the
    window of --since and --until.

    The counts and the estimate are the files the API serves at
    /counts?format=... and /estimate?format=... (with since and until);
    reports come oldest first, those of a window received in it.
    """
    store = opener.store()
    campaign = store.get_campaign(campaign_id)
    window = _window(store, campaign, since, until)
    if data == "reports":
        if not store.keeps_raw_reports and not store.has_raw_reports(campaign_id):
            raise click.ClickException(
                f"campaign {campaign_id!r} has no raw reports: the store keeps counts only "
                "(LDP_RAW_REPORTS=off); export --data counts, or set LDP_RAW_REPORTS=keep to "
                "keep the reports that arrive from now on"
            )
        count = _export_reports(store, campaign, output_format, output, window)
        if output is not sys.stdout:
            click.echo(f"{count} reports written to {output.name}", err=True)
        return
    if data == "counts":
        counts = estimates.window_counts(store, campaign, window)
        if output_format == "csv":
            output.write(export.counts_csv(campaign, counts))
        else:
            hourly = store.hourly_counts(campaign_id)
            body = export.window_counts_body(campaign, counts, hourly, window)
            output.write(json_text(body, indent=2) + "\n")
    else:
        method = method or estimates.default_method(campaign.mechanism)
        body, _ = estimates.cached_estimate(store, campaign, method, confidence, window=window)
        if output_format == "csv":
            output.write(export.estimate_csv(campaign, body))
        else:
            output.write(json_text(body, indent=2) + "\n")
    if output is not sys.stdout:
        click.echo(f"{data} written to {output.name}", err=True)


def _export_reports(
    store: CampaignStore,
    campaign: Any,
    output_format: str,
    output: Any,
    window: windows.WindowRead | None = None,
) -> int:
    start, end = -math.inf, math.inf
    if window is not None:
        start, end = window.window.start_s, window.window.end_s
    count = 0
    writer = None
    if output_format == "csv":
        writer = export.CSVWriter(output)
        writer.writerow(export.reports_csv_header(campaign))
    for report in store.iter_reports(campaign.spec.id):
        if not start <= report["received_at"] < end:
            continue
        if writer is not None:
            writer.writerow(export.reports_csv_row(report))
        else:
            output.write(export.reports_json_line(report))
        count += 1
    return count


@main.command()
@click.option(
    "--days",
    envvar="LDP_RETENTION_DAYS",
    required=True,
    type=click.FloatRange(0, min_open=True),
    help="Keep raw reports this many days [LDP_RETENTION_DAYS].",
)
@click.pass_obj
def retention(opener: StoreOpener, days: float) -> None:
    """Drop raw reports older than --days from every campaign's stream (counts stay).

    Ingestion trims a campaign's stream as reports arrive when LDP_RETENTION_DAYS
    is set; run this from cron for campaigns that no longer receive reports.
    """
    for campaign_id, count in trim_all(opener.store(), days * DAY_S).items():
        click.echo(f"{campaign_id}\t{count} raw reports removed")


@main.group()
def enrollment() -> None:
    """Single-use enrollment tokens for campaigns that require them."""


@enrollment.command("issue")
@click.argument("campaign_id")
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 10_000))
@click.pass_obj
def enrollment_issue(opener: StoreOpener, campaign_id: str, count: int) -> None:
    """Issue COUNT tokens and print them one per line: they are shown only this once."""
    store = opener.store()
    if not store.get_campaign(campaign_id).spec.enrollment_required:
        raise click.ClickException(f"campaign {campaign_id!r} does not require enrollment")
    tokens = [new_token() for _ in range(count)]
    unused = store.add_enrollment_tokens(campaign_id, tokens)
    click.echo("\n".join(tokens))
    click.echo(f"{count} issued; {unused} unused in all", err=True)


if __name__ == "__main__":
    main()

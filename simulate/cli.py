"""``ldp-simulate``: simulate a collection before launching it, in-process or end to end."""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from typing import Any

import click

from aggregator.estimation import METHODS
from shared.errors import LDPError
from shared.geo import Grid, Region
from shared.schema import is_positive_finite
from shared.spec import KRR, PLANAR_LAPLACE, RR, CampaignSpec
from simulate.populations import Population, cell_labels
from simulate.runner import ALL_METHODS, ResultRow, simulate
from simulate.via import (
    DEFAULT_DEADLINE_S,
    DEFAULT_WORKERS,
    ServerAPI,
    ViaResult,
    run_via_server,
)

CATEGORICAL = ("uniform", "zipf", "weights", "csv-column")
LOCATION = ("city", "csv-points")
DEFAULT_EPSILONS = {KRR: "0.5,1,2,4", RR: "0.5,1,2,4", PLANAR_LAPLACE: "0.005,0.01,0.02"}
DEFAULT_NS = "1000,10000,100000"
_LN = re.compile(r"^ln\(\s*([^()]+?)\s*\)\s*(?:/\s*(.+))?$")


def parse_epsilon(text: str) -> float:
    """A positive number, or ``ln(X)`` optionally divided by a number (``ln(2)/100``)."""
    text = text.strip()
    match = _LN.match(text)
    try:
        if match:
            value = math.log(float(match.group(1)))
            if match.group(2) is not None:
                value /= float(match.group(2))
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise click.BadParameter(f"{text!r} is not a number or ln(X)[/Y]") from None
    if not is_positive_finite(value):
        raise click.BadParameter(f"{text!r} is not a positive finite epsilon")
    return value


def parse_n(text: str) -> int:
    """A positive integer, also written ``1e5`` or ``10^5``."""
    text = text.strip().replace("_", "")
    power = re.fullmatch(r"(\d+)\^(\d+)", text)
    try:
        value = int(power.group(1)) ** int(power.group(2)) if power else float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number of users") from None
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise click.BadParameter(f"{text!r} is not a positive whole number of users")
    return int(value)


class CommaList(click.ParamType):
    """Comma-separated values (an option may also be repeated)."""

    name = "list"

    def __init__(self, item):
        self.item = item

    def convert(self, value: Any, param: Any, ctx: Any) -> list:
        if isinstance(value, list):
            return value
        return [self.item(part) for part in str(value).split(",") if part.strip()]


def _region(text: str) -> Region:
    parts = [p for p in text.split(",") if p.strip()]
    if len(parts) != 4:
        raise click.BadParameter("give lat_min,lat_max,lon_min,lon_max")
    spec = {
        "id": "region",
        "title": "region",
        "mechanism": PLANAR_LAPLACE,
        "epsilon": 1e-6,  # an epsilon the planar sampler realises on cells of 1,000 km
        "cell_size_m": 1.0e6,
    }
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise click.BadParameter("the region's bounds must be numbers") from None
    spec["region"] = dict(zip(("lat_min", "lat_max", "lon_min", "lon_max"), values, strict=True))
    # Parsed as part of a throw-away spec: the region gets exactly a campaign's checks.
    return CampaignSpec.from_dict(spec).region


class _Command(click.Command):
    """Library errors become ``Error: ...`` with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (LDPError, ValueError) as exc:
            raise click.ClickException(str(getattr(exc, "message", exc))) from exc


def _flatten(values: tuple[list, ...]) -> list:
    return [item for value in values for item in value]


@click.command(cls=_Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ldp-collect", prog_name="ldp-simulate")
@click.option(
    "--population",
    "kind",
    type=click.Choice(CATEGORICAL + LOCATION),
    default="zipf",
    show_default=True,
    help="Where the users' true values come from.",
)
@click.option(
    "-k",
    "--k",
    type=click.IntRange(2),
    default=10,
    show_default=True,
    help="Categories (uniform, zipf).",
)
@click.option(
    "--zipf-s", type=click.FloatRange(0), default=1.1, show_default=True, help="Zipf exponent."
)
@click.option("--weights", help="Explicit weights, e.g. 0.5,0.3,0.2 (population weights).")
@click.option("--labels", help="Category labels, comma-separated (default v0, v1, ...).")
@click.option(
    "--csv", "csv_path", type=click.Path(dir_okay=False), help="CSV file (csv-column, csv-points)."
)
@click.option("--column", help="The CSV column of categories (csv-column).")
@click.option(
    "--region",
    help="lat_min,lat_max,lon_min,lon_max (locations; csv-points default: the points' bounding box).",
)
@click.option(
    "--cell-size-m",
    type=click.FloatRange(1),
    default=100.0,
    show_default=True,
    help="Report grid cell size (locations).",
)
@click.option(
    "--hotspots",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Hotspots of the synthetic city.",
)
@click.option(
    "--mechanism",
    type=click.Choice((KRR, RR, PLANAR_LAPLACE)),
    help="Default: planar_laplace for locations, krr for categories. krr on a location "
    "population uses the grid cells as its domain.",
)
@click.option(
    "--spec",
    "spec_file",
    type=click.File("r", encoding="utf-8"),
    help="A campaign spec (JSON) to simulate; --epsilon overrides its epsilon.",
)
@click.option(
    "-e",
    "--epsilon",
    "epsilons",
    type=CommaList(parse_epsilon),
    multiple=True,
    help="Epsilons to sweep, e.g. 0.5,1,2 or ln(2)/100 (per metre for planar_laplace).",
)
@click.option(
    "-n",
    "--n",
    "ns",
    type=CommaList(parse_n),
    multiple=True,
    help=f"Numbers of users to sweep, e.g. 1e3,1e5 [default: {DEFAULT_NS}; a data set: every row once].",
)
@click.option(
    "-m",
    "--method",
    "methods",
    type=CommaList(str),
    multiple=True,
    help=f"Methods, among {', '.join(ALL_METHODS)} [default: all].",
)
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Runs per configuration; the table shows means.",
)
@click.option(
    "--ibu-iterations",
    type=click.IntRange(1),
    help="Fixed IBU iterations (default: cross-validated, as the server does).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the population and the noise."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False),
    help="Write PNG figures into this directory.",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bars (default: on a terminal)."
)
@click.option("--via", "via_url", help="End to end: drive the real client against this aggregator.")
@click.option(
    "--campaign",
    "campaign_id",
    help="With --via: the campaign to use or create (default: a new sim-... id).",
)
@click.option("--admin-token", envvar="LDP_ADMIN_TOKEN", help="With --via: to create the campaign.")
@click.option(
    "--analyst-token", envvar="LDP_ANALYST_TOKEN", help="With --via: to fetch counts and estimates."
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=DEFAULT_WORKERS,
    show_default=True,
    help="With --via: users reporting at once.",
)
@click.option(
    "--deadline",
    type=click.FloatRange(0, min_open=True),
    default=DEFAULT_DEADLINE_S,
    show_default=True,
    help="With --via: seconds to keep retrying reports the server defers.",
)
def main(**options: Any) -> None:
    """Simulate a local-DP collection: accuracy of every estimator for each epsilon and n.

    In-process (default), users are drawn from the population, perturbed with
    the campaign's mechanism (vectorised) and every method estimates the
    distribution; the table gives total variation, MSE, max absolute error,
    KL where defined, and for locations the earth mover's distance in metres.

    With --via URL, each simulated user reports through the real client
    library to a running aggregator, whose estimates are then scored.

    \b
    Examples:
      ldp-simulate --population zipf -k 20 -e 0.5,1,2,4 -n 1e3,1e5
      ldp-simulate --population city --region 37.77,37.80,-122.43,-122.39 \\
          --cell-size-m 150 -e "ln(2)/100" -n 1e4 --plot figures/
      ldp-simulate --population zipf -k 5 -n 300 -e 1 --via http://127.0.0.1:8000
    """
    epsilons = _flatten(options["epsilons"])
    ns = _flatten(options["ns"])
    methods = _flatten(options["methods"]) or list(ALL_METHODS)
    unknown = sorted(set(methods) - set(ALL_METHODS))
    if unknown:
        raise click.BadParameter(
            f"{unknown[0]!r}; choose among {', '.join(ALL_METHODS)}", param_hint="--method"
        )
    template = _template(options)
    if options["via_url"]:
        _run_via(options, template, epsilons, ns, methods)
        return
    population = _population(options, template)
    specs = _specs(options, template, population, epsilons)
    run_ns = ns or (
        [None] if population.rows is not None else [parse_n(x) for x in DEFAULT_NS.split(",")]
    )
    result = simulate(
        population,
        specs,
        run_ns,
        methods=methods,
        repeats=options["repeats"],
        seed=options["seed"],
        ibu_iterations=options["ibu_iterations"],
        progress=options["progress"],
    )
    written = []
    if options["plot_dir"]:
        from simulate.plots import write_plots

        written = write_plots(result, options["plot_dir"])
    if options["as_json"]:
        document = result.to_dict()
        document["plots"] = [str(p) for p in written]
        click.echo(json.dumps(document, indent=2, allow_nan=False))
        return
    click.echo(
        f"population: {population.name}; {population.size} values; truth = the simulated users' own values"
    )
    click.echo(format_table(result.rows))
    for path in written:
        click.echo(f"wrote {path}", err=True)


# -- building the population and the specs -------------------------------------------------------


def _template(options: dict[str, Any]) -> dict[str, Any] | None:
    """The spec to start from: a --spec file, or an existing --via campaign; None otherwise."""
    if options["spec_file"] is not None:
        try:
            data = json.load(options["spec_file"])
        except ValueError as exc:
            raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--spec") from None
        return CampaignSpec.from_dict(data).to_dict()
    if options["via_url"] and options["campaign_id"]:
        api = ServerAPI(options["via_url"])
        try:
            found = api.get_campaign(options["campaign_id"])
        finally:
            api.session.close()
        if found is not None:
            if options["epsilons"]:
                raise click.UsageError(
                    f"campaign {options['campaign_id']!r} exists; its epsilon cannot be changed"
                )
            return found[0].to_dict()
    return None


def _grid(options: dict[str, Any], template: dict[str, Any] | None) -> Grid | None:
    if template is not None and template["mechanism"] == PLANAR_LAPLACE:
        spec = CampaignSpec.from_dict(template)
        return spec.grid
    if options["region"]:
        return Grid(_region(options["region"]), options["cell_size_m"])
    return None


def _population(options: dict[str, Any], template: dict[str, Any] | None) -> Population:
    kind = options["kind"]
    if kind in LOCATION:
        grid = _grid(options, template)
        if kind == "city":
            if grid is None:
                raise click.UsageError("--population city needs --region (or a planar --spec)")
            return Population.clustered_city(
                grid, hotspots=options["hotspots"], seed=options["seed"]
            )
        if not options["csv_path"]:
            raise click.UsageError("--population csv-points needs --csv")
        return Population.from_csv_points(
            options["csv_path"], grid, cell_size_m=options["cell_size_m"]
        )
    if template is not None and template["mechanism"] == PLANAR_LAPLACE:
        raise click.UsageError(
            f"a planar_laplace campaign needs a location population ({', '.join(LOCATION)})"
        )
    labels = tuple(template["domain"]) if template is not None else None
    if labels is None and options["labels"]:
        labels = tuple(x.strip() for x in options["labels"].split(","))
    if kind == "csv-column":
        if not (options["csv_path"] and options["column"]):
            raise click.UsageError("--population csv-column needs --csv and --column")
        return Population.from_csv_column(options["csv_path"], options["column"], labels)
    if kind == "weights":
        if not options["weights"]:
            raise click.UsageError("--population weights needs --weights")
        try:
            weights = [float(w) for w in options["weights"].split(",")]
        except ValueError:
            raise click.BadParameter("weights must be numbers", param_hint="--weights") from None
        return Population.from_weights(weights, labels)
    k = len(labels) if labels is not None else options["k"]
    if kind == "uniform":
        return Population.uniform(k, labels)
    return Population.zipf(k, options["zipf_s"], labels)


def _specs(
    options: dict[str, Any],
    template: dict[str, Any] | None,
    population: Population,
    epsilons: list[float],
) -> list[CampaignSpec]:
    if template is not None:
        base = dict(template)
    else:
        mechanism = options["mechanism"] or (PLANAR_LAPLACE if population.is_location else KRR)
        base = {
            "id": options["campaign_id"] or "simulation",
            "title": "Simulation",
            "mechanism": mechanism,
        }
        if mechanism == PLANAR_LAPLACE:
            if population.grid is None:
                raise click.UsageError("planar_laplace needs a location population")
            base["region"] = population.grid.region.to_dict()
            base["cell_size_m"] = population.grid.cell_size_m
        elif population.is_location:
            base["domain"] = list(cell_labels(population.grid))
        else:
            base["domain"] = list(population.labels)
    if not epsilons:
        if "epsilon" in base:
            epsilons = [base["epsilon"]]
        else:
            epsilons = [parse_epsilon(x) for x in DEFAULT_EPSILONS[base["mechanism"]].split(",")]
    specs = []
    for epsilon in epsilons:
        data = {**base, "epsilon": epsilon}
        # A level and radius pin epsilon; a swept epsilon replaces them.
        if epsilon != base.get("epsilon"):
            data.pop("privacy_level", None)
            data.pop("privacy_radius_m", None)
        specs.append(CampaignSpec.from_dict(data))
    return specs


# -- end to end ---------------------------------------------------------------------------------


def _run_via(
    options: dict[str, Any],
    template: dict[str, Any] | None,
    epsilons: list[float],
    ns: list[int],
    methods: list[str],
) -> None:
    if len(epsilons) > 1 or len(ns) > 1:
        raise click.UsageError("--via runs one campaign: give at most one --epsilon and one --n")
    if options["repeats"] != 1 or options["ibu_iterations"] or options["plot_dir"]:
        raise click.UsageError("--repeats, --ibu-iterations and --plot are for in-process runs")
    population = _population(options, template)
    if template is None and not options["campaign_id"]:
        options = {**options, "campaign_id": f"sim-{int(time.time())}-{secrets.token_hex(3)}"}
    spec = _specs(options, template, population, epsilons)[0]
    n = ns[0] if ns else (None if population.rows is not None else 1000)
    server_methods = [m for m in methods if m in METHODS]
    result = run_via_server(
        options["via_url"],
        spec,
        population,
        n,
        admin_token=options["admin_token"],
        analyst_token=options["analyst_token"],
        methods=server_methods,
        workers=options["workers"],
        seed=options["seed"],
        progress=options["progress"],
        deadline_s=options["deadline"],
    )
    if options["as_json"]:
        click.echo(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        click.echo(format_via(result))
    if result.failed:
        raise click.ClickException(
            f"{result.failed} of {result.n_users} simulated users could not report"
        )


# -- output -------------------------------------------------------------------------------------


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def _table(header: list[str], lines: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        out.append("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) + " |")
    return "\n".join(out)


def format_table(rows: list[ResultRow]) -> str:
    """The accuracy table, one line per (mechanism, epsilon, n, method), in markdown."""
    location = any(row.scores.emd_m is not None for row in rows)
    repeats = any(row.repeats > 1 for row in rows)
    header = ["mechanism", "epsilon", "n", "method", "TV"]
    header += ["TV sd"] if repeats else []
    header += ["MSE", "max |err|", "KL"] + (["EMD (m)"] if location else []) + ["iters", "seconds"]
    lines = []
    for row in rows:
        s = row.scores
        line = [row.mechanism, _number(row.epsilon), str(row.n), row.method, _number(s.tv)]
        line += [_number(row.scores_sd.tv, 2)] if repeats else []
        line += [_number(s.mse, 3), _number(s.max_abs), _number(s.kl)]
        line += [_number(s.emd_m)] if location else []
        line += ["-" if row.n_iter is None else f"{row.n_iter:.0f}", _number(row.seconds, 2)]
        lines.append(line)
    return _table(header, lines)


def format_via(result: ViaResult) -> str:
    """A summary of an end-to-end run and the table of server and in-process scores."""
    rate = result.delivered / result.seconds if result.seconds > 0 else float("nan")
    text = [
        f"campaign {result.campaign_id} at {result.url} ({'created' if result.created else 'existing'}, "
        f"spec hash {result.spec_hash[:12]}...)",
        f"{result.n_users} simulated users: {result.delivered} delivered ({result.duplicates} duplicates), "
        f"{result.failed} failed, in {result.seconds:.1f} s ({rate:.0f} reports/s)",
    ]
    text += [f"  error: {message}" for message in result.errors]
    if result.previous_n:
        text.append(
            f"warning: the campaign already held {result.previous_n} reports; the server's "
            "estimates include them, so the scores below are not about these users alone"
        )
    if not result.scores:
        text.append(
            "no analyst token (--analyst-token or LDP_ANALYST_TOKEN): estimates not fetched"
        )
        return "\n".join(text)
    location = any(s.emd_m is not None for s in result.scores.values())
    header = ["source", "method", "TV", "MSE", "max |err|", "KL"] + (
        ["EMD (m)"] if location else []
    )
    lines = []
    for source, table in (("server", result.scores), ("in-process", result.in_process)):
        for method, s in table.items():
            line = [
                source,
                method,
                _number(s.tv),
                _number(s.mse, 3),
                _number(s.max_abs),
                _number(s.kl),
            ]
            lines.append(line + ([_number(s.emd_m)] if location else []))
    text.append(
        f"server n = {result.server_n}; in-process = the same users through the vectorised sampler"
    )
    text.append(_table(header, lines))
    return "\n".join(text)

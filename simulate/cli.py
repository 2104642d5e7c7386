"""``ldp-simulate``: simulate a collection before launching it.

Subcommands: ``run`` (in-process sweep of epsilons, sizes and estimators),
``via`` (end to end through the real client against a server),
``reproduce`` (planar Laplace versus k-RR on real check-ins) and ``advise``
(the mechanisms for a domain ranked by expected error). Their options
are in :mod:`simulate.options`, their tables in :mod:`simulate.tables`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from typing import Any

import click

from aggregator.estimation import METHODS
from aggregator.estimation.decision import SMOOTHED
from shared.errors import LDPError
from shared.geo import Grid
from shared.spec import (
    EXPONENTIAL_GRID,
    GEOMETRIC,
    GRID_MECHANISMS,
    HADAMARD_RESPONSE,
    KRR,
    OLH_NAME,
    OUE_NAME,
    PLANAR_LAPLACE,
    CampaignSpec,
)
from simulate.advisor import DEFAULT_SEED, DEFAULT_TRIALS, format_advice
from simulate.advisor import advise as advise_mechanisms
from simulate.options import (
    DEFAULT_EPSILONS,
    DEFAULT_NS,
    LOCATION,
    ORACLE_MECHANISMS,
    CommaList,
    Parsed,
    flatten,
    ibu_iterations_option,
    json_option,
    output_options,
    parse_epsilon,
    parse_n,
    parse_region,
    plot_option,
    population_options,
    repeats_option,
    version_option,
)
from simulate.populations import Population
from simulate.reproduce import format_reproduction, reproduce_gowalla
from simulate.runner import ALL_METHODS, simulate
from simulate.tables import format_table, format_via
from simulate.via import DEFAULT_DEADLINE_S, DEFAULT_WORKERS, ServerAPI, run_via_server


class _Command(click.Command):
    """Library errors become ``Error: ...`` with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (LDPError, ValueError) as exc:
            raise click.ClickException(str(getattr(exc, "message", exc))) from exc


class _Group(click.Group):
    """The subcommands; an option given before the subcommand gets a hint where it belongs."""

    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            exc.message += (  # type: ignore[misc]  # click types it Final; amended on purpose
                " Options follow the subcommand: 'ldp-simulate run [OPTIONS]' (in-process) or "
                "'ldp-simulate via --server URL [OPTIONS]' (end to end)."
            )
            raise


@click.group(
    cls=_Group, name="ldp-simulate", context_settings={"help_option_names": ["-h", "--help"]}
)
@version_option
def main() -> None:
    """Simulate a local-DP collection before launching it, in-process or end to end.

    Each subcommand has its own options: ldp-simulate SUBCOMMAND -h.
    """


@main.command()
@population_options
@click.option(
    "-e",
    "--epsilon",
    "epsilons",
    type=CommaList(parse_epsilon),
    multiple=True,
    help="Epsilons to sweep, e.g. 0.5,1,2 or ln(2)/100 (per metre for planar_laplace and "
    "exponential_grid, per unit for geometric).",
)
@click.option(
    "-n",
    "--n",
    "ns",
    type=CommaList(parse_n),
    multiple=True,
    help=f"Numbers of users to sweep, e.g. 1e3,1e5 [default: {DEFAULT_NS}; a data set: every row once].",
)
@output_options
@repeats_option(1, "Runs per configuration; the table shows means.")
@ibu_iterations_option(None, "Fixed IBU iterations (default: cross-validated, as the server does).")
@plot_option("Write PNG figures into this directory.")
@version_option
def run(**options: Any) -> None:
    """In-process: the accuracy of every estimator for each epsilon and n.

    Users are drawn from the population, perturbed with the campaign's
    mechanism (vectorised) and every method estimates the distribution; the
    table gives total variation, MSE, max absolute error, KL where defined,
    and for locations the earth mover's distance in metres.

    \b
    Examples:
      ldp-simulate run --population zipf -k 20 -e 0.5,1,2,4 -n 1e3,1e5
      ldp-simulate run --population city --region 37.77,37.80,-122.43,-122.39 \\
          --cell-size-m 150 -e "ln(2)/100" -n 1e4 --plot figures/
    """
    template = _spec_template(options["spec_file"])
    population = _population(options, template)
    specs = _specs(options, template, population, flatten(options["epsilons"]))
    ns = flatten(options["ns"])
    run_ns = ns or (
        [None] if population.rows is not None else [parse_n(x) for x in DEFAULT_NS.split(",")]
    )
    result = simulate(
        population,
        specs,
        run_ns,
        methods=flatten(options["methods"]) or _default_methods(specs[0]),
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


@main.command()
@click.option(
    "--server",
    "server_url",
    envvar="LDP_SERVER_URL",
    required=True,
    metavar="URL",
    help="Aggregator base URL [LDP_SERVER_URL].",
)
@population_options
@click.option(
    "-e",
    "--epsilon",
    type=Parsed("epsilon", parse_epsilon),
    help="The campaign's one epsilon, e.g. 1 or ln(2)/100 [default: the spec's; otherwise "
    f"{DEFAULT_EPSILONS[KRR].split(',')[0]}, or {DEFAULT_EPSILONS[PLANAR_LAPLACE].split(',')[0]} "
    "for planar_laplace and exponential_grid].",
)
@click.option(
    "-n",
    "--n",
    type=Parsed("users", parse_n),
    help="Users to simulate [default: 1000; a data set: every row once].",
)
@output_options
@click.option(
    "--campaign",
    "campaign_id",
    help="The campaign to use or create (default: a new sim-... id).",
)
@click.option("--admin-token", envvar="LDP_ADMIN_TOKEN", help="To create the campaign.")
@click.option("--analyst-token", envvar="LDP_ANALYST_TOKEN", help="To fetch counts and estimates.")
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=DEFAULT_WORKERS,
    show_default=True,
    help="Users reporting at once.",
)
@click.option(
    "--deadline",
    type=click.FloatRange(0, min_open=True),
    default=DEFAULT_DEADLINE_S,
    show_default=True,
    help="Seconds to keep retrying reports the server defers.",
)
@version_option
def via(**options: Any) -> None:
    """End to end: simulated users report through the real client to a running aggregator.

    The campaign is created (admin token) or reused (--campaign ID); each
    user reports through the client library; with the analyst token the
    server's estimates are fetched and scored next to an in-process run of
    the same users.

    \b
    Example:
      LDP_ADMIN_TOKEN=... LDP_ANALYST_TOKEN=... ldp-simulate via \\
          --server http://127.0.0.1:8000 --population zipf -k 5 -n 300 -e 1
    """
    epsilons = [] if options["epsilon"] is None else [options["epsilon"]]
    template = _spec_template(options["spec_file"])
    if template is None and options["campaign_id"]:
        template = _existing_campaign(options["server_url"], options["campaign_id"], epsilons)
    population = _population(options, template)
    if template is None and not options["campaign_id"]:
        options = {**options, "campaign_id": f"sim-{int(time.time())}-{secrets.token_hex(3)}"}
    spec = _specs(options, template, population, epsilons)[0]
    n = options["n"] or (None if population.rows is not None else 1000)
    methods = flatten(options["methods"]) or _default_methods(spec)
    result = run_via_server(
        options["server_url"],
        spec,
        population,
        n,
        admin_token=options["admin_token"],
        analyst_token=options["analyst_token"],
        methods=[m for m in methods if m in METHODS],
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


@main.command()
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="The check-ins: a CSV file with lat and lon columns, one report per row "
    "(e.g. ../shared/data/gowalla_sf_downtown.csv).",
)
@repeats_option(20, "Noise draws per row; the table shows mean and sd.")
@ibu_iterations_option(
    500, "IBU's fixed iterations (a cross-validated run is added for comparison)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise.")
@plot_option("Write the fixed-iteration runs' PNG figures into this directory.")
@json_option
@version_option
def reproduce(
    csv_path: str,
    repeats: int,
    ibu_iterations: int,
    seed: int,
    plot_dir: str | None,
    as_json: bool,
) -> None:
    """Planar Laplace versus k-RR on check-ins, reconstructed by IBU, compared by EMD.

    The comparison of the IBU literature: the 3 km square around the
    check-ins on a 20 x 20 grid of 150 m cells; planar Laplace at ln(2) per
    100 m and k-RR over the 400 cells at ln(8) (docs/simulation.md).

    \b
    Example:
      ldp-simulate reproduce --csv ../shared/data/gowalla_sf_downtown.csv --plot figures/
    """
    reproduction = reproduce_gowalla(
        csv_path,
        repeats=repeats,
        iterations=ibu_iterations,
        seed=seed,
        plot_dir=plot_dir,
        log=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(reproduction.to_dict(), indent=2, allow_nan=False))
        return
    click.echo(format_reproduction(reproduction))
    for path in reproduction.plots:
        click.echo(f"wrote {path}", err=True)


@main.command()
@click.option(
    "-k", "--domain-size", type=click.IntRange(2), help="Categories: the number of labels."
)
@click.option("--lo", type=int, help="An integer range: its lowest value (with --hi).")
@click.option("--hi", type=int, help="An integer range: its highest value (with --lo).")
@click.option(
    "--region",
    "region_text",
    help="Locations: lat_min,lat_max,lon_min,lon_max (with --cell-size-m).",
)
@click.option("--cell-size-m", type=click.FloatRange(1), help="Locations: the grid's cell size.")
@click.option(
    "-e",
    "--epsilon",
    type=Parsed("epsilon", parse_epsilon),
    required=True,
    help="Local-DP epsilon; per unit for a range, per metre for a region (e.g. ln(2)/100).",
)
@click.option(
    "-n", "--users", type=Parsed("users", parse_n), required=True, help="Expected users, e.g. 1e4."
)
@click.option(
    "--trials",
    type=click.IntRange(1),
    default=DEFAULT_TRIALS,
    show_default=True,
    help="Simulated draws per mechanism (regions).",
)
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True, help="Seed (regions).")
@json_option
@version_option
def advise(
    domain_size: int | None,
    lo: int | None,
    hi: int | None,
    region_text: str | None,
    cell_size_m: float | None,
    epsilon: float,
    users: int,
    trials: int,
    seed: int,
    as_json: bool,
) -> None:
    """Rank the mechanisms for a domain by expected error, best first, and recommend one.

    Categories (-k) and integer ranges (--lo/--hi) are ranked by closed forms
    of the expected squared error of the frequency estimate, summed over the
    domain; a region by a short seeded simulation of the earth mover's
    distance (docs/simulation.md).

    \b
    Examples:
      ldp-simulate advise --domain-size 8 --epsilon 1 --users 1e4 --json
      ldp-simulate advise --lo 0 --hi 99 --epsilon 0.5 --users 1e4
      ldp-simulate advise --region 37.77,37.80,-122.43,-122.39 --cell-size-m 150 \\
          --epsilon "ln(2)/100" --users 1e4
    """
    region = parse_region(region_text) if region_text else None
    options = advise_mechanisms(
        epsilon=epsilon,
        users=users,
        domain_size=domain_size,
        lo=lo,
        hi=hi,
        region=region,
        cell_size_m=cell_size_m,
        trials=trials,
        seed=seed,
    )
    if as_json:
        click.echo(json.dumps([o.to_dict() for o in options], indent=2, allow_nan=False))
    else:
        click.echo(format_advice(options))


# -- building the population and the specs -------------------------------------------------------


def _spec_template(spec_file: Any) -> dict[str, Any] | None:
    """The spec of a --spec file, or None."""
    if spec_file is None:
        return None
    try:
        data = json.load(spec_file)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--spec") from None
    return CampaignSpec.from_dict(data).to_dict()


def _existing_campaign(
    server_url: str, campaign_id: str, epsilons: list[float]
) -> dict[str, Any] | None:
    """The spec of campaign ``campaign_id`` on the server, or None if it does not exist."""
    api = ServerAPI(server_url)
    try:
        found = api.get_campaign(campaign_id)
    finally:
        api.session.close()
    if found is None:
        return None
    if epsilons:
        raise click.UsageError(f"campaign {campaign_id!r} exists; its epsilon cannot be changed")
    return found[0].to_dict()


def _grid(options: dict[str, Any], template: dict[str, Any] | None) -> Grid | None:
    if template is not None and template["mechanism"] in GRID_MECHANISMS:
        spec = CampaignSpec.from_dict(template)
        return spec.grid
    if options["region"]:
        return Grid(parse_region(options["region"]), options["cell_size_m"])
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
    if template is not None and template["mechanism"] in GRID_MECHANISMS:
        raise click.UsageError(
            f"a {template['mechanism']} campaign needs a location population "
            f"({', '.join(LOCATION)})"
        )
    labels = _template_labels(template)
    if labels is None and (template is None and options["mechanism"] == GEOMETRIC):
        if options["labels"] or kind == "csv-column":
            raise click.UsageError("geometric takes its values from -k and --lo, not labels")
        labels = tuple(str(options["lo"] + i) for i in range(options["k"]))
    if labels is None and template is None and options["mechanism"] in ORACLE_MECHANISMS:
        if options["labels"] or kind == "csv-column":
            raise click.UsageError(
                f"{options['mechanism']} takes its values from -k (the integers 0 .. k - 1), "
                "not labels"
            )
        labels = tuple(str(i) for i in range(options["k"]))
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


def _default_methods(spec: CampaignSpec) -> list[str]:
    """Every method the spec's mechanism takes (the smoothed Norm-Sub over a region's cells
    only); for the large-domain oracles all but IBU and the MLE, whose every iteration hashes
    every value under every seed (ask for them with -m ibu, best with --ibu-iterations)."""
    cells = spec.region is not None and spec.mechanism not in GRID_MECHANISMS
    skipped = set() if cells else {SMOOTHED}
    if spec.mechanism in ORACLE_MECHANISMS:
        skipped |= {"ibu", "mle"}
    return [m for m in ALL_METHODS if m not in skipped]


def _template_labels(template: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The true values a spec file fixes, as the population's labels (a range as integer text)."""
    if template is None:
        return None
    if template["mechanism"] == GEOMETRIC:
        return tuple(str(v) for v in range(template["lo"], template["hi"] + 1))
    if "domain_size" in template:
        return tuple(str(v) for v in range(template["domain_size"]))
    return tuple(template["domain"])


def _specs(
    options: dict[str, Any],
    template: dict[str, Any] | None,
    population: Population,
    epsilons: list[float],
) -> list[CampaignSpec]:
    if options.get("metric") and (
        (template or {}).get("mechanism", options["mechanism"]) != EXPONENTIAL_GRID
    ):
        raise click.UsageError("--metric applies to --mechanism exponential_grid only")
    if template is not None:
        base = dict(template)
        if options.get("metric") and base.get("metric", "manhattan") != options["metric"]:
            raise click.UsageError("--metric disagrees with the --spec file's metric")
    else:
        mechanism = options["mechanism"] or (PLANAR_LAPLACE if population.is_location else KRR)
        base = {
            "id": options.get("campaign_id") or "simulation",
            "title": "Simulation",
            "mechanism": mechanism,
        }
        # A location population makes k-RR, OLH and Hadamard response region campaigns over
        # its grid's cells, as the service collects them.
        over_cells = population.is_location and mechanism in (KRR, OLH_NAME, HADAMARD_RESPONSE)
        if mechanism in GRID_MECHANISMS or over_cells:
            if population.grid is None:
                raise click.UsageError(f"{mechanism} needs a location population")
            base["region"] = population.grid.region.to_dict()
            base["cell_size_m"] = population.grid.cell_size_m
            if mechanism == EXPONENTIAL_GRID and options.get("metric"):
                base["metric"] = options["metric"]
        elif mechanism == GEOMETRIC:
            if population.is_location:
                raise click.UsageError("geometric needs a categorical population (its range)")
            base["lo"] = options["lo"]
            base["hi"] = options["lo"] + population.size - 1
        elif mechanism in ORACLE_MECHANISMS:
            if population.is_location:
                raise click.UsageError(f"{mechanism} needs a categorical population")
            base["domain_size"] = population.size
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
        if data["mechanism"] == OUE_NAME:
            # Simulated only: the service refuses oue, so its spec is checked as olh's.
            checked = CampaignSpec.from_dict({**data, "mechanism": OLH_NAME})
            specs.append(dataclasses.replace(checked, mechanism=OUE_NAME))
        else:
            specs.append(CampaignSpec.from_dict(data))
    return specs

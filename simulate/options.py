"""The options of ``ldp-simulate``: notations for epsilon and n, and shared option groups.

``run`` and ``via`` share the population options and the output options
(methods, seed, JSON, progress); each subcommand adds its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import click

from shared.geo import Region
from shared.schema import is_positive_finite
from shared.spec import (
    EXPONENTIAL_GRID,
    GEOMETRIC,
    GRID_METRICS,
    HADAMARD_RESPONSE,
    KRR,
    MANHATTAN,
    OLH_NAME,
    OUE_NAME,
    PLANAR_LAPLACE,
    RR,
    CampaignSpec,
)
from simulate.runner import ALL_METHODS

CATEGORICAL = ("uniform", "zipf", "weights", "csv-column")
LOCATION = ("city", "csv-points")
DEFAULT_EPSILONS = {
    KRR: "0.5,1,2,4",
    RR: "0.5,1,2,4",
    PLANAR_LAPLACE: "0.005,0.01,0.02",
    GEOMETRIC: "0.1,0.25,0.5,1",
    EXPONENTIAL_GRID: "0.005,0.01,0.02",
    OLH_NAME: "0.5,1,2,4",
    OUE_NAME: "0.5,1,2,4",
    HADAMARD_RESPONSE: "0.5,1,2,4",
}
# Large-domain frequency oracles: the population's k categories are the integers 0 .. k - 1.
ORACLE_MECHANISMS = (OLH_NAME, OUE_NAME, HADAMARD_RESPONSE)
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


def parse_method(text: str) -> str:
    """One of the estimation methods (:data:`simulate.runner.ALL_METHODS`)."""
    method = text.strip()
    if method not in ALL_METHODS:
        raise click.BadParameter(f"{method!r}; choose among {', '.join(ALL_METHODS)}")
    return method


class Parsed(click.ParamType):
    """One value, converted by a ``parse_...`` function of this module."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        return value if not isinstance(value, str) else self.parse(value)


class CommaList(click.ParamType):
    """Comma-separated values (an option may also be repeated)."""

    name = "list"

    def __init__(self, item: Callable[[str], Any]) -> None:
        self.item = item

    def convert(self, value: Any, param: Any, ctx: Any) -> list:
        if isinstance(value, list):
            return value
        return [self.item(part) for part in str(value).split(",") if part.strip()]


def parse_region(text: str) -> Region:
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
    return CampaignSpec.from_dict(spec).grid.region


def option_group(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One decorator that applies ``decorators`` as if they were written above a function."""

    def apply(function: Any) -> Any:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def flatten(values: tuple[list, ...]) -> list:
    return [item for value in values for item in value]


version_option = click.version_option(package_name="ldp-collect", prog_name="ldp-simulate")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def repeats_option(default: int, help_text: str) -> Callable[[Any], Any]:
    return click.option(
        "--repeats", type=click.IntRange(1), default=default, show_default=True, help=help_text
    )


def ibu_iterations_option(default: int | None, help_text: str) -> Callable[[Any], Any]:
    return click.option(
        "--ibu-iterations",
        type=click.IntRange(1),
        default=default,
        show_default=default is not None,
        help=help_text,
    )


def plot_option(help_text: str) -> Callable[[Any], Any]:
    return click.option("--plot", "plot_dir", type=click.Path(file_okay=False), help=help_text)


population_options = option_group(
    click.option(
        "--population",
        "kind",
        type=click.Choice(CATEGORICAL + LOCATION),
        default="zipf",
        show_default=True,
        help="Where the users' true values come from.",
    ),
    click.option(
        "-k",
        "--k",
        type=click.IntRange(2),
        default=10,
        show_default=True,
        help="Categories (uniform, zipf).",
    ),
    click.option(
        "--zipf-s", type=click.FloatRange(0), default=1.1, show_default=True, help="Zipf exponent."
    ),
    click.option("--weights", help="Explicit weights, e.g. 0.5,0.3,0.2 (population weights)."),
    click.option("--labels", help="Category labels, comma-separated (default v0, v1, ...)."),
    click.option(
        "--csv",
        "csv_path",
        type=click.Path(dir_okay=False),
        help="CSV file (csv-column, csv-points).",
    ),
    click.option("--column", help="The CSV column of categories (csv-column)."),
    click.option(
        "--region",
        help="lat_min,lat_max,lon_min,lon_max (locations; csv-points default: the points' "
        "bounding box).",
    ),
    click.option(
        "--cell-size-m",
        type=click.FloatRange(1),
        default=100.0,
        show_default=True,
        help="Report grid cell size (locations).",
    ),
    click.option(
        "--hotspots",
        type=click.IntRange(1),
        default=8,
        show_default=True,
        help="Hotspots of the synthetic city.",
    ),
    click.option(
        "--mechanism",
        type=click.Choice(
            (KRR, RR, PLANAR_LAPLACE, GEOMETRIC, EXPONENTIAL_GRID, *ORACLE_MECHANISMS)
        ),
        help="Default: planar_laplace for locations, krr for categories. krr on a location "
        "population uses the grid cells as its domain; geometric takes the k categories as "
        "the integers --lo .. --lo + k - 1; exponential_grid takes a location population "
        "and --metric; olh, oue and hadamard_response take them as the "
        "integers 0 .. k - 1 (domain_size k; oue is simulated in process only, the service does "
        "not collect it).",
    ),
    click.option(
        "--metric",
        type=click.Choice(GRID_METRICS),
        default=None,
        help=f"exponential_grid: the distance its score is minus [default: {MANHATTAN}].",
    ),
    click.option(
        "--lo",
        type=int,
        default=0,
        show_default=True,
        help="geometric: the lowest value of the range (the population's first category).",
    ),
    click.option(
        "--spec",
        "spec_file",
        type=click.File("r", encoding="utf-8"),
        help="A campaign spec (JSON) to simulate; --epsilon overrides its epsilon.",
    ),
)

output_options = option_group(
    click.option(
        "-m",
        "--method",
        "methods",
        type=CommaList(parse_method),
        multiple=True,
        help=f"Methods, among {', '.join(ALL_METHODS)} [default: all].",
    ),
    click.option(
        "--seed",
        type=int,
        default=0,
        show_default=True,
        help="Seed of the population and the noise.",
    ),
    json_option,
    click.option(
        "--progress/--no-progress", default=None, help="Progress bars (default: on a terminal)."
    ),
)

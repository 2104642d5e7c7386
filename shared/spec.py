"""Campaign specs: parsing, validation, canonical form and hash.

A spec is parsed once, at the edge, into an immutable :class:`CampaignSpec`;
everything after that trusts it. The canonical form is JSON with sorted keys,
no white space and floats in their shortest round-trip form, leaving out
optional fields that hold their defaults; its SHA-256 is the spec hash, the
same on every machine, which clients pin.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from shared.errors import SpecError
from shared.exactness import check_planar_epsilon, krr_weights
from shared.geo import Grid, Region
from shared.periods import DEFAULT_PERIOD, PERIODS
from shared.schema import Array, Boolean, Descriptor, Number, Object, Shapes, String

RR = "rr"
KRR = "krr"
PLANAR_LAPLACE = "planar_laplace"
GEOMETRIC = "geometric"
EXPONENTIAL_GRID = "exponential_grid"
HADAMARD_RESPONSE = "hadamard_response"
OLH_NAME = "olh"
# Optimized unary encoding: simulated and compared, never collected (a report is k bits).
OUE_NAME = "oue"
MECHANISMS = (RR, KRR, PLANAR_LAPLACE, GEOMETRIC, EXPONENTIAL_GRID, HADAMARD_RESPONSE, OLH_NAME)
# The large-domain frequency oracles: a domain of labels or a domain size.
ORACLES = (HADAMARD_RESPONSE, OLH_NAME)
# The mechanisms whose values and reports are the cells of a report grid.
GRID_MECHANISMS = (PLANAR_LAPLACE, EXPONENTIAL_GRID)
# The categorical mechanisms that also take a region: their values are then its grid's cells.
CELL_MECHANISMS = (KRR, HADAMARD_RESPONSE, OLH_NAME)
# Every mechanism that takes a region and its grid.
REGION_MECHANISMS = (*GRID_MECHANISMS, *CELL_MECHANISMS)
MANHATTAN = "manhattan"
EUCLIDEAN = "euclidean"
GRID_METRICS = (MANHATTAN, EUCLIDEAN)

RR_DEFAULT_DOMAIN = ("no", "yes")
MIN_DOMAIN = 2
MAX_DOMAIN = 100_000
MAX_LABEL_LENGTH = 200
MAX_TITLE_LENGTH = 200
# Categorical epsilon above this gives no meaningful protection; below the minimum k-RR's
# integer weights are equal (shared.exactness.krr_weights).
MAX_EPSILON = 50.0
MIN_CATEGORICAL_EPSILON = 2.0**-63
MIN_CELL_SIZE_M = 1.0
# The planar projection is not supported nearer the poles.
MAX_LATITUDE = 85.0
# A region's projected distances may overstate great-circle ones by at most this factor (the
# client charges the factor; see Region.projection_distortion).
MAX_PROJECTION_DISTORTION = 1.1
MAX_CELLS = 512 * 512
# A geometric campaign's range holds at most this many integers, each bound within +-MAX_BOUND
# (integers that JSON readers hold exactly).
MAX_RANGE_VALUES = 100_000
MAX_BOUND = 10**12
# Per unit of the range: at this epsilon a report equals the true value with probability
# above 0.9999 (tanh(epsilon / 2)), so a larger one gives no meaningful protection.
MAX_GEOMETRIC_EPSILON = 10.0
# exponential_grid: epsilon * cell_size_m, the loss between neighbouring cells, within these.
# Above the maximum a report is the true cell with probability above 0.9998; below the minimum
# the noise spans hundreds of cells, and the aggregator's Euclidean kernel sums the lattice out
# to 46 / (epsilon * cell_size_m) cells (4,600 at the minimum).
MIN_GRID_STEP_EPSILON = 0.01
MAX_GRID_STEP_EPSILON = 10.0
# A frequency oracle's values given by number (the integers 0 .. K - 1): up to a million.
MAX_DOMAIN_SIZE = 1_000_000

# The fields of a spec, each described once: the parsing below checks values with these
# descriptors and the server's OpenAPI document is generated from them.
# Checked with fullmatch: "$" would also accept a trailing newline.
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
CAMPAIGN_ID = String(
    pattern=ID_PATTERN.pattern,
    pattern_text="1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit",
)
_TITLE = String(max_length=MAX_TITLE_LENGTH)
PERIOD = String(
    enum=PERIODS,
    description="how often a device may report: once in the campaign's life (the default), "
    "once per UTC day or once per ISO week (UTC); a device's repeats within a period re-send "
    "its report for the period, which the server counts once",
)
_ENROLLMENT_REQUIRED = Boolean(
    description="reports need a single-use enrollment token issued by the admin"
)
_CATEGORICAL_EPSILON = Number(
    minimum=MIN_CATEGORICAL_EPSILON,
    maximum=MAX_EPSILON,
    description="local-DP parameter; from 2**-63, below which the device's integer weights "
    "cannot tell the true value from another",
    minimum_text="2**-63 (about 1.08e-19): below it the device's integer weights cannot tell "
    "the true value from another",
)
_LABELS = Array(
    String(max_length=MAX_LABEL_LENGTH),
    min_items=MIN_DOMAIN,
    max_items=MAX_DOMAIN,
    unique_items=True,
    noun="labels",
)
_RR_LABELS = replace(
    _LABELS, min_items=2, max_items=2, description=f"default {list(RR_DEFAULT_DOMAIN)}"
)
_LATITUDE = Number(minimum=-MAX_LATITUDE, maximum=MAX_LATITUDE)
_LONGITUDE = Number(minimum=-180, maximum=180)
REGION = Object(
    {"lat_min": _LATITUDE, "lat_max": _LATITUDE, "lon_min": _LONGITUDE, "lon_max": _LONGITUDE},
    required=("lat_min", "lat_max", "lon_min", "lon_max"),
    description="degrees (WGS84); each minimum below its maximum, and small enough that the "
    f"planar projection overstates distances by at most {MAX_PROJECTION_DISTORTION}",
)
_PLANAR_EPSILON = Number(
    minimum=0,
    exclusive_minimum=True,
    description="per metre; or give privacy_level with privacy_radius_m (epsilon = level / "
    "radius); bounded by the grid's extent and cell size",
)
_GRID_EPSILON = Number(
    minimum=0,
    exclusive_minimum=True,
    description="per metre of the metric's distance between cell centres; epsilon * "
    f"cell_size_m (the loss between side neighbours) from {MIN_GRID_STEP_EPSILON} to "
    f"{MAX_GRID_STEP_EPSILON}",
)
_METRIC = String(
    enum=GRID_METRICS,
    description=f"the distance the score is minus: default {MANHATTAN}",
)
_CELL_SIZE = Number(
    minimum=MIN_CELL_SIZE_M,
    description=f"metres; at most {MAX_CELLS:,} cells in the region ({MAX_DOMAIN:,} for krr), "
    "and at least 2 for krr, olh and hadamard_response",
)
# A region and its report grid: the fields of every campaign over locations, described once.
REGION_GRID: dict[str, Descriptor] = {"region": REGION, "cell_size_m": _CELL_SIZE}
_PRIVACY_LEVEL = Number(minimum=0, exclusive_minimum=True, description="with privacy_radius_m")
_PRIVACY_RADIUS = Number(minimum=0, exclusive_minimum=True, description="with privacy_level")
_GEOMETRIC_EPSILON = Number(
    minimum=0,
    exclusive_minimum=True,
    maximum=MAX_GEOMETRIC_EPSILON,
    description="per unit of the range: values u apart are told apart by at most a factor "
    "e^(epsilon u)",
)
_BOUND = Number(
    integer=True,
    minimum=-MAX_BOUND,
    maximum=MAX_BOUND,
    description=f"lo < hi, at most {MAX_RANGE_VALUES:,} values from lo to hi inclusive",
)
_DOMAIN_SIZE = Number(
    integer=True,
    minimum=MIN_DOMAIN,
    maximum=MAX_DOMAIN_SIZE,
    description="K: the values are the integers 0 .. K - 1 (instead of a domain of labels)",
)
_ORACLE_LABELS = replace(_LABELS, description="or give domain_size")
MECHANISM = String(enum=MECHANISMS)
_COMMON: dict[str, Descriptor] = {
    "id": CAMPAIGN_ID,
    "title": _TITLE,
    "enrollment_required": _ENROLLMENT_REQUIRED,
    "period": PERIOD,
}
_REQUIRED = ("id", "title", "mechanism")


def _spec(
    mechanism: str, fields: dict[str, Descriptor], required: tuple[str, ...], description: str
) -> Object:
    """One shape of a mechanism's spec: the common fields, the mechanism's name, ``fields``."""
    return Object(
        {**_COMMON, "mechanism": String(enum=(mechanism,)), **fields},
        required=(*_REQUIRED, *required),
        description=description,
    )


def _cells(mechanism: str, name: str) -> Object:
    """A categorical mechanism's spec over a region's cells."""
    return _spec(
        mechanism,
        {"epsilon": _CATEGORICAL_EPSILON, **REGION_GRID},
        ("epsilon", *REGION_GRID),
        f"{name} over a region's cells: a device reports its location, snapped to its cell; "
        "epsilon bounds the ratio between any two cells, near or far",
    )


def _oracle(mechanism: str, name: str) -> Shapes:
    return Shapes(
        (
            _spec(
                mechanism,
                {"epsilon": _CATEGORICAL_EPSILON, "domain": _ORACLE_LABELS},
                ("epsilon", "domain"),
                f"{name} over labels",
            ),
            _spec(
                mechanism,
                {"epsilon": _CATEGORICAL_EPSILON, "domain_size": _DOMAIN_SIZE},
                ("epsilon", "domain_size"),
                f"{name} over the integers 0 .. domain_size - 1",
            ),
            _cells(mechanism, name),
        ),
        description=f"{name} over a large domain: labels (domain), the integers "
        "0 .. domain_size - 1, or a region's cells (region with cell_size_m)",
    )


# Each mechanism's spec: an object, or one of a few shapes (a domain of labels, a domain size,
# a region and its grid). The server's OpenAPI document is generated from these.
SPEC_SCHEMAS: dict[str, Object | Shapes] = {
    RR: _spec(
        RR,
        {"epsilon": _CATEGORICAL_EPSILON, "domain": _RR_LABELS},
        ("epsilon",),
        "Binary randomized response",
    ),
    KRR: Shapes(
        (
            _spec(
                KRR,
                {"epsilon": _CATEGORICAL_EPSILON, "domain": _LABELS},
                ("epsilon", "domain"),
                "k-ary randomized response over labels",
            ),
            _cells(KRR, "k-ary randomized response"),
        ),
        description="k-ary randomized response over labels (domain) or a region's cells "
        "(region with cell_size_m)",
    ),
    PLANAR_LAPLACE: Shapes(
        (
            _spec(
                PLANAR_LAPLACE,
                {"epsilon": _PLANAR_EPSILON, **REGION_GRID},
                ("epsilon", *REGION_GRID),
                "Planar Laplace with epsilon per metre",
            ),
            _spec(
                PLANAR_LAPLACE,
                {
                    **REGION_GRID,
                    "privacy_level": _PRIVACY_LEVEL,
                    "privacy_radius_m": _PRIVACY_RADIUS,
                },
                (*REGION_GRID, "privacy_level", "privacy_radius_m"),
                "Planar Laplace with privacy_level within privacy_radius_m",
            ),
        ),
        description="Planar Laplace over a grid of cells (geo-indistinguishability)",
    ),
    EXPONENTIAL_GRID: _spec(
        EXPONENTIAL_GRID,
        {"epsilon": _GRID_EPSILON, **REGION_GRID, "metric": _METRIC},
        ("epsilon", *REGION_GRID),
        "The exponential mechanism over a grid's cells, score minus the Manhattan "
        "or Euclidean distance, clamped into the grid",
    ),
    GEOMETRIC: _spec(
        GEOMETRIC,
        {"epsilon": _GEOMETRIC_EPSILON, "lo": _BOUND, "hi": _BOUND},
        ("epsilon", "lo", "hi"),
        "The geometric mechanism (discrete Laplace) on the integers lo..hi, clamped at the ends",
    ),
    HADAMARD_RESPONSE: _oracle(HADAMARD_RESPONSE, "Hadamard response"),
    OLH_NAME: _oracle(OLH_NAME, "Optimized local hashing"),
}

# A campaign created without a mechanism: the server ranks the mechanisms it hosts for the
# domain given (labels, a range or a region) at the expected number of users and takes the best
# (aggregator.estimation.advice). The request is not a spec: it is turned into one.
DEFAULT_EXPECTED_USERS = 10_000
MAX_EXPECTED_USERS = 10**12
EXPECTED_USERS = Number(
    integer=True,
    minimum=1,
    maximum=MAX_EXPECTED_USERS,
    description=f"users the campaign is planned for (default {DEFAULT_EXPECTED_USERS:,}); "
    "only when the server chooses the mechanism",
)
_ADVISED: dict[str, Descriptor] = {**_COMMON, "expected_users": EXPECTED_USERS}
ADVISED_SCHEMA = Shapes(
    (
        Object(
            {**_ADVISED, "epsilon": _CATEGORICAL_EPSILON, "domain": _LABELS},
            required=("id", "title", "epsilon", "domain"),
            description="labels (domain), epsilon local-DP",
        ),
        Object(
            {
                **_ADVISED,
                "epsilon": replace(
                    _CATEGORICAL_EPSILON,
                    minimum=0,
                    exclusive_minimum=True,
                    description="per unit of the range; the mechanisms over labels run at it too",
                    minimum_text="",
                ),
                "lo": _BOUND,
                "hi": _BOUND,
            },
            required=("id", "title", "epsilon", "lo", "hi"),
            description="an integer range (lo and hi), epsilon per unit",
        ),
        Object(
            {**_ADVISED, "epsilon": _PLANAR_EPSILON, **REGION_GRID},
            required=("id", "title", "epsilon", *REGION_GRID),
            description="a region (region with cell_size_m), epsilon per metre",
        ),
        Object(
            {
                **_ADVISED,
                **REGION_GRID,
                "privacy_level": _PRIVACY_LEVEL,
                "privacy_radius_m": _PRIVACY_RADIUS,
            },
            required=("id", "title", *REGION_GRID, "privacy_level", "privacy_radius_m"),
            description="a region (region with cell_size_m), privacy_level within privacy_radius_m",
        ),
    ),
    description="A campaign without a mechanism: give one domain (domain labels, lo and hi, or "
    "region with cell_size_m); the server picks the mechanism with the lowest expected error "
    "among those it hosts and says why in the response's advice",
)

# Fields the server adds when it serves a spec; not part of the hashed spec.
SERVER_FIELDS = frozenset({"status", "spec_hash", "created_at"})
_SPEC_FIELDS = frozenset(name for schema in SPEC_SCHEMAS.values() for name in schema.properties)
_REGION_FIELDS = tuple(REGION_GRID)
_PRIVACY_FIELDS = ("privacy_level", "privacy_radius_m")
_RANGE_FIELDS = ("lo", "hi")
# Values over a region's cells, by mechanism: k-RR's labels, the oracles' domain size.
_MAX_VALUES = {KRR: MAX_DOMAIN, HADAMARD_RESPONSE: MAX_DOMAIN_SIZE, OLH_NAME: MAX_DOMAIN_SIZE}


def _categorical_epsilon(data: dict[str, Any], mechanism: str) -> float:
    """The epsilon of a spec over values without distances, which takes no planar fields."""
    for field in _PRIVACY_FIELDS:
        if field in data:
            raise SpecError(
                f"{field} applies only to planar_laplace, whose epsilon is per metre: "
                f"{mechanism}'s epsilon bounds the ratio between every two values, cells near "
                "or far alike, so no radius changes it; give epsilon",
                field=field,
            )
    if mechanism not in REGION_MECHANISMS:
        for field in _REGION_FIELDS:
            if field in data:
                raise SpecError(
                    f"{field} applies only to {', '.join(REGION_MECHANISMS[:-1])} and "
                    f"{REGION_MECHANISMS[-1]}",
                    field=field,
                )
    if "epsilon" not in data:
        raise SpecError("epsilon is required", field="epsilon")
    return float(_CATEGORICAL_EPSILON.check(data["epsilon"], "epsilon", SpecError))


def check_krr_epsilon(epsilon: float, k: int) -> None:
    """:class:`SpecError` (field ``epsilon``) unless k-RR's integer weights exist for it."""
    try:
        krr_weights(epsilon, k)
    except ValueError as exc:
        raise SpecError(str(exc), field="epsilon") from None


def grid_step_accepted(epsilon: float, cell_size_m: float) -> bool:
    """Whether ``exponential_grid`` takes ``epsilon`` per metre over cells of this size."""
    return MIN_GRID_STEP_EPSILON <= epsilon * cell_size_m <= MAX_GRID_STEP_EPSILON


def check_range(lo: int, hi: int) -> None:
    """:class:`SpecError` unless ``lo .. hi`` is a range a campaign can take."""
    if not lo < hi:
        raise SpecError(f"lo must be below hi, got lo={lo}, hi={hi}", field="lo")
    if hi - lo + 1 > MAX_RANGE_VALUES:
        raise SpecError(
            f"the range [{lo}, {hi}] holds {hi - lo + 1:,} values; at most "
            f"{MAX_RANGE_VALUES:,} are allowed",
            field="hi",
        )


@dataclass(frozen=True)
class CampaignSpec:
    """The immutable description of a collection campaign.

    ``epsilon`` is the local-DP parameter for ``rr`` and ``krr``, the
    geo-indistinguishability parameter, per metre, for ``planar_laplace`` and
    ``exponential_grid`` (per metre of its ``metric``), and per unit of the
    range ``[lo, hi]`` for ``geometric``.
    """

    id: str
    title: str
    mechanism: str
    epsilon: float
    domain: tuple[str, ...] | None = None
    region: Region | None = None
    cell_size_m: float | None = None
    privacy_level: float | None = None
    privacy_radius_m: float | None = None
    lo: int | None = None
    hi: int | None = None
    metric: str | None = None
    domain_size: int | None = None
    enrollment_required: bool = False
    period: str = DEFAULT_PERIOD

    @classmethod
    def from_dict(cls, data: Any, *, stored: bool = False) -> CampaignSpec:
        """Parse and validate a spec; raise :class:`SpecError` naming the field.

        ``stored=True`` reads a spec the server accepted earlier: the limits that
        only bind new campaigns (a region's projection distortion, whose cost the
        client charges anyway) are not applied, so a campaign created before such
        a limit existed stays readable with all its reports.
        """
        if not isinstance(data, dict):
            raise SpecError("a campaign spec must be a JSON object", field=None)
        unknown = sorted(set(data) - _SPEC_FIELDS)
        if unknown:
            raise SpecError(f"unknown field {unknown[0]!r}", field=unknown[0])
        for required in ("id", "title", "mechanism"):
            if required not in data:
                raise SpecError(f"{required} is required", field=required)
        campaign_id = CAMPAIGN_ID.check(data["id"], "id", SpecError)
        if data["mechanism"] == OUE_NAME:
            raise SpecError(
                "oue is not collected by this service: its report is one bit per value of the "
                "domain; use olh, which has the same variance and sends one integer per report",
                field="mechanism",
            )
        mechanism = MECHANISM.check(data["mechanism"], "mechanism", SpecError)
        title = _TITLE.check(data["title"], "title", SpecError)
        enrollment = _ENROLLMENT_REQUIRED.check(
            data.get("enrollment_required", False), "enrollment_required", SpecError
        )
        period = PERIOD.check(data.get("period", DEFAULT_PERIOD), "period", SpecError)
        common = {
            "id": campaign_id,
            "title": title,
            "enrollment_required": enrollment,
            "period": period,
        }
        if mechanism != GEOMETRIC:
            for field in _RANGE_FIELDS:
                if field in data:
                    raise SpecError(f"{field} applies only to geometric", field=field)
        if mechanism != EXPONENTIAL_GRID and "metric" in data:
            raise SpecError("metric applies only to exponential_grid", field="metric")
        if mechanism not in ORACLES and "domain_size" in data:
            raise SpecError(
                f"domain_size applies only to {' and '.join(ORACLES)}", field="domain_size"
            )
        if mechanism in ORACLES:
            return cls._oracle_from_dict(data, mechanism, common, stored=stored)
        if mechanism in GRID_MECHANISMS:
            return cls._planar_from_dict(data, mechanism, common, stored=stored)
        if mechanism == GEOMETRIC:
            return cls._geometric_from_dict(data, common)
        return cls._categorical_from_dict(data, mechanism, common, stored=stored)

    @classmethod
    def _geometric_from_dict(cls, data: dict[str, Any], common: dict[str, Any]) -> CampaignSpec:
        for field in ("domain", *_REGION_FIELDS, *_PRIVACY_FIELDS):
            if field in data:
                raise SpecError(f"geometric takes lo and hi, not {field}", field=field)
        for required in ("epsilon", *_RANGE_FIELDS):
            if required not in data:
                raise SpecError(f"{required} is required for geometric", field=required)
        epsilon = _GEOMETRIC_EPSILON.check(data["epsilon"], "epsilon", SpecError)
        lo = int(_BOUND.check(data["lo"], "lo", SpecError))
        hi = int(_BOUND.check(data["hi"], "hi", SpecError))
        check_range(lo, hi)
        return cls(mechanism=GEOMETRIC, epsilon=epsilon, lo=lo, hi=hi, **common)

    @classmethod
    def _oracle_from_dict(
        cls, data: dict[str, Any], mechanism: str, common: dict[str, Any], *, stored: bool
    ) -> CampaignSpec:
        epsilon = _categorical_epsilon(data, mechanism)
        forms = [name for name in ("domain", "domain_size", "region") if name in data]
        if len(forms) != 1 and not (forms == [] and "cell_size_m" in data):
            raise SpecError(
                f"{mechanism} takes domain (at most {MAX_DOMAIN:,} labels), domain_size (the "
                f"integers 0 .. K - 1, K at most {MAX_DOMAIN_SIZE:,}) or region with cell_size_m "
                "(its grid's cells), exactly one of them"
                + (f"; got {' and '.join(forms)}" if forms else ""),
                field="region" if "region" in forms else "domain",
            )
        check_krr_epsilon(epsilon, 2)
        if "domain" in data or "domain_size" in data:
            cls._no_grid(data, mechanism, forms[0])
        if "domain" in data:
            domain = tuple(_ORACLE_LABELS.check(data["domain"], "domain", SpecError))
            return cls(mechanism=mechanism, epsilon=epsilon, domain=domain, **common)
        if "domain_size" in data:
            size = int(_DOMAIN_SIZE.check(data["domain_size"], "domain_size", SpecError))
            return cls(mechanism=mechanism, epsilon=epsilon, domain_size=size, **common)
        return cls._over_cells(data, mechanism, epsilon, common, stored=stored)

    @classmethod
    def _categorical_from_dict(
        cls, data: dict[str, Any], mechanism: str, common: dict[str, Any], *, stored: bool
    ) -> CampaignSpec:
        epsilon = _categorical_epsilon(data, mechanism)
        if "domain" in data:
            if mechanism == KRR:
                cls._no_grid(data, mechanism, "domain")
            labels = _RR_LABELS if mechanism == RR else _LABELS
            domain = tuple(labels.check(data["domain"], "domain", SpecError))
        elif mechanism == RR:
            domain = RR_DEFAULT_DOMAIN
        elif "region" in data or "cell_size_m" in data:
            return cls._over_cells(data, mechanism, epsilon, common, stored=stored)
        else:
            raise SpecError(
                "krr takes domain (its labels) or region with cell_size_m (its grid's cells)",
                field="domain",
            )
        check_krr_epsilon(epsilon, len(domain))
        return cls(mechanism=mechanism, epsilon=epsilon, domain=domain, **common)

    @staticmethod
    def _no_grid(data: dict[str, Any], mechanism: str, form: str) -> None:
        """:class:`SpecError` if a spec over ``form`` (domain, domain_size) has grid fields."""
        for field in _REGION_FIELDS:
            if field in data:
                raise SpecError(
                    f"{mechanism} takes {form} or region with cell_size_m, not both: over a "
                    "region the values are its grid's cells",
                    field=field,
                )

    @classmethod
    def _over_cells(
        cls,
        data: dict[str, Any],
        mechanism: str,
        epsilon: float,
        common: dict[str, Any],
        *,
        stored: bool,
    ) -> CampaignSpec:
        """A categorical mechanism's spec over a region's cells."""
        grid = cls.parse_grid(
            data, mechanism, max_cells=min(MAX_CELLS, _MAX_VALUES[mechanism]), stored=stored
        )
        if grid.n_cells < MIN_DOMAIN:
            raise SpecError(
                f"the grid would have {grid.rows} x {grid.cols} cell; {mechanism} needs at least "
                f"{MIN_DOMAIN}: use smaller cells or a larger region",
                field="cell_size_m",
            )
        check_krr_epsilon(epsilon, grid.n_cells if mechanism == KRR else 2)
        return cls(
            mechanism=mechanism,
            epsilon=epsilon,
            region=grid.region,
            cell_size_m=grid.cell_size_m,
            **common,
        )

    @classmethod
    def parse_grid(
        cls, data: dict[str, Any], mechanism: str, *, max_cells: int, stored: bool
    ) -> Grid:
        """The region and its grid of a spec (:data:`REGION_GRID`), whatever the mechanism."""
        region = cls._parse_region(data.get("region"), mechanism, bound_distortion=not stored)
        if "cell_size_m" not in data:
            raise SpecError(f"cell_size_m is required for {mechanism}", field="cell_size_m")
        cell = _CELL_SIZE.check(data["cell_size_m"], "cell_size_m", SpecError)
        grid = Grid(region, cell)
        if grid.n_cells > max_cells:
            raise SpecError(
                f"the grid would have {grid.rows} x {grid.cols} cells; at most {max_cells:,} are "
                f"allowed{f' for {mechanism}' if max_cells < MAX_CELLS else ''}: use larger "
                "cells or a smaller region",
                field="cell_size_m",
            )
        return grid

    @classmethod
    def _planar_from_dict(
        cls, data: dict[str, Any], mechanism: str, common: dict[str, Any], *, stored: bool
    ) -> CampaignSpec:
        if "domain" in data:
            raise SpecError(f"{mechanism} takes a region, not a domain", field="domain")
        grid = cls.parse_grid(data, mechanism, max_cells=MAX_CELLS, stored=stored)
        region, cell = grid.region, grid.cell_size_m
        level: float | None = None
        radius: float | None = None
        if mechanism == EXPONENTIAL_GRID:
            for field in ("privacy_level", "privacy_radius_m"):
                if field in data:
                    raise SpecError(
                        f"{field} applies only to planar_laplace; exponential_grid takes epsilon",
                        field=field,
                    )
        if "privacy_level" in data or "privacy_radius_m" in data:
            if "privacy_level" not in data or "privacy_radius_m" not in data:
                field = "privacy_radius_m" if "privacy_level" in data else "privacy_level"
                raise SpecError("privacy_level and privacy_radius_m go together", field=field)
            level = _PRIVACY_LEVEL.check(data["privacy_level"], "privacy_level", SpecError)
            radius = _PRIVACY_RADIUS.check(data["privacy_radius_m"], "privacy_radius_m", SpecError)
        if "epsilon" in data:
            described = _PLANAR_EPSILON if mechanism == PLANAR_LAPLACE else _GRID_EPSILON
            epsilon = described.check(data["epsilon"], "epsilon", SpecError)
            if (
                level is not None
                and radius is not None
                and not math.isclose(epsilon, level / radius, rel_tol=1e-12)
            ):
                raise SpecError(
                    f"epsilon {epsilon!r} disagrees with privacy_level / privacy_radius_m "
                    f"= {level / radius!r}",
                    field="epsilon",
                )
        elif level is not None and radius is not None:
            epsilon = level / radius
        else:
            raise SpecError(
                "give epsilon (per metre) or privacy_level with privacy_radius_m", field="epsilon"
            )
        field = "epsilon" if "epsilon" in data else "privacy_level"
        metric: str | None = None
        if mechanism == EXPONENTIAL_GRID:
            metric = _METRIC.check(data.get("metric", MANHATTAN), "metric", SpecError)
            if not grid_step_accepted(epsilon, cell):
                raise SpecError(
                    f"epsilon {epsilon!r} per metre times the {cell:g} m cells is "
                    f"{epsilon * cell:.6g}; "
                    f"exponential_grid takes {MIN_GRID_STEP_EPSILON} to {MAX_GRID_STEP_EPSILON} "
                    "(the loss between neighbouring cells)",
                    field=field,
                )
        else:
            try:
                check_planar_epsilon(epsilon, grid)
            except ValueError as exc:
                raise SpecError(str(exc), field=field) from None
        return cls(
            mechanism=mechanism,
            epsilon=epsilon,
            region=region,
            cell_size_m=cell,
            privacy_level=level,
            privacy_radius_m=radius,
            metric=metric,
            **common,
        )

    @staticmethod
    def _parse_region(raw: Any, mechanism: str, *, bound_distortion: bool = True) -> Region:
        if raw is None:
            raise SpecError(f"region is required for {mechanism}", field="region")
        values = REGION.check(raw, "region", SpecError)
        for axis in ("lat", "lon"):
            if not values[f"{axis}_min"] < values[f"{axis}_max"]:
                raise SpecError(
                    f"region.{axis}_min must be below {axis}_max", field=f"region.{axis}_min"
                )
        region = Region(**values)
        distortion = region.projection_distortion()
        if bound_distortion and distortion > MAX_PROJECTION_DISTORTION:
            raise SpecError(
                f"the region is too large for one planar projection: its distances would "
                f"overstate ground distances by up to a factor {distortion:.5g}, and at most "
                f"{MAX_PROJECTION_DISTORTION} is allowed; use a smaller region (the allowed "
                "extent shrinks towards the poles)",
                field="region",
            )
        return region

    @classmethod
    def from_wire(cls, data: Any) -> tuple[CampaignSpec, dict[str, Any]]:
        """Parse a spec as a server serves it: the spec plus server fields (status, hash)."""
        if not isinstance(data, dict):
            raise SpecError("a campaign spec must be a JSON object", field=None)
        meta = {key: data[key] for key in SERVER_FIELDS if key in data}
        spec = cls.from_dict({key: v for key, v in data.items() if key not in SERVER_FIELDS})
        return spec, meta

    def to_dict(self) -> dict[str, Any]:
        """The canonical dict: only fields that apply, optional ones only when set."""
        out: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
        }
        if self.domain is not None:
            out["domain"] = list(self.domain)
        if self.region is not None:
            out["region"] = self.region.to_dict()
            out["cell_size_m"] = self.cell_size_m
        if self.metric is not None and self.metric != MANHATTAN:
            out["metric"] = self.metric  # the default, manhattan, is left out
        if self.privacy_level is not None:
            out["privacy_level"] = self.privacy_level
            out["privacy_radius_m"] = self.privacy_radius_m
        if self.lo is not None:
            out["lo"] = self.lo
            out["hi"] = self.hi
        if self.domain_size is not None:
            out["domain_size"] = self.domain_size
        if self.enrollment_required:
            out["enrollment_required"] = True
        if self.period != DEFAULT_PERIOD:
            # The default is left out, so specs from before periods keep their hash.
            out["period"] = self.period
        return out

    def canonical_json(self) -> bytes:
        return json.dumps(
            self.to_dict(),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")

    @cached_property
    def spec_hash(self) -> str:
        """Hex SHA-256 of the canonical JSON."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    @cached_property
    def grid(self) -> Grid:
        if self.region is None or self.cell_size_m is None:
            raise AttributeError(f"campaign {self.id!r} has no grid ({self.mechanism})")
        return Grid(self.region, self.cell_size_m)

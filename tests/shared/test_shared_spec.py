"""Campaign specs: every validation rule, the canonical form and the pinned hash."""

from __future__ import annotations

import copy
import hashlib
import json
import math

import pytest

from shared.errors import SpecError, ValidationError
from shared.geo import EARTH_RADIUS_M
from shared.schema import Shapes
from shared.spec import (
    ADVISED_SCHEMA,
    KRR,
    MAX_CELLS,
    MAX_DOMAIN,
    MAX_EPSILON,
    MAX_PROJECTION_DISTORTION,
    PLANAR_LAPLACE,
    RR,
    RR_DEFAULT_DOMAIN,
    SERVER_FIELDS,
    SPEC_SCHEMAS,
    CampaignSpec,
)

KRR_SPEC = {
    "id": "fruit",
    "title": "Favourite fruit",
    "mechanism": "krr",
    "epsilon": 1.5,
    "domain": ["apple", "banana", "cherry"],
}
PLANAR_SPEC = {
    "id": "where",
    "title": "Where",
    "mechanism": "planar_laplace",
    "privacy_level": 2,
    "privacy_radius_m": 200,
    "region": {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41},
    "cell_size_m": 200,
}
# Computed once from KRR_SPEC; a change here means every pinned client breaks.
KRR_CANONICAL = (
    b'{"domain":["apple","banana","cherry"],"epsilon":1.5,"id":"fruit",'
    b'"mechanism":"krr","title":"Favourite fruit"}'
)
KRR_HASH = "0f59bbafe3fd332d4f2c20bd7df951405917169564136232d6ac9f7db012c553"
PLANAR_HASH = "a0b8770d0d537f3bb25b165e173ea463532da4ddfb504e0627b62afed98967d5"


def with_changes(base: dict, **changes) -> dict:
    """A deep copy of ``base`` with keys replaced; a value of ``...`` removes the key."""
    data = copy.deepcopy(base)
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def with_region(**changes) -> dict:
    data = copy.deepcopy(PLANAR_SPEC)
    for key, value in changes.items():
        if value is ...:
            del data["region"][key]
        else:
            data["region"][key] = value
    return data


def rejected(data, field: str | None) -> SpecError:
    with pytest.raises(SpecError) as info:
        CampaignSpec.from_dict(data)
    assert info.value.field == field, info.value.message
    body = info.value.to_dict()
    assert set(body) == {"code", "message", "field"}
    assert body["code"] == "invalid_spec"
    assert body["message"]
    return info.value


# -- accepted specs ------------------------------------------------------------------------


def test_krr_spec_parses_into_typed_immutable_object():
    spec = CampaignSpec.from_dict(KRR_SPEC)
    assert spec.mechanism == KRR
    assert spec.epsilon == 1.5
    assert spec.domain == ("apple", "banana", "cherry")
    assert spec.region is None and spec.cell_size_m is None
    with pytest.raises(AttributeError):
        spec.epsilon = 3.0  # frozen dataclass
    with pytest.raises(AttributeError):
        _ = spec.grid  # a categorical campaign has no grid


def test_rr_defaults_to_no_yes_and_takes_two_labels():
    spec = CampaignSpec.from_dict({"id": "q", "title": "Q", "mechanism": RR, "epsilon": 1})
    assert spec.domain == RR_DEFAULT_DOMAIN == ("no", "yes")
    given = CampaignSpec.from_dict(
        {"id": "q", "title": "Q", "mechanism": RR, "epsilon": 1, "domain": ["a", "b"]}
    )
    assert given.domain == ("a", "b")
    rejected(
        {"id": "q", "title": "Q", "mechanism": RR, "epsilon": 1, "domain": ["a", "b", "c"]},
        "domain",
    )


def test_planar_spec_from_level_and_radius():
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    assert spec.mechanism == PLANAR_LAPLACE
    assert spec.epsilon == pytest.approx(2 / 200, rel=1e-15)
    assert (spec.privacy_level, spec.privacy_radius_m) == (2.0, 200.0)
    assert spec.grid.cell_size_m == 200.0
    # Consistent epsilon given alongside level/radius is accepted.
    both = CampaignSpec.from_dict(with_changes(PLANAR_SPEC, epsilon=0.01))
    assert both == spec
    plain = CampaignSpec.from_dict(
        with_changes(PLANAR_SPEC, privacy_level=..., privacy_radius_m=..., epsilon=0.02)
    )
    assert plain.epsilon == 0.02 and plain.privacy_level is None


def test_domain_size_limits_are_inclusive():
    for size in (2, MAX_DOMAIN):
        labels = [f"l{i}" for i in range(size)]
        assert len(CampaignSpec.from_dict(with_changes(KRR_SPEC, domain=labels)).domain) == size


def test_epsilon_cap_is_inclusive_and_int_is_accepted():
    assert (
        CampaignSpec.from_dict(with_changes(KRR_SPEC, epsilon=MAX_EPSILON)).epsilon == MAX_EPSILON
    )
    spec = CampaignSpec.from_dict(with_changes(KRR_SPEC, epsilon=2))
    assert spec.epsilon == 2.0 and isinstance(spec.epsilon, float)


# -- rejected specs ------------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, [], "spec", 3, [KRR_SPEC]])
def test_non_object_is_rejected(data):
    rejected(data, None)


def test_errors_are_validation_errors():
    error = rejected(with_changes(KRR_SPEC, epsilon=-1), "epsilon")
    assert isinstance(error, ValidationError) and isinstance(error, ValueError)


@pytest.mark.parametrize("key", ["extra", "spec_hash_typo", "Epsilon", "status"])
def test_unknown_keys_are_rejected(key):
    # "status" is a server field: from_dict (the admin's input) refuses it; from_wire strips it.
    rejected(with_changes(KRR_SPEC, **{key: 1}), key)


@pytest.mark.parametrize("missing", ["id", "title", "mechanism"])
def test_required_fields(missing):
    rejected(with_changes(KRR_SPEC, **{missing: ...}), missing)


@pytest.mark.parametrize(
    "campaign_id",
    ["", "-lead", "_lead", "Upper", "sp ace", "a" * 65, "dot.ted", "é", "x\n", 5, None, True],
)
def test_bad_ids(campaign_id):
    rejected(with_changes(KRR_SPEC, id=campaign_id), "id")


def test_good_ids():
    for campaign_id in ("a", "0", "a" * 64, "a-b_c9"):
        assert CampaignSpec.from_dict(with_changes(KRR_SPEC, id=campaign_id)).id == campaign_id


@pytest.mark.parametrize("title", ["", "t" * 201, 3, None, ["t"]])
def test_bad_titles(title):
    rejected(with_changes(KRR_SPEC, title=title), "title")


@pytest.mark.parametrize("mechanism", ["laplace", "KRR", "", None, 1, ["krr"]])
def test_bad_mechanisms(mechanism):
    rejected(with_changes(KRR_SPEC, mechanism=mechanism), "mechanism")


@pytest.mark.parametrize("value", [1, "true", None])
def test_enrollment_required_must_be_boolean(value):
    rejected(with_changes(KRR_SPEC, enrollment_required=value), "enrollment_required")


@pytest.mark.parametrize("base", [KRR_SPEC, PLANAR_SPEC], ids=["krr", "planar"])
@pytest.mark.parametrize("period", ["once", "day", "week"])
def test_every_mechanism_takes_a_reporting_period(base, period):
    spec = CampaignSpec.from_dict(with_changes(base, period=period))
    assert spec.period == period
    assert CampaignSpec.from_dict(spec.to_dict()) == spec


def test_the_period_defaults_to_once_and_leaves_the_hash_alone():
    """Specs from before periods mean ``once`` and keep the hash their clients pinned."""
    spec = CampaignSpec.from_dict(KRR_SPEC)
    assert spec.period == "once"
    explicit = CampaignSpec.from_dict(with_changes(KRR_SPEC, period="once"))
    assert explicit == spec and explicit.canonical_json() == KRR_CANONICAL
    assert explicit.spec_hash == KRR_HASH
    weekly = CampaignSpec.from_dict(with_changes(KRR_SPEC, period="week"))
    assert b'"period":"week"' in weekly.canonical_json() and weekly.spec_hash != KRR_HASH
    daily = CampaignSpec.from_dict(with_changes(KRR_SPEC, period="day"))
    assert len({spec.spec_hash, daily.spec_hash, weekly.spec_hash}) == 3


@pytest.mark.parametrize("value", ["month", "Day", "daily", "", None, 1, True, ["day"]])
def test_an_unknown_period_is_refused(value):
    with pytest.raises(SpecError, match="period must be one of once, day, week") as info:
        CampaignSpec.from_dict(with_changes(KRR_SPEC, period=value))
    assert info.value.field == "period"


def test_the_period_is_described_for_every_mechanism_and_for_an_advised_campaign():
    for schema in (*SPEC_SCHEMAS.values(), ADVISED_SCHEMA):
        for shape in schema.choices if isinstance(schema, Shapes) else (schema,):
            described = shape.schema()["properties"]["period"]
            assert described["enum"] == ["once", "day", "week"]
            assert "once" in described["description"]
    with pytest.raises(SpecError, match="period"):
        ADVISED_SCHEMA.check({"id": "x", "title": "t", "period": "month"}, None, SpecError)


BAD_EPSILONS = [
    True,
    False,
    "1.0",
    None,
    [1],
    {"value": 1},
    float("nan"),
    float("inf"),
    float("-inf"),
    json.loads("1e400"),  # JSON's overflow parses to inf
    10**400,  # an int too large for a float
    0,
    0.0,
    -0.0,
    -1,
    -1e-300,
    MAX_EPSILON * (1 + 1e-15),
    1e6,
]


@pytest.mark.parametrize("epsilon", BAD_EPSILONS, ids=repr)
def test_bad_categorical_epsilon(epsilon):
    rejected(with_changes(KRR_SPEC, epsilon=epsilon), "epsilon")


@pytest.mark.parametrize("epsilon", BAD_EPSILONS[:-2], ids=repr)
def test_bad_planar_epsilon(epsilon):
    data = with_changes(PLANAR_SPEC, privacy_level=..., privacy_radius_m=..., epsilon=epsilon)
    rejected(data, "epsilon")


def test_categorical_epsilon_below_what_the_integer_weights_resolve_is_refused():
    # 2**-63 is the smallest epsilon whose keep weight exceeds the unit 2**64.
    assert CampaignSpec.from_dict(with_changes(KRR_SPEC, epsilon=2.0**-63)).epsilon == 2.0**-63
    for epsilon in (math.nextafter(2.0**-63, 0), 1e-30, 1e-308, 5e-324):
        error = rejected(with_changes(KRR_SPEC, epsilon=epsilon), "epsilon")
        assert "2**-63" in error.message
        rejected({"id": "r", "title": "r", "mechanism": "rr", "epsilon": epsilon}, "epsilon")


def planar_with_epsilon(epsilon: float, **changes) -> dict:
    data = with_changes(PLANAR_SPEC, privacy_level=..., privacy_radius_m=..., epsilon=epsilon)
    return with_changes(data, **changes)


def test_planar_epsilon_below_the_samplers_resolution_is_refused():
    # 128 m cells: the limit epsilon * cell_size_m >= 2**-47 is epsilon >= 2**-54 exactly.
    assert CampaignSpec.from_dict(planar_with_epsilon(2.0**-54, cell_size_m=128)).epsilon > 0
    for epsilon in (math.nextafter(2.0**-54, 0), 1e-20, 1e-300, 1e-308, 5e-324):
        error = rejected(planar_with_epsilon(epsilon, cell_size_m=128), "epsilon")
        assert "2**-47" in error.message
    # Stated as a level within a radius, the fault is the level's.
    tiny_level = with_changes(PLANAR_SPEC, privacy_level=1e-300, privacy_radius_m=1000)
    rejected(tiny_level, "privacy_level")


def test_planar_epsilon_beyond_the_samplers_reach_is_refused():
    # A 6 x 5 grid of 200 m cells: epsilon times the grid's diagonal (200 hypot(6, 5) m) is at
    # most 2 * 1022 ln 2.
    limit = 2 * 1022 * math.log(2) / (200 * math.hypot(6, 5))
    assert CampaignSpec.from_dict(planar_with_epsilon(limit * (1 - 1e-12))).grid.n_cells == 30
    error = rejected(planar_with_epsilon(limit * (1 + 1e-12)), "epsilon")
    assert "too large for this grid" in error.message
    rejected(planar_with_epsilon(1e300), "epsilon")


def test_epsilon_is_required():
    rejected(with_changes(KRR_SPEC, epsilon=...), "epsilon")
    rejected(with_changes(PLANAR_SPEC, privacy_level=..., privacy_radius_m=...), "epsilon")


@pytest.mark.parametrize(
    ("domain", "field"),
    [
        ("apple", "domain"),
        ({"a": 1}, "domain"),
        (("a", "b"), "domain"),  # a tuple is not a JSON list
        (["only"], "domain"),
        ([], "domain"),
        ([f"l{i}" for i in range(MAX_DOMAIN + 1)], "domain"),
        (["a", ""], "domain[1]"),
        (["a", 2], "domain[1]"),
        (["a", None], "domain[1]"),
        (["a", "x" * 201], "domain[1]"),
        (["a", "b", "a"], "domain[2]"),
        (["a", "b", "c", "b"], "domain[3]"),
    ],
)
def test_bad_domains(domain, field):
    rejected(with_changes(KRR_SPEC, domain=domain), field)


def test_krr_needs_a_domain():
    rejected(with_changes(KRR_SPEC, domain=...), "domain")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("region", PLANAR_SPEC["region"]),
        ("cell_size_m", 100),
        ("privacy_level", 1),
        ("privacy_radius_m", 100),
    ],
)
def test_planar_fields_are_refused_on_categorical_campaigns(field, value):
    rejected(with_changes(KRR_SPEC, **{field: value}), field)


def test_planar_refuses_a_domain():
    rejected(with_changes(PLANAR_SPEC, domain=["a", "b"]), "domain")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"region": ...}, "region"),
        ({"region": None}, "region"),
        ({"region": [37.77, 37.78, -122.42, -122.41]}, "region"),
        ({"region": "somewhere"}, "region"),
    ],
)
def test_region_must_be_an_object(change, field):
    rejected(with_changes(PLANAR_SPEC, **change), field)


def test_region_unknown_and_missing_keys():
    data = copy.deepcopy(PLANAR_SPEC)
    data["region"]["alt_min"] = 0
    rejected(data, "region.alt_min")
    for name in ("lat_min", "lat_max", "lon_min", "lon_max"):
        rejected(with_region(**{name: ...}), f"region.{name}")


@pytest.mark.parametrize("name", ["lat_min", "lat_max", "lon_min", "lon_max"])
@pytest.mark.parametrize("value", [True, "37.7", None, float("nan"), float("inf"), 10**400])
def test_region_bounds_must_be_finite_numbers(name, value):
    rejected(with_region(**{name: value}), f"region.{name}")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"lat_min": -90.5}, "region.lat_min"),
        ({"lat_max": 90.0001}, "region.lat_max"),
        ({"lon_min": -180.01}, "region.lon_min"),
        ({"lon_max": 181}, "region.lon_max"),
        ({"lat_min": 37.78}, "region.lat_min"),  # empty: min == max
        ({"lat_min": 37.79}, "region.lat_min"),  # inverted
        ({"lon_min": -122.41}, "region.lon_min"),
        ({"lon_min": -122.40}, "region.lon_min"),
        ({"lat_min": 85.0, "lat_max": 85.01}, "region.lat_max"),  # beyond ±85°
        ({"lat_min": -85.01, "lat_max": -85.0}, "region.lat_min"),
    ],
)
def test_region_bounds_are_checked(changes, field):
    rejected(with_region(**changes), field)


def test_region_at_the_85_degree_limit_is_accepted():
    spec = CampaignSpec.from_dict(with_region(lat_min=84.999, lat_max=85.0))
    assert spec.region.lat_max == 85.0


def test_a_region_spanning_latitudes_is_refused():
    # From -85 to 85 degrees, 0.17 degrees wide: projected east-west distances at 85 degrees
    # are 11.5 times the ground ones (the middle latitude's scale is the equator's).
    data = with_changes(
        with_region(lat_min=-85.0, lat_max=85.0, lon_min=0.0, lon_max=0.17),
        privacy_level=...,
        privacy_radius_m=...,
        epsilon=0.0005,
        cell_size_m=1200,
    )
    error = rejected(data, "region")
    assert "11.47" in error.message and str(MAX_PROJECTION_DISTORTION) in error.message


@pytest.mark.parametrize(
    ("region", "accepted"),
    [
        # 2.5 degrees near 76 north, 10 degrees wide: distortion 1.096.
        ({"lat_min": 74.5, "lat_max": 77.0, "lon_min": 0.0, "lon_max": 10.0}, True),
        ({"lat_min": 74.5, "lat_max": 77.2, "lon_min": 0.0, "lon_max": 10.0}, False),
        # Across the equator the latitude span may reach about 2 x 24.5 degrees ...
        ({"lat_min": -24.0, "lat_max": 24.0, "lon_min": 0.0, "lon_max": 10.0}, True),
        ({"lat_min": -24.7, "lat_max": 24.7, "lon_min": 0.0, "lon_max": 10.0}, False),
        # ... and the longitude span up to about 86 degrees (great circle against the plane).
        ({"lat_min": -0.1, "lat_max": 0.1, "lon_min": 0.0, "lon_max": 85.0}, True),
        ({"lat_min": -0.1, "lat_max": 0.1, "lon_min": 0.0, "lon_max": 87.0}, False),
        ({"lat_min": -0.1, "lat_max": 0.1, "lon_min": -180.0, "lon_max": 180.0}, False),
        # Near the 85 degree limit a region may be about a degree tall.
        ({"lat_min": 84.0, "lat_max": 85.0, "lon_min": 0.0, "lon_max": 1.0}, True),
        ({"lat_min": 83.5, "lat_max": 85.0, "lon_min": 0.0, "lon_max": 1.0}, False),
    ],
)
def test_region_extent_is_bounded_by_the_projection_distortion(region, accepted):
    data = with_changes(
        PLANAR_SPEC,
        region=region,
        cell_size_m=100_000,
        privacy_level=...,
        privacy_radius_m=...,
        epsilon=1e-6,
    )
    if accepted:
        spec = CampaignSpec.from_dict(data)
        assert spec.region.to_dict() == region
        assert spec.region.projection_distortion() <= MAX_PROJECTION_DISTORTION
    else:
        rejected(data, "region")


def test_existing_planar_grids_are_unchanged():
    # The grid (cell numbering and wire centres) of a city campaign, as computed before the
    # distortion bound: the bound only refuses regions, it moves no cell.
    grid = CampaignSpec.from_dict(PLANAR_SPEC).grid
    assert (grid.rows, grid.cols) == (6, 5)
    assert grid.centre(0) == (37.7708993, -122.4188622)
    assert grid.centre(grid.n_cells - 1) == (37.7798925, -122.4097601)


@pytest.mark.parametrize("cell", [..., 0, -5, 0.999, True, "200", float("nan"), float("inf")])
def test_cell_size(cell):
    rejected(with_changes(PLANAR_SPEC, cell_size_m=cell), "cell_size_m")


def test_minimum_cell_size_is_inclusive():
    # A 30 m x 30 m region in 1 m cells is well below the cell cap.
    small = with_region(lat_max=37.77 + 30 / 111_195, lon_max=-122.42 + 30 / 87_900)
    assert CampaignSpec.from_dict(with_changes(small, cell_size_m=1)).cell_size_m == 1.0


def square_grid_spec(rows: int, cols: int, cell: float = 10.0) -> dict:
    """A planar spec near the equator whose grid has ``rows x cols`` cells of ``cell`` metres."""
    per_deg_lat = EARTH_RADIUS_M * math.pi / 180
    lat_span = (rows - 0.5) * cell / per_deg_lat
    per_deg_lon = per_deg_lat * math.cos(math.radians(lat_span / 2))
    lon_span = (cols - 0.5) * cell / per_deg_lon
    data = with_region(lat_min=0.0, lat_max=lat_span, lon_min=0.0, lon_max=lon_span)
    return with_changes(data, cell_size_m=cell)


def test_grid_size_is_capped_at_max_cells():
    assert MAX_CELLS == 512 * 512
    at_cap = CampaignSpec.from_dict(square_grid_spec(512, 512))
    assert (at_cap.grid.rows, at_cap.grid.cols) == (512, 512)
    error = rejected(square_grid_spec(513, 512), "cell_size_m")
    assert "513" in error.message
    rejected(square_grid_spec(512, 513), "cell_size_m")
    # A city-sized region in 1 m cells is far above the cap.
    rejected(with_changes(PLANAR_SPEC, cell_size_m=1), "cell_size_m")


def test_level_and_radius_go_together():
    rejected(with_changes(PLANAR_SPEC, privacy_radius_m=...), "privacy_radius_m")
    rejected(with_changes(PLANAR_SPEC, privacy_level=...), "privacy_level")
    rejected(with_changes(PLANAR_SPEC, privacy_radius_m=..., epsilon=0.01), "privacy_radius_m")


@pytest.mark.parametrize("value", [0, -1, True, "2", float("nan"), float("inf")])
def test_level_and_radius_must_be_positive_numbers(value):
    rejected(with_changes(PLANAR_SPEC, privacy_level=value), "privacy_level")
    rejected(with_changes(PLANAR_SPEC, privacy_radius_m=value), "privacy_radius_m")


@pytest.mark.parametrize("epsilon", [0.02, 0.0100001, 0.0099999, 1.0])
def test_epsilon_must_agree_with_level_over_radius(epsilon):
    rejected(with_changes(PLANAR_SPEC, epsilon=epsilon), "epsilon")


# -- from_wire -----------------------------------------------------------------------------


def test_from_wire_strips_server_fields():
    spec = CampaignSpec.from_dict(KRR_SPEC)
    served = {**KRR_SPEC, "status": "open", "spec_hash": spec.spec_hash, "created_at": 1.0}
    parsed, meta = CampaignSpec.from_wire(served)
    assert parsed == spec
    assert meta == {"status": "open", "spec_hash": spec.spec_hash, "created_at": 1.0}
    assert set(meta) <= SERVER_FIELDS
    # Without server fields the meta is empty; bad content is still refused.
    assert CampaignSpec.from_wire(dict(KRR_SPEC)) == (spec, {})
    with pytest.raises(SpecError) as info:
        CampaignSpec.from_wire({**served, "rogue": 1})
    assert info.value.field == "rogue"
    with pytest.raises(SpecError) as info:
        CampaignSpec.from_wire({**served, "epsilon": float("nan")})
    assert info.value.field == "epsilon"
    for not_object in (None, [], "x"):
        with pytest.raises(SpecError):
            CampaignSpec.from_wire(not_object)


# -- canonical form and hash ---------------------------------------------------------------


def test_canonical_json_is_sorted_and_compact():
    spec = CampaignSpec.from_dict(KRR_SPEC)
    raw = spec.canonical_json()
    assert raw == KRR_CANONICAL
    assert b" " not in raw.replace(b"Favourite fruit", b"")
    decoded = json.loads(raw)
    assert list(decoded) == sorted(decoded)
    planar = json.loads(CampaignSpec.from_dict(PLANAR_SPEC).canonical_json())
    assert list(planar) == sorted(planar)
    assert list(planar["region"]) == sorted(planar["region"])
    # The canonical form round-trips through from_dict to the same spec.
    assert CampaignSpec.from_dict(decoded) == spec


def test_canonical_json_leaves_defaults_out_and_keeps_non_ascii():
    spec = CampaignSpec.from_dict(with_changes(KRR_SPEC, title="Früchte ✓"))
    raw = spec.canonical_json()
    assert "Früchte ✓".encode() in raw
    assert b"enrollment_required" not in raw
    enrolled = CampaignSpec.from_dict(with_changes(KRR_SPEC, enrollment_required=True))
    assert b'"enrollment_required":true' in enrolled.canonical_json()
    assert enrolled.spec_hash != CampaignSpec.from_dict(KRR_SPEC).spec_hash


def test_spec_hash_is_pinned():
    spec = CampaignSpec.from_dict(KRR_SPEC)
    assert spec.spec_hash == KRR_HASH
    assert hashlib.sha256(KRR_CANONICAL).hexdigest() == KRR_HASH
    assert CampaignSpec.from_dict(PLANAR_SPEC).spec_hash == PLANAR_HASH


def test_hash_ignores_key_order_and_int_vs_float():
    reordered = dict(reversed(list(KRR_SPEC.items())))
    assert list(reordered) != list(KRR_SPEC)
    assert CampaignSpec.from_dict(reordered).spec_hash == KRR_HASH
    as_int = with_changes(KRR_SPEC, epsilon=2)
    as_float = with_changes(KRR_SPEC, epsilon=2.0)
    assert CampaignSpec.from_dict(as_int).spec_hash == CampaignSpec.from_dict(as_float).spec_hash
    planar_floats = with_changes(PLANAR_SPEC, privacy_level=2.0, privacy_radius_m=200.0)
    planar_floats["cell_size_m"] = 200.0
    planar_floats["region"] = dict(reversed(list(PLANAR_SPEC["region"].items())))
    assert CampaignSpec.from_dict(planar_floats).spec_hash == PLANAR_HASH


def test_hash_changes_with_any_field():
    base = CampaignSpec.from_dict(KRR_SPEC).spec_hash
    variants = [
        with_changes(KRR_SPEC, epsilon=1.5000000000000002),
        with_changes(KRR_SPEC, title="Favourite fruit!"),
        with_changes(KRR_SPEC, id="fruit2"),
        with_changes(KRR_SPEC, domain=["apple", "cherry", "banana"]),  # order is meaningful
        with_changes(KRR_SPEC, mechanism="krr", domain=["apple", "banana"]),
    ]
    hashes = {CampaignSpec.from_dict(v).spec_hash for v in variants}
    assert base not in hashes and len(hashes) == len(variants)

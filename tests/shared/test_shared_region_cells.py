"""k-RR, OLH and Hadamard response over a region's cells: the spec, the mechanism, the device's
snapping, and the hashes of the specs that existed before."""

from __future__ import annotations

import pytest

from aggregator.http.estimates import cell_label
from shared.errors import ReportError, SpecError
from shared.geo import Grid, Region
from shared.mechanisms import KRR, HadamardResponse, Mechanism, PlanarLaplace
from shared.oracles import OLH
from shared.spec import MAX_CELLS, MAX_DOMAIN, REGION_GRID, SPEC_SCHEMAS, CampaignSpec
from simulate.populations import cell_labels

REGION = {"lat_min": 48.10, "lat_max": 48.15, "lon_min": 11.50, "lon_max": 11.60}
CELLS = {
    "id": "cells",
    "title": "Where, by k-RR",
    "mechanism": "krr",
    "epsilon": 2.0,
    "region": REGION,
    "cell_size_m": 500,
}
INSIDE = {"lat": 48.1234, "lon": 11.5678}
OUTSIDE = {"lat": 48.2, "lon": 11.55}
CELL_MECHANISMS = ("krr", "olh", "hadamard_response")
# The spec hashes before specs took a region for k-RR, OLH and Hadamard response: pinned by
# clients, they must not change.
HASHES_BEFORE = {
    "fruit": "83353e2f82e166863ba401e831c9698981c3ba01a1f0338ac32d47a35f04fc11",
    "where": "b0648adeb971a07587fc0dffba30d94866030ee648a96162d064924cbf56e38c",
    "block": "f493ba5f2ea0d881af1b3075c99f940908ffc4381d4c78694152e10cb5b29407",
    "age": "90b3489b0052342272a9bf6c69625ef684c34afa851da398bed1136bbbaaa4d0",
    "apps": "bf4db2fff884bd11baab372059c588e7602f3a9cf490b0d16c86bccd4918783b",
    "words": "eb2012686bb1c4961a6ef48ec89a2478616fd4afbbb98665cc11757095f8837f",
}


def cells_spec(mechanism: str = "krr", **changes) -> dict:
    spec = {**CELLS, "mechanism": mechanism, **changes}
    return {key: value for key, value in spec.items() if value is not ...}


def refused(data: dict, field: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        CampaignSpec.from_dict(data)
    assert info.value.field == field, info.value.message
    return info.value


# -- the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_categorical_spec_takes_a_region_and_its_grid(mechanism):
    spec = CampaignSpec.from_dict(cells_spec(mechanism))
    assert spec.region == Region(**REGION) and spec.cell_size_m == 500
    assert spec.domain is None and spec.domain_size is None
    assert spec.to_dict() == cells_spec(mechanism, cell_size_m=500)
    assert CampaignSpec.from_dict(spec.to_dict()).spec_hash == spec.spec_hash
    assert (spec.grid.rows, spec.grid.cols) == (12, 15)


def test_the_region_and_its_grid_are_one_description_for_every_mechanism_over_locations():
    for mechanism in ("planar_laplace", "exponential_grid", *CELL_MECHANISMS):
        described = SPEC_SCHEMAS[mechanism]
        shapes = getattr(described, "choices", (described,))
        over_region = [shape for shape in shapes if "region" in shape.properties]
        assert over_region, mechanism
        for shape in over_region:
            for name, descriptor in REGION_GRID.items():
                assert shape.properties[name] is descriptor, (mechanism, name)
                assert name in shape.required


def test_the_hashes_of_specs_from_before_are_unchanged():
    sf = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}
    before = [
        {"id": "fruit", "title": "Favourite fruit", "mechanism": "krr", "epsilon": 1.5}
        | {"domain": ["apple", "banana", "cherry", "damson"]},
        {"id": "where", "title": "Where are you", "mechanism": "planar_laplace"}
        | {"epsilon": 0.01, "region": sf, "cell_size_m": 200},
        {"id": "block", "title": "Which block are you in", "mechanism": "exponential_grid"}
        | {"metric": "euclidean", "epsilon": 0.005, "region": sf, "cell_size_m": 200},
        {"id": "age", "title": "Your age", "mechanism": "geometric", "epsilon": 0.5}
        | {"lo": 0, "hi": 120},
        {"id": "apps", "title": "Your most used app", "mechanism": "olh", "epsilon": 1.0}
        | {"domain_size": 5000},
        {"id": "words", "title": "A word you typed", "mechanism": "hadamard_response"}
        | {"epsilon": 1.0, "domain": [f"w{i}" for i in range(300)]},
    ]
    for data in before:
        assert CampaignSpec.from_dict(data).spec_hash == HASHES_BEFORE[data["id"]], data["id"]


def test_randomized_response_takes_no_region():
    data = {"id": "yes", "title": "Yes?", "mechanism": "rr", "epsilon": 1.0}
    error = refused({**data, "region": REGION, "cell_size_m": 100}, "region")
    assert "krr" in error.message and "planar_laplace" in error.message
    refused({**data, "cell_size_m": 100}, "cell_size_m")


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
@pytest.mark.parametrize("field", ["privacy_level", "privacy_radius_m"])
def test_a_privacy_radius_is_refused_where_epsilon_is_the_same_for_every_two_cells(
    mechanism, field
):
    error = refused(cells_spec(mechanism, **{field: 1.0}), field)
    assert "planar_laplace" in error.message and "near or far" in error.message


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_domain_and_a_region_are_exclusive(mechanism):
    error = refused(cells_spec(mechanism, domain=["a", "b"]), "region")
    assert "domain" in error.message
    refused(cells_spec(mechanism, domain=["a", "b"], region=...), "cell_size_m")


@pytest.mark.parametrize("mechanism", ["olh", "hadamard_response"])
def test_a_domain_size_and_a_region_are_exclusive(mechanism):
    error = refused(cells_spec(mechanism, domain_size=100), "region")
    assert "exactly one" in error.message
    refused(cells_spec(mechanism, domain_size=100, region=...), "cell_size_m")


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_region_needs_its_cell_size_and_a_cell_size_its_region(mechanism):
    refused(cells_spec(mechanism, cell_size_m=...), "cell_size_m")
    refused(cells_spec(mechanism, region=...), "region")


def test_the_grid_is_held_to_the_mechanisms_domain_limit():
    # 1 m cells over 0.05 x 0.1 degrees: 5,560 x 7,432 cells.
    for mechanism in CELL_MECHANISMS:
        refused(cells_spec(mechanism, cell_size_m=1), "cell_size_m")
    # About 133,000 cells: more labels than k-RR takes, fewer cells than a grid may have.
    big = cells_spec("krr", cell_size_m=20)
    cells = Grid(Region(**REGION), 20).n_cells
    assert MAX_DOMAIN < cells <= MAX_CELLS
    error = refused(big, "cell_size_m")
    assert f"{MAX_DOMAIN:,}" in error.message and "krr" in error.message
    for mechanism in ("olh", "hadamard_response"):
        assert CampaignSpec.from_dict(cells_spec(mechanism, cell_size_m=20)).grid.n_cells == cells


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_grid_of_one_cell_is_no_domain(mechanism):
    error = refused(cells_spec(mechanism, cell_size_m=100_000), "cell_size_m")
    assert "at least 2" in error.message


def test_the_epsilon_of_a_region_campaign_is_categorical():
    refused(cells_spec(epsilon=60.0), "epsilon")
    refused(cells_spec(epsilon=...), "epsilon")
    assert CampaignSpec.from_dict(cells_spec(epsilon=2.0**-63)).epsilon == 2.0**-63


# -- the mechanism and the device's snapping ----------------------------------------------


@pytest.mark.parametrize(
    ("mechanism", "kind"), [("krr", KRR), ("olh", OLH), ("hadamard_response", HadamardResponse)]
)
def test_the_mechanism_is_built_over_the_cells_and_keeps_the_grid(mechanism, kind):
    spec = CampaignSpec.from_dict(cells_spec(mechanism))
    built = Mechanism.from_spec(spec)
    assert type(built) is kind and built.epsilon == 2.0
    assert built.grid == spec.grid
    assert built.k == spec.grid.n_cells == 180
    assert built.domain == cell_labels(spec.grid)
    assert built.domain[spec.grid.cols + 2] == cell_label(1, 2) == "r1c2"


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_location_is_snapped_to_its_cell_as_planar_laplace_snaps_it(mechanism):
    spec = CampaignSpec.from_dict(cells_spec(mechanism))
    built = Mechanism.from_spec(spec)
    planar = PlanarLaplace(epsilon=0.01, grid=spec.grid)
    for lat, lon in ((48.1234, 11.5678), (48.10, 11.50), (48.15, 11.60), (48.1499, 11.5001)):
        for value in ({"lat": lat, "lon": lon}, (lat, lon), [lat, lon]):
            assert built.encode(value) == planar.encode(value) == spec.grid.cell_of(lat, lon)


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
def test_a_location_outside_the_region_is_refused_as_planar_laplace_refuses_it(mechanism):
    spec = CampaignSpec.from_dict(cells_spec(mechanism))
    built = Mechanism.from_spec(spec)
    planar = PlanarLaplace(epsilon=0.01, grid=spec.grid)
    messages = []
    for m in (built, planar):
        with pytest.raises(ReportError) as info:
            m.perturb(OUTSIDE)
        messages.append((info.value.message, info.value.field))
    assert messages[0] == messages[1] == ("the location is outside the campaign region", "value")


@pytest.mark.parametrize("mechanism", CELL_MECHANISMS)
@pytest.mark.parametrize(
    "value", ["r1c2", 3, {"lat": 48.12}, {"lat": 48.12, "lon": 11.55, "alt": 3}, (48.12,)]
)
def test_a_region_campaign_takes_a_location_not_a_label(mechanism, value):
    built = Mechanism.from_spec(CampaignSpec.from_dict(cells_spec(mechanism)))
    with pytest.raises(ReportError):
        built.encode(value)


def test_the_report_is_the_mechanisms_usual_report():
    spec = CampaignSpec.from_dict(cells_spec("krr"))
    krr = Mechanism.from_spec(spec)
    report = krr.perturb(INSIDE)
    assert report in krr.domain and krr.parse_report_value(report) == krr.domain.index(report)
    with pytest.raises(ReportError):
        krr.parse_report_value(INSIDE)  # a location never leaves the device
    for name in ("olh", "hadamard_response"):
        oracle = Mechanism.from_spec(CampaignSpec.from_dict(cells_spec(name)))
        report = oracle.perturb(INSIDE)
        assert isinstance(report, int) and oracle.parse_report_value(report) == report
        with pytest.raises(ReportError):
            oracle.parse_report_value("r1c2")


def test_grid_cell_labels_round_trip():
    grid = Grid(Region(**REGION), 500)
    labels = grid.cell_labels()
    assert labels == cell_labels(grid)
    assert [grid.label_index(label) for label in labels] == list(range(grid.n_cells))
    for other in ("r12c0", "r0c15", "r01c1", "c1r1", "r1c1 ", "rc1", "r-1c1"):
        assert grid.label_index(other) is None, other

"""The policy: validation and the cost of a report, checked against brute force."""

from __future__ import annotations

import itertools
import math

import pytest

from client import Policy
from client.policy import worst_centre_distance_m
from shared.geo import EARTH_RADIUS_M, Region
from shared.spec import CampaignSpec


def planar(cell: float, epsilon: float = 0.01, size_deg: float = 0.01) -> CampaignSpec:
    return CampaignSpec.from_dict(
        {
            "id": "p",
            "title": "p",
            "mechanism": "planar_laplace",
            "epsilon": epsilon,
            "region": {
                "lat_min": 10.0,
                "lat_max": 10.0 + size_deg,
                "lon_min": 20.0,
                "lon_max": 20.0 + size_deg,
            },
            "cell_size_m": cell,
        }
    )


def brute_force(spec: CampaignSpec, radius: float, metric: str = "euclidean") -> float:
    """Max centre distance (in ``metric``) over all cell pairs whose rectangles come within
    ``radius`` (straight-line)."""
    distance = math.hypot if metric == "euclidean" else (lambda dr, dc: abs(dr) + abs(dc))
    grid, cell = spec.grid, spec.grid.cell_size_m
    worst = 0.0
    cells = list(itertools.product(range(grid.rows), range(grid.cols)))
    for (r1, c1), (r2, c2) in itertools.product(cells, repeat=2):
        gap = math.hypot(max(abs(r1 - r2) - 1, 0), max(abs(c1 - c2) - 1, 0)) * cell
        if gap <= radius:
            worst = max(worst, distance(r1 - r2, c1 - c2) * cell)
    return worst


@pytest.mark.parametrize("cell", [50.0, 130.0, 400.0, 2000.0])
@pytest.mark.parametrize("radius", [1.0, 100.0, 200.0, 750.0, 5000.0])
def test_worst_centre_distance_matches_brute_force(cell, radius):
    spec = planar(cell)
    assert worst_centre_distance_m(spec, radius) == pytest.approx(brute_force(spec, radius))


def test_costs():
    krr = CampaignSpec.from_dict(
        {"id": "k", "title": "k", "mechanism": "krr", "epsilon": 0.7, "domain": ["a", "b", "c"]}
    )
    assert Policy().cost(krr) == 0.7
    spec = planar(100.0, epsilon=0.005)
    policy = Policy(location_radius_m=200.0)
    # One row and three columns apart: sqrt(10) cells.
    assert policy.cost(spec) == pytest.approx(0.005 * 100 * math.sqrt(10))
    # Never more than the simple bound epsilon * (r + cell * sqrt 2).
    assert policy.cost(spec) <= 0.005 * (200 + 100 * math.sqrt(2))
    # A single-cell grid reveals nothing.
    assert Policy().cost(planar(5000.0)) == 0


def test_cost_is_charged_in_ground_distance_far_from_the_equator():
    # Latitudes -85 to 85, 0.17 degrees wide, 1,200 m cells, 0.0005 per metre: the projection
    # takes the equator's east-west scale, so at 85 degrees two points 1,000 m apart on the
    # ground are 11.47 km apart in it, ten cells: their loss reaches 0.0005 * 12,000 m = 6.0.
    # The spec validation refuses this region; the cost is right even for such a spec.
    region = Region(lat_min=-85.0, lat_max=85.0, lon_min=0.0, lon_max=0.17)
    spec = CampaignSpec(
        id="tall",
        title="tall",
        mechanism="planar_laplace",
        epsilon=0.0005,
        region=region,
        cell_size_m=1200.0,
    )
    grid = spec.grid
    lat = 84.9999
    u = (lat, 0.01)
    v = (lat, 0.01 + math.degrees(1000.0 / (EARTH_RADIUS_M * math.cos(math.radians(lat)))))
    x, other = grid.cell_of(*u), grid.cell_of(*v)
    (ux, uy), (vx, vy) = grid.centre_xy(x), grid.centre_xy(other)
    centre_loss = spec.epsilon * math.hypot(ux - vx, uy - vy)
    assert centre_loss == pytest.approx(6.0)
    cost = Policy(location_radius_m=1000.0).cost(spec)
    assert cost >= centre_loss
    assert region.projection_distortion() == pytest.approx(1 / math.cos(math.radians(85)))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_epsilon": 0}, ValueError),
        ({"total_budget": -1}, ValueError),
        ({"total_budget": math.inf}, ValueError),
        ({"location_radius_m": math.nan}, ValueError),
        ({"value_radius": 0}, ValueError),
        ({"value_radius": 1.5}, ValueError),
        ({"max_epsilon": True}, TypeError),
        ({"max_epsilon": "1"}, TypeError),
    ],
)
def test_policy_validates_once(kwargs, error):
    with pytest.raises(error):
        Policy(**kwargs)


def test_policy_is_immutable_and_keyword_only():
    policy = Policy(max_epsilon=1, total_budget=3)
    assert isinstance(policy.max_epsilon, float)
    with pytest.raises(AttributeError):
        policy.max_epsilon = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        Policy(1.0)  # type: ignore[misc]


def test_cost_covers_geodesic_distance_on_the_ellipsoid():
    # Near the equator a metre north-south on WGS84 is up to 1.0056 m on the sphere, and the
    # client charges that factor everywhere: a 199.5 m radius then reaches past two 100 m cells
    # in the projection, and the farther pair of cells is what it costs.
    spec = planar(100.0, epsilon=0.005)
    radius = 199.5
    on_sphere = spec.region.projection_distortion() * radius
    assert on_sphere < 200 < spec.region.ground_distortion() * radius
    cost = Policy(location_radius_m=radius).cost(spec)
    assert cost == 0.005 * worst_centre_distance_m(spec, spec.region.ground_distortion() * radius)
    assert cost > 0.005 * worst_centre_distance_m(spec, on_sphere)


@pytest.mark.parametrize(("radius", "lo", "hi", "cost"), [(2, 0, 120, 0.5), (1, 0, 120, 0.25)])
def test_a_geometric_report_costs_epsilon_per_unit_over_the_value_radius(radius, lo, hi, cost):
    spec = CampaignSpec.from_dict(
        {"id": "g", "title": "g", "mechanism": "geometric", "epsilon": 0.25, "lo": lo, "hi": hi}
    )
    assert Policy(value_radius=radius).cost(spec) == pytest.approx(cost)


def test_a_geometric_cost_is_capped_by_the_width_of_the_range():
    # Beyond the width nothing is left to hide: two values are at most hi - lo apart.
    spec = CampaignSpec.from_dict(
        {"id": "g", "title": "g", "mechanism": "geometric", "epsilon": 0.3, "lo": 1, "hi": 5}
    )
    assert Policy(value_radius=50).cost(spec) == pytest.approx(0.3 * 4)


@pytest.mark.parametrize("mechanism", ["olh", "hadamard_response"])
def test_an_oracle_report_costs_its_epsilon(mechanism):
    spec = CampaignSpec.from_dict(
        {"id": "o", "title": "o", "mechanism": mechanism, "epsilon": 1.5, "domain_size": 10**6}
    )
    assert Policy().cost(spec) == 1.5


def exponential_grid(cell: float, metric: str, epsilon: float = 0.002) -> CampaignSpec:
    data = planar(cell).to_dict()
    return CampaignSpec.from_dict(
        {**data, "mechanism": "exponential_grid", "metric": metric, "epsilon": epsilon}
    )


@pytest.mark.parametrize("cell", [130.0, 400.0])
@pytest.mark.parametrize("radius", [1.0, 200.0, 750.0, 5000.0])
def test_exponential_grid_costs_its_metric_against_brute_force(cell, radius):
    manhattan = exponential_grid(cell, "manhattan")
    assert worst_centre_distance_m(manhattan, radius, "manhattan") == pytest.approx(
        brute_force(manhattan, radius, "manhattan")
    )
    euclidean = exponential_grid(cell, "euclidean")
    assert worst_centre_distance_m(euclidean, radius, "euclidean") == pytest.approx(
        brute_force(euclidean, radius)
    )


def test_exponential_grid_cost_per_metric():
    policy = Policy(location_radius_m=200.0)
    # One row and three columns apart: 4 cells in Manhattan distance, sqrt(10) in Euclidean.
    assert policy.cost(exponential_grid(100.0, "manhattan")) == pytest.approx(0.002 * 400)
    assert policy.cost(exponential_grid(100.0, "euclidean")) == pytest.approx(
        0.002 * 100 * math.sqrt(10)
    )

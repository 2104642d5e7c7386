"""Planar privacy in ground distance: the charged cost against the exact channel.

For regions at the equator, at 60°N and near the largest allowed projection
distortion, pairs of true locations are sampled at great-circle distances up
to the user's ``location_radius_m``; the exact privacy loss between their cells,
``L(x, x') = max_y ln C[x, y] / C[x', y]`` of the discretised, remapped channel
(the aggregator's quadrature kernel, accurate to ~1e-15), must not exceed what
the device charges for a report, nor the documented raw-location bound
``epsilon * (D * g + sqrt(2) * cell_size_m)``. Deterministic: fixed seeds, exact
channel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_stats import ground_distance_m

from aggregator.estimation.planar_kernel import kernel
from client.policy import Policy, worst_centre_distance_m
from shared.geo import EARTH_RADIUS_M
from shared.spec import MAX_PROJECTION_DISTORTION, CampaignSpec

# Slack of the quadrature channel's losses.
EXACT_SLACK = 1e-9
N_PAIRS = 3000


def destination(lat: float, lon: float, bearing: float, distance_m: float) -> tuple[float, float]:
    """The point ``distance_m`` along the great circle leaving (lat, lon) at ``bearing`` (radians)."""
    phi, delta = math.radians(lat), distance_m / EARTH_RADIUS_M
    sin_phi2 = math.sin(phi) * math.cos(delta) + math.cos(phi) * math.sin(delta) * math.cos(bearing)
    phi2 = math.asin(sin_phi2)
    dlambda = math.atan2(
        math.sin(bearing) * math.sin(delta) * math.cos(phi),
        math.cos(delta) - math.sin(phi) * sin_phi2,
    )
    return math.degrees(phi2), lon + math.degrees(dlambda)


def planar_spec(region: dict, cell: float, epsilon: float) -> CampaignSpec:
    return CampaignSpec.from_dict(
        {
            "id": "ground",
            "title": "ground",
            "mechanism": "planar_laplace",
            "epsilon": epsilon,
            "region": region,
            "cell_size_m": cell,
        }
    )


class ExactChannel:
    """Rows of the exact channel of a spec's grid, built from the kernel on demand."""

    def __init__(self, spec: CampaignSpec):
        grid = spec.grid
        self.rows, self.cols = grid.rows, grid.cols
        self.kernel = kernel(spec.epsilon, grid.cell_size_m, grid.rows, grid.cols).ravel()
        self._log_rows: dict[int, np.ndarray] = {}

    def log_row(self, x: int) -> np.ndarray:
        if x not in self._log_rows:
            r, c = divmod(x, self.cols)
            out_r = np.clip(r + np.arange(-self.rows, self.rows + 1), 0, self.rows - 1)
            out_c = np.clip(c + np.arange(-self.cols, self.cols + 1), 0, self.cols - 1)
            row = np.zeros(self.rows * self.cols)
            np.add.at(row, (out_r[:, None] * self.cols + out_c[None, :]).ravel(), self.kernel)
            assert row.min() > 0
            self._log_rows[x] = np.log(row)
        return self._log_rows[x]

    def loss(self, x: int, other: int) -> float:
        return float(np.max(self.log_row(x) - self.log_row(other)))


def sampled_pairs(spec: CampaignSpec, radius_m: float, seed: int):
    """Pairs of region points at most ``radius_m`` apart on the ground, with that distance.

    Half are uniform (a uniform point, a uniform bearing, a distance uniform on the disc);
    half are pushed to the worst case, a distance near the radius along a parallel at the
    region's latitude farthest from the equator.
    """
    region = spec.region
    generator = np.random.default_rng(seed)
    far_lat = region.lat_max if abs(region.lat_max) >= abs(region.lat_min) else region.lat_min
    pairs = []
    while len(pairs) < N_PAIRS:
        lon = generator.uniform(region.lon_min, region.lon_max)
        if len(pairs) % 2:
            lat = generator.uniform(region.lat_min, region.lat_max)
            bearing = generator.uniform(0, 2 * math.pi)
            distance = radius_m * math.sqrt(generator.uniform())
        else:
            lat = far_lat - math.copysign(generator.uniform(0, 1e-4), far_lat)
            bearing = math.pi / 2 + generator.normal(0, 0.02)
            distance = radius_m * (1 - generator.uniform(0, 1e-3))
        lat2, lon2 = destination(lat, lon, bearing, distance)
        ground = ground_distance_m(lat, lon, lat2, lon2)
        if region.contains(lat2, lon2) and ground <= radius_m:
            pairs.append(((lat, lon), (lat2, lon2), ground))
    return pairs


# (name, region, cell size): grids of about 35 x 35 cells; the last has a distortion of 1.096.
REGIONS = [
    ("equator", {"lat_min": -0.5, "lat_max": 0.5, "lon_min": 10.0, "lon_max": 11.0}, 3200.0),
    ("60N", {"lat_min": 59.5, "lat_max": 60.5, "lon_min": 10.0, "lon_max": 12.0}, 3200.0),
    ("near-limit", {"lat_min": 74.5, "lat_max": 77.0, "lon_min": 0.0, "lon_max": 10.0}, 8000.0),
]


@pytest.mark.parametrize(("name", "region", "cell"), REGIONS, ids=[r[0] for r in REGIONS])
def test_charged_cost_covers_the_exact_loss_in_ground_distance(name, region, cell):
    epsilon = 0.3 / cell
    radius = 20 * cell
    spec = planar_spec(region, cell, epsilon)
    distortion = spec.region.projection_distortion()
    assert distortion <= MAX_PROJECTION_DISTORTION
    cost = Policy(location_radius_m=radius).cost(spec)
    channel = ExactChannel(spec)
    worst = 0.0
    for u, v, ground in sampled_pairs(spec, radius, seed=sum(map(ord, name))):
        loss = channel.loss(spec.grid.cell_of(*u), spec.grid.cell_of(*v))
        assert loss <= cost + EXACT_SLACK, (u, v, ground, loss, cost)
        documented = epsilon * (distortion * ground + math.sqrt(2) * cell)
        assert loss <= documented + EXACT_SLACK, (u, v, ground, loss, documented)
        worst = max(worst, loss)
    # The check is not vacuous: some sampled pair comes close to the charge.
    assert worst >= 0.9 * cost, (worst, cost)
    if name == "near-limit":
        # ... and there the projected-distance charge of the radius alone would be too low.
        assert worst > epsilon * worst_centre_distance_m(spec, radius), worst

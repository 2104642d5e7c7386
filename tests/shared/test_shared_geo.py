"""The local projection and the report grid: sizes, cell lookup and wire centres."""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_stats import ground_distance_m

from shared.geo import (
    CENTRE_TOLERANCE_DEG,
    COORD_DECIMALS,
    EARTH_RADIUS_M,
    ELLIPSOID_STRETCH,
    WGS84_A_M,
    WGS84_FLATTENING,
    Grid,
    Region,
)

PER_DEG_LAT = EARTH_RADIUS_M * math.pi / 180


def region_of_size(height_m: float, width_m: float, lat0: float = 48.85, lon0: float = 2.35):
    """A region whose projected size is ``height_m x width_m`` metres."""
    lat_span = height_m / PER_DEG_LAT
    per_deg_lon = PER_DEG_LAT * math.cos(math.radians(lat0 + lat_span / 2))
    return Region(lat0, lat0 + lat_span, lon0, lon0 + width_m / per_deg_lon)


@pytest.mark.parametrize(
    ("height", "width", "cell", "rows", "cols"),
    [
        (1000, 600, 200, 5, 3),  # exact multiples: no extra row or column
        (1001, 601, 200, 6, 4),  # a metre more opens a new row and column
        (999, 599, 200, 5, 3),
        (50, 50, 200, 1, 1),  # smaller than one cell
        (2000, 100, 100, 20, 1),
    ],
)
def test_rows_and_cols(height, width, cell, rows, cols):
    grid = Grid(region_of_size(height, width), cell)
    assert (grid.rows, grid.cols) == (rows, cols)
    assert grid.n_cells == rows * cols
    assert grid.width_m == cols * cell and grid.height_m == rows * cell


def test_projection_round_trip_and_scale():
    region = region_of_size(1000, 600)
    grid = Grid(region, 200)
    assert grid.to_xy(region.lat_min, region.lon_min) == (0.0, 0.0)
    x, y = grid.to_xy(region.lat_max, region.lon_max)
    # The region was built to be 600 m x 1000 m in this projection.
    assert x == pytest.approx(600, abs=1e-6) and y == pytest.approx(1000, abs=1e-6)
    for px, py in ((0.0, 0.0), (123.4, 567.8), (599.9, 999.9), (-50.0, 1200.0)):
        lat, lon = grid.to_latlon(px, py)
        back = grid.to_xy(lat, lon)
        assert back == pytest.approx((px, py), abs=1e-6)


def test_every_cell_round_trips_through_its_wire_centre():
    grid = Grid(region_of_size(1001, 601), 200)  # 6 x 4, last row/col partly outside the region
    seen = set()
    for index in range(grid.n_cells):
        lat, lon = grid.centre(index)
        assert lat == round(lat, COORD_DECIMALS) and lon == round(lon, COORD_DECIMALS)
        assert grid.cell_of(lat, lon) == index
        assert grid.centre_index(lat, lon) == index
        row, col = divmod(index, grid.cols)
        assert grid.centre_xy(index) == ((col + 0.5) * 200, (row + 0.5) * 200)
        seen.add((lat, lon))
    assert len(seen) == grid.n_cells


def test_cell_of_is_row_major_from_the_south_west():
    grid = Grid(region_of_size(1000, 600), 200)  # 5 rows x 3 cols
    assert grid.cell_of_xy(1, 1) == 0
    assert grid.cell_of_xy(201, 1) == 1  # east: next column
    assert grid.cell_of_xy(1, 201) == 3  # north: next row
    assert grid.cell_of_xy(599, 999) == 14
    # Cell boundaries belong to the cell above/right of them.
    assert grid.cell_of_xy(200.0, 0.0) == 1
    assert grid.cell_of_xy(0.0, 200.0) == 3


@pytest.mark.parametrize(
    ("x", "y", "expected"),
    [
        (-1e9, -1e9, 0),
        (-5, 300, 3),  # west of the grid: first column of its row
        (10_000, 300, 5),  # east: last column
        (300, -5, 1),  # south: first row
        (300, 10_000, 13),  # north: last row
        (1e12, 1e12, 14),
        (600.0, 1000.0, 14),  # the far corner itself
    ],
)
def test_points_outside_the_grid_are_remapped_to_the_nearest_cell(x, y, expected):
    grid = Grid(region_of_size(1000, 600), 200)
    assert grid.cell_of_xy(x, y) == expected


def test_centre_index_rejects_off_centre_points():
    grid = Grid(region_of_size(1000, 600), 200)
    for index in range(grid.n_cells):
        lat, lon = grid.centre(index)
        # Within the stated tolerance it is still the centre; a few times beyond it is not.
        assert grid.centre_index(lat + CENTRE_TOLERANCE_DEG / 2, lon) == index
        for dlat, dlon in ((3e-6, 0), (0, 3e-6), (-3e-6, 0), (0, -3e-6), (3e-6, 3e-6)):
            assert grid.centre_index(lat + dlat, lon + dlon) is None
        # A corner of the cell is in the cell but not its centre.
        corner = grid.to_latlon(*(c - 99.0 for c in grid.centre_xy(index)))
        assert grid.cell_of(*corner) == index
        assert grid.centre_index(*corner) is None


def test_centre_index_rejects_points_outside_the_grid():
    grid = Grid(region_of_size(1000, 600), 200)
    # The centres a row or a column beyond each edge.
    for x, y in ((-100, 100), (100, -100), (700, 100), (100, 1100), (700, 1100), (-100, -100)):
        lat, lon = grid.to_latlon(x, y)
        lat, lon = round(lat, COORD_DECIMALS), round(lon, COORD_DECIMALS)
        assert grid.centre_index(lat, lon) is None
    assert grid.centre_index(0.0, 0.0) is None
    # Finite coordinates whose projection overflows to infinity.
    assert grid.centre_index(0.0, 2.045364742627032e303) is None
    assert grid.centre_index(1e308, -122.415) is None
    assert grid.centre_index(-89.0, -179.0) is None


def test_region_contains_is_inclusive():
    region = Region(1.0, 2.0, 3.0, 4.0)
    assert region.contains(1.0, 3.0) and region.contains(2.0, 4.0) and region.contains(1.5, 3.5)
    assert not region.contains(0.999, 3.5) and not region.contains(1.5, 4.001)
    assert region.to_dict() == {"lat_min": 1.0, "lat_max": 2.0, "lon_min": 3.0, "lon_max": 4.0}


@pytest.mark.parametrize(
    "bounds",
    [
        (37.77, 37.78, -122.42, -122.41),  # a city
        (59.0, 61.0, 10.0, 14.0),
        (74.5, 77.0, 0.0, 10.0),  # near the largest distortion a spec may have
        (-24.0, 24.0, 0.0, 10.0),
        (-0.1, 0.1, 0.0, 85.0),
        (-85.0, 85.0, 0.0, 0.17),  # far beyond it: 11.5
        (-60.0, 70.0, -150.0, 150.0),
        (80.0, 85.0, -50.0, 50.0),
    ],
)
def test_projection_distortion_bounds_projected_over_ground_distance(bounds):
    region = Region(*bounds)
    grid = Grid(region, 1000.0)
    distortion = region.projection_distortion()
    generator = np.random.default_rng(5)
    lats = generator.uniform(region.lat_min, region.lat_max, size=(20_000, 2))
    lons = generator.uniform(region.lon_min, region.lon_max, size=(20_000, 2))
    # ... and the worst kind of pair: close, east-west, at the latitude farthest from the equator.
    far = max(region.lat_min, region.lat_max, key=abs)
    lats[:200] = far
    lons[:200, 1] = lons[:200, 0] + (region.lon_max - lons[:200, 0]) * 1e-3
    worst = 0.0
    for (lat1, lat2), (lon1, lon2) in zip(lats, lons, strict=True):
        ground = ground_distance_m(lat1, lon1, lat2, lon2)
        (x1, y1), (x2, y2) = grid.to_xy(lat1, lon1), grid.to_xy(lat2, lon2)
        ratio = math.hypot(x1 - x2, y1 - y2) / ground
        assert ratio <= distortion, (lat1, lon1, lat2, lon2, ratio, distortion)
        worst = max(worst, ratio)
    # Its latitude part, the middle latitude's east-west scale over the far one's, is attained
    # (the great-circle part is an upper bound, loose for spans of tens of degrees).
    scale_ratio = math.cos(math.radians((region.lat_min + region.lat_max) / 2)) / math.cos(
        math.radians(far)
    )
    assert worst >= 0.999 * scale_ratio, (worst, scale_ratio)


def test_projection_distortion_of_small_regions_is_near_one():
    assert Region(37.77, 37.78, -122.42, -122.41).projection_distortion() < 1.0001
    assert Region(-0.01, 0.01, 0.0, 0.01).projection_distortion() < 1 + 1e-7
    # The tall region: the equator's east-west scale against cos 85 degrees.
    tall = Region(-85.0, 85.0, 0.0, 0.17).projection_distortion()
    assert tall == pytest.approx(1 / math.cos(math.radians(85)), rel=1e-6)


def test_the_sphere_overstates_wgs84_distances_by_at_most_the_ellipsoid_stretch():
    # Radii of curvature of WGS84 at geodetic latitude phi; the sphere's local scale is R for
    # both directions, so R / min(M, N) bounds its overstatement, attained by M at the equator.
    e2 = WGS84_FLATTENING * (2 - WGS84_FLATTENING)
    worst = 0.0
    for degrees in range(0, 91):
        s2 = math.sin(math.radians(degrees)) ** 2
        meridian = WGS84_A_M * (1 - e2) / (1 - e2 * s2) ** 1.5
        prime_vertical = WGS84_A_M / math.sqrt(1 - e2 * s2)
        worst = max(worst, EARTH_RADIUS_M / meridian, EARTH_RADIUS_M / prime_vertical)
    assert worst == pytest.approx(ELLIPSOID_STRETCH, rel=1e-15)
    assert 1.0056 < ELLIPSOID_STRETCH < 1.0057
    region = Region(lat_min=0.0, lat_max=0.01, lon_min=0.0, lon_max=0.01)
    assert region.ground_distortion() == region.projection_distortion() * ELLIPSOID_STRETCH

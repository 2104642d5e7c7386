"""Local planar projection of a campaign region and its report grid.

A campaign region is a lat/lon rectangle of city scale. Locations are mapped
to metres by an equirectangular projection centred on the region's middle
latitude: ``x = R cos(lat_mid) (lon - lon_min)``, ``y = R (lat - lat_min)``
(angles in radians, ``R`` the mean Earth radius). Projected distances
overstate great-circle distances on the sphere of radius ``R`` by at most the
region's :meth:`Region.projection_distortion` (a factor of 1.0001 for a city
at mid-latitudes, growing with the region's extent and latitude), which the
privacy accounting charges and the spec validation bounds.

The report grid tiles the region with square cells of ``cell_size_m`` metres,
starting at the south-west corner; cells are numbered row-major from there
(``index = row * cols + col``, row 0 in the south). When the region's size is
not a multiple of the cell size the last row and column reach a little past
the region; the grid rectangle ``[0, cols*cell] x [0, rows*cell]`` is the
set that perturbed locations are remapped into.

Cell centres travel on the wire as latitude/longitude rounded to
``COORD_DECIMALS`` places (about a centimetre), which both sides compute with
the same code. A cell is named ``r{row}c{col}`` (:func:`cell_label`) where it
is a label: the rows of an estimate or an export, and the values of a k-RR,
OLH or Hadamard response campaign over a region's cells.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ReportError, ValidationError
from shared.schema import ErrorType, finite_number

EARTH_RADIUS_M = 6_371_008.8
# The WGS84 ellipsoid (semi-major axis, flattening), in which device coordinates are given.
WGS84_A_M = 6_378_137.0
WGS84_FLATTENING = 1 / 298.257223563
# The most a great-circle distance on the sphere of radius EARTH_RADIUS_M overstates the geodesic
# distance on WGS84 between the same coordinates: on the ellipsoid ds^2 = M^2 dphi^2 +
# N^2 cos^2(phi) dlambda^2, with both radii of curvature M (meridian) and N (prime vertical) at
# least a (1 - e^2), the meridian radius at the equator, where the bound is attained.
ELLIPSOID_STRETCH = EARTH_RADIUS_M / (WGS84_A_M * (1 - WGS84_FLATTENING * (2 - WGS84_FLATTENING)))
COORD_DECIMALS = 7
_CELL_LABEL = re.compile(r"r([0-9]{1,9})c([0-9]{1,9})")
# A reported centre may differ from the exact one by this much (degrees).
CENTRE_TOLERANCE_DEG = 1e-6


def cell_label(row: int, col: int) -> str:
    """The label of a report-grid cell (row 0 is the southern edge, col 0 the western)."""
    return f"r{row}c{col}"


def parse_location(
    value: Any, field: str = "value", error: ErrorType = ValidationError
) -> tuple[float, float]:
    """``(lat, lon)`` from ``{"lat", "lon"}`` (exactly those keys) or a ``(lat, lon)`` pair."""
    if isinstance(value, dict):
        if set(value) != {"lat", "lon"}:
            raise error(f"{field} must be an object with exactly lat and lon", field=field)
        lat, lon = value["lat"], value["lon"]
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lat, lon = value
    else:
        raise error(f"{field} must be a location {{lat, lon}}", field=field)
    return finite_number(lat, f"{field}.lat", error), finite_number(lon, f"{field}.lon", error)


def _sinc(t: float) -> float:
    return math.sin(t) / t if t else 1.0


@dataclass(frozen=True)
class Region:
    """A latitude/longitude rectangle, in degrees."""

    lat_min: float
    lat_max: float
    lon_min: float
    lon_max: float

    def contains(self, lat: float, lon: float) -> bool:
        return self.lat_min <= lat <= self.lat_max and self.lon_min <= lon <= self.lon_max

    def projection_distortion(self) -> float:
        r"""The largest ratio of projected to great-circle distance between two points of the region.

        For points ``(phi_1, lambda_1)``, ``(phi_2, lambda_2)`` of the region
        the haversine formula gives the central angle ``theta`` exactly:
        :math:`\sin^2(\theta/2) = \sin^2(\Delta\phi/2) + \cos\phi_1 \cos\phi_2 \sin^2(\Delta\lambda/2)`.
        With ``theta/2 >= sin(theta/2)``, ``cos(phi_1) cos(phi_2) >= c^2`` for
        ``c`` the cosine of the region's largest absolute latitude, and
        ``sin(t) >= t sinc(T)`` for ``|t| <= T <= pi`` (``sinc(T) = sin(T)/T``,
        decreasing), the ground distance ``g = R theta`` is at least
        :math:`R \sqrt{(s_\phi \Delta\phi)^2 + (c\, s_\lambda \Delta\lambda)^2}`,
        where ``s_phi`` and ``s_lambda`` are ``sinc`` of half the region's
        latitude and longitude spans. The projected distance is
        :math:`R \sqrt{\Delta\phi^2 + (c_m \Delta\lambda)^2}` with ``c_m``
        the cosine of the middle latitude, so
        ``d_projected <= D * g`` with
        ``D = max(1 / s_phi, (c_m / c) / s_lambda)``. The value is rounded up
        by a relative 1e-12 to cover its own floating-point error.
        """
        lat_span = math.radians(self.lat_max - self.lat_min)
        lon_span = math.radians(self.lon_max - self.lon_min)
        cos_mid = math.cos(math.radians((self.lat_min + self.lat_max) / 2))
        cos_far = math.cos(math.radians(max(abs(self.lat_min), abs(self.lat_max))))
        north_south = 1 / _sinc(lat_span / 2)
        east_west = cos_mid / cos_far / _sinc(lon_span / 2)
        return max(north_south, east_west) * (1 + 1e-12)

    def ground_distortion(self) -> float:
        """The largest ratio of projected distance to WGS84 geodesic distance in the region.

        :meth:`projection_distortion` against the sphere, times
        :data:`ELLIPSOID_STRETCH` from the sphere to the ellipsoid.
        """
        return self.projection_distortion() * ELLIPSOID_STRETCH

    def to_dict(self) -> dict[str, float]:
        return {
            "lat_min": self.lat_min,
            "lat_max": self.lat_max,
            "lon_min": self.lon_min,
            "lon_max": self.lon_max,
        }


@dataclass(frozen=True)
class Grid:
    """The report grid of a region: projection, cell lookup and cell centres."""

    region: Region
    cell_size_m: float
    rows: int = field(init=False, compare=False)
    cols: int = field(init=False, compare=False)
    _m_per_deg_lat: float = field(init=False, compare=False, repr=False)
    _m_per_deg_lon: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        lat_mid = math.radians((self.region.lat_min + self.region.lat_max) / 2)
        metres_per_deg_lat = EARTH_RADIUS_M * math.pi / 180
        metres_per_deg_lon = metres_per_deg_lat * math.cos(lat_mid)
        width = (self.region.lon_max - self.region.lon_min) * metres_per_deg_lon
        height = (self.region.lat_max - self.region.lat_min) * metres_per_deg_lat
        # A hair of slack so that a region of exactly n cells is not given n + 1.
        cols = max(1, math.ceil(width / self.cell_size_m - 1e-9))
        rows = max(1, math.ceil(height / self.cell_size_m - 1e-9))
        object.__setattr__(self, "_m_per_deg_lat", metres_per_deg_lat)
        object.__setattr__(self, "_m_per_deg_lon", metres_per_deg_lon)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "cols", cols)

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    @property
    def width_m(self) -> float:
        return self.cols * self.cell_size_m

    @property
    def height_m(self) -> float:
        return self.rows * self.cell_size_m

    def to_xy(self, lat: float, lon: float) -> tuple[float, float]:
        """Metres east and north of the region's south-west corner."""
        return (
            (lon - self.region.lon_min) * self._m_per_deg_lon,
            (lat - self.region.lat_min) * self._m_per_deg_lat,
        )

    def to_latlon(self, x: float, y: float) -> tuple[float, float]:
        return (
            self.region.lat_min + y / self._m_per_deg_lat,
            self.region.lon_min + x / self._m_per_deg_lon,
        )

    def cell_of_xy(self, x: float, y: float) -> int:
        """The cell holding the point after remapping it into the grid rectangle.

        Clamping each coordinate to the rectangle is the nearest point of the
        rectangle (the remapping of the truncated mechanism); the cell is then
        found by integer division.
        """
        col = min(max(int(x // self.cell_size_m), 0), self.cols - 1)
        row = min(max(int(y // self.cell_size_m), 0), self.rows - 1)
        return row * self.cols + col

    def cell_of(self, lat: float, lon: float) -> int:
        """The cell of a location inside the region."""
        return self.cell_of_xy(*self.to_xy(lat, lon))

    def locate(self, value: Any) -> int:
        """The cell of a true location ``{"lat", "lon"}`` (or a ``(lat, lon)`` pair): what a
        device snaps its location to before any mechanism over the cells perturbs it.

        :class:`ReportError` (field ``value``) for anything else, or for a location
        outside the region.
        """
        lat, lon = parse_location(value, "value", ReportError)
        if not self.region.contains(lat, lon):
            raise ReportError("the location is outside the campaign region", field="value")
        return self.cell_of(lat, lon)

    def cell_labels(self) -> tuple[str, ...]:
        """Every cell's :func:`cell_label`, in index order (row-major from the south-west)."""
        return tuple(cell_label(row, col) for row in range(self.rows) for col in range(self.cols))

    def label_index(self, label: str) -> int | None:
        """The index of the cell named ``label`` (``r{row}c{col}``), or None if none is."""
        match = _CELL_LABEL.fullmatch(label)
        if match is None:
            return None
        row, col = int(match[1]), int(match[2])
        if not (row < self.rows and col < self.cols) or cell_label(row, col) != label:
            return None  # beyond the grid, or not in canonical form (r01c2)
        return row * self.cols + col

    def centre_xy(self, index: int) -> tuple[float, float]:
        row, col = divmod(index, self.cols)
        return ((col + 0.5) * self.cell_size_m, (row + 0.5) * self.cell_size_m)

    def centre(self, index: int) -> tuple[float, float]:
        """A cell's centre as (lat, lon), rounded as it travels on the wire."""
        lat, lon = self.to_latlon(*self.centre_xy(index))
        return round(lat, COORD_DECIMALS), round(lon, COORD_DECIMALS)

    def centre_index(self, lat: float, lon: float) -> int | None:
        """The cell whose wire centre is (lat, lon), or None if it is no centre."""
        x, y = self.to_xy(lat, lon)
        if not (math.isfinite(x) and math.isfinite(y)):  # a finite longitude can project to inf
            return None
        col = math.floor(x / self.cell_size_m)
        row = math.floor(y / self.cell_size_m)
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            return None
        index = row * self.cols + col
        c_lat, c_lon = self.centre(index)
        if abs(c_lat - lat) > CENTRE_TOLERANCE_DEG or abs(c_lon - lon) > CENTRE_TOLERANCE_DEG:
            return None
        return index

"""The user's privacy policy and what one report costs under it.

Budget is spent in one currency, the ordinary (local-DP) epsilon:

* an ``rr``, ``krr``, ``olh`` or ``hadamard_response`` report costs the
  campaign's ``epsilon``, over labels as over a region's cells (any two cells
  are told apart by at most ``e^epsilon``, near or far);
* a ``planar_laplace`` report costs the privacy loss between any two true
  locations at most ``location_radius_m`` apart on the ground (geodesic
  distance on the WGS84 ellipsoid, in which coordinates are given). The device reports the centre of the true location's grid cell
  with planar Laplace noise, remapped and snapped to the grid
  (post-processing), so two true locations in cells whose centres are ``D``
  projected metres apart are ``epsilon * D``-indistinguishable. Projected
  distances overstate ground ones by at most the region's distortion factor
  (:meth:`shared.geo.Region.ground_distortion`: the projection against the
  sphere, times at most 1.0056 from the sphere to the ellipsoid), so two
  locations within the radius on the ground are within
  ``distortion * location_radius_m`` in the projection. The cost is ``epsilon`` times the largest centre distance
  between two cells that hold points that close, capped by the largest
  centre distance in the grid (beyond which nothing is left to hide). With
  100 m cells and a 200 m radius in a city (distortion 1.0057) that distance
  is about 316 m (one row and three columns apart).

* an ``exponential_grid`` report costs the same with the campaign's metric:
  ``epsilon`` per metre of that metric (Euclidean or Manhattan distance
  between cell centres) times the largest such distance between two cells
  that hold points within ``distortion * location_radius_m``, capped likewise.
  The device reports the true location's cell through the exponential
  mechanism on the lattice of cells, clamped into the grid (post-processing).

* a ``geometric`` report costs the privacy loss between any two true values
  at most ``value_radius`` apart: ``epsilon`` (per unit) times
  ``value_radius``, capped by the width of the range ``hi - lo`` (beyond
  which nothing is left to hide). Clamping into the range is post-processing,
  so the ends cost no more.

Reports compose sequentially: each new (campaign, true value) pair adds its
cost to the ledger; a memoized repeat adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.schema import positive_finite
from shared.spec import EUCLIDEAN, GEOMETRIC, GRID_MECHANISMS, MANHATTAN, CampaignSpec

# Conservative defaults: a per-report cap of 2 admits randomized response at
# ln 3 (RAPPOR's order of magnitude) and k-RR up to e^2 ~ 7.4 odds, and the
# lifetime budget allows a handful of distinct answers.
DEFAULT_MAX_EPSILON = 2.0
DEFAULT_TOTAL_BUDGET = 10.0
# The distance within which a user wants two locations of theirs to look alike.
DEFAULT_LOCATION_RADIUS_M = 200.0
# The distance within which a user wants two values of an integer range (ages, ratings) of
# theirs to look alike.
DEFAULT_VALUE_RADIUS = 2


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Limits the device enforces whatever the server says.

    Parameters
    ----------
    max_epsilon : float
        The largest cost of one report; a campaign above it is refused.
    total_budget : float
        The most this user ever spends, summed over every campaign (including
        forgotten ones: what the server received stays received).
    location_radius_m : float
        For location campaigns: locations closer than this on the ground
        (geodesic distance on WGS84) are what the user wants kept indistinguishable;
        the cost of a report is measured there.
    value_radius : int
        For geometric campaigns: integer values at most this far apart are what
        the user wants kept indistinguishable (at least 1).
    """

    max_epsilon: float = DEFAULT_MAX_EPSILON
    total_budget: float = DEFAULT_TOTAL_BUDGET
    location_radius_m: float = DEFAULT_LOCATION_RADIUS_M
    value_radius: int = DEFAULT_VALUE_RADIUS

    def __post_init__(self) -> None:
        for name in ("max_epsilon", "total_budget", "location_radius_m"):
            object.__setattr__(self, name, positive_finite(getattr(self, name), name))
        radius = self.value_radius
        if isinstance(radius, bool) or not isinstance(radius, int) or radius < 1:
            raise ValueError(f"value_radius must be an integer >= 1, got {radius!r}")

    def cost(self, spec: CampaignSpec) -> float:
        """The epsilon one new report in this campaign spends."""
        if spec.mechanism == GEOMETRIC and spec.lo is not None and spec.hi is not None:
            return spec.epsilon * min(self.value_radius, spec.hi - spec.lo)
        if spec.mechanism not in GRID_MECHANISMS:
            return spec.epsilon
        projected_radius = spec.grid.region.ground_distortion() * self.location_radius_m
        return spec.epsilon * worst_centre_distance_m(spec, projected_radius, spec.metric)

    def to_dict(self) -> dict[str, float]:
        return {
            "max_epsilon": self.max_epsilon,
            "total_budget": self.total_budget,
            "location_radius_m": self.location_radius_m,
            "value_radius": self.value_radius,
        }


def worst_centre_distance_m(
    spec: CampaignSpec, radius_m: float, metric: str | None = EUCLIDEAN
) -> float:
    """The largest distance between the centres of two cells holding points ``radius_m`` apart.

    Distances here are projected metres, those of the grid; ``radius_m`` is
    straight-line, the centres' distance is in ``metric`` (Euclidean, or
    Manhattan for an ``exponential_grid`` campaign that uses it).

    Cells ``(di, dj)`` apart (in rows and columns) hold points as close as
    ``cell * hypot(max(di - 1, 0), max(dj - 1, 0))`` and have centres
    ``cell * hypot(di, dj)`` (Euclidean) or ``cell * (di + dj)`` (Manhattan)
    apart; the offsets are bounded by the grid. Both grow with ``dj``, so for
    each ``di`` the farthest reachable column is the worst.
    """
    grid = spec.grid
    cell = grid.cell_size_m
    reach = radius_m / cell
    worst = 0.0
    for di in range(min(math.floor(reach) + 1, grid.rows - 1) + 1):
        gap_rows = max(di - 1, 0)
        if gap_rows > reach:
            break
        dj = min(math.floor(math.sqrt(reach * reach - gap_rows * gap_rows)) + 1, grid.cols - 1)
        worst = max(worst, di + dj if metric == MANHATTAN else math.hypot(di, dj))
    return worst * cell

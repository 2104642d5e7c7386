"""Simulated populations: a distribution of true values and how to draw users from it.

A :class:`Population` is a probability vector over a mechanism's *input
indices*: the labels of a categorical campaign, or the cells of a location
campaign's report grid (row-major, row 0 in the south, as in
:class:`shared.geo.Grid`). A population read from a file also keeps its rows,
so that a simulation can use every row once, as the data set is.

Constructors:

* :meth:`Population.uniform`, :meth:`Population.zipf`, :meth:`Population.from_weights`;
* :meth:`Population.from_csv_column`: the empirical distribution of one column
  of a CSV file (categories);
* :meth:`Population.clustered_city`: a synthetic city on a grid, a mixture of
  Gaussian hotspots over a uniform background;
* :meth:`Population.from_csv_points`: lat/lon points of a CSV file, on a grid.

Loaders validate once, here, and name the line and column of the first bad
entry; they never echo a coordinate or a value back (the file may hold real
people's data).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.estimation.region_advice import cell_edges_m
from aggregator.estimation.region_advice import clustered_city as city_mass
from shared.errors import ValidationError
from shared.geo import Grid, Region

DEFAULT_CHUNK = 1_000_000
# Keeps a drawn point this far (in cell sizes) from a cell's edges, so that the
# client's projection puts it back in the same cell despite rounding.
_EDGE_MARGIN = 1e-6


class PopulationError(ValidationError):
    """A population that cannot be built: bad parameters or a bad data file."""

    code = "invalid_population"


def cell_labels(grid: Grid) -> tuple[str, ...]:
    """Labels of the grid's cells in index order, as the aggregator names them (``r{row}c{col}``)."""
    return tuple(f"r{row}c{col}" for row in range(grid.rows) for col in range(grid.cols))


def _normalised(weights: np.ndarray, field: str) -> np.ndarray:
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 1 or weights.size < 2:
        raise PopulationError("a population needs at least two values", field=field)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise PopulationError("weights must be finite and non-negative", field=field)
    total = weights.sum()
    if total <= 0:
        raise PopulationError("weights must not all be zero", field=field)
    return weights / total


def _labels(labels: Sequence[str] | None, k: int, field: str = "labels") -> tuple[str, ...]:
    if labels is None:
        return tuple(f"v{i}" for i in range(k))
    labels = tuple(labels)
    if len(labels) != k:
        raise PopulationError(f"expected {k} labels, got {len(labels)}", field=field)
    if len(set(labels)) != k or not all(isinstance(x, str) and x for x in labels):
        raise PopulationError("labels must be distinct non-empty strings", field=field)
    return labels


@dataclass(frozen=True, eq=False)
class Population:
    """True values over a mechanism's inputs.

    Attributes
    ----------
    name : str
        A short description for tables and plots.
    probabilities : numpy.ndarray
        ``probabilities[i]`` is the share of users whose true value is input ``i``.
    labels : tuple of str
        One label per input (for locations: the cell labels ``r{row}c{col}``).
    grid : Grid or None
        The report grid of a location population.
    rows : numpy.ndarray or None
        For a data set: each row's input index (one user per row).
    points : numpy.ndarray or None
        For a data set of locations: each row's ``(lat, lon)``.
    """

    name: str
    probabilities: np.ndarray
    labels: tuple[str, ...]
    grid: Grid | None = None
    rows: np.ndarray | None = None
    points: np.ndarray | None = None

    # -- constructors --------------------------------------------------------------------------

    @classmethod
    def uniform(cls, k: int, labels: Sequence[str] | None = None) -> Population:
        """Every one of ``k`` values equally likely."""
        k = _count(k)
        return cls(f"uniform(k={k})", np.full(k, 1.0 / k), _labels(labels, k))

    @classmethod
    def zipf(cls, k: int, s: float = 1.1, labels: Sequence[str] | None = None) -> Population:
        """Zipf's law: the ``i``-th most common value (from 1) has weight ``i ** -s``."""
        k = _count(k)
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise PopulationError(
                f"the Zipf exponent must be finite and >= 0, got {s!r}", field="s"
            )
        weights = np.arange(1, k + 1, dtype=float) ** -float(s)
        return cls(f"zipf(k={k}, s={s:g})", weights / weights.sum(), _labels(labels, k))

    @classmethod
    def from_weights(
        cls, weights: Sequence[float], labels: Sequence[str] | None = None
    ) -> Population:
        """Explicit weights, normalised to sum to 1."""
        probabilities = _normalised(np.asarray(list(weights), dtype=float), "weights")
        k = probabilities.size
        return cls(f"weights(k={k})", probabilities, _labels(labels, k))

    @classmethod
    def from_csv_column(
        cls, path: str | Path, column: str, labels: Sequence[str] | None = None
    ) -> Population:
        """The values of one column of a CSV file with a header, one user per row.

        ``labels`` fixes the domain (e.g. an existing campaign's); a value
        outside it is an error. Without it the domain is the sorted set of
        values found.
        """
        records = _read_csv(path, (column,))
        values = [record[column] for record in records]
        for line, value in zip(_lines(records), values, strict=True):
            if not value.strip():
                raise PopulationError(
                    f"{path}: line {line}: column {column!r} is empty", field=column
                )
        domain = tuple(sorted(set(values))) if labels is None else _labels(labels, len(labels))
        if len(domain) < 2:
            raise PopulationError(
                f"{path}: column {column!r} holds fewer than two distinct values", field=column
            )
        index = {label: i for i, label in enumerate(domain)}
        rows = np.empty(len(values), dtype=np.int64)
        for i, (line, value) in enumerate(zip(_lines(records), values, strict=True)):
            if value not in index:
                raise PopulationError(
                    f"{path}: line {line}: the value in column {column!r} is not one of the "
                    f"{len(domain)} labels of the domain",
                    field=column,
                )
            rows[i] = index[value]
        probabilities = np.bincount(rows, minlength=len(domain)) / rows.size
        name = f"{Path(path).name}:{column} ({rows.size} rows)"
        return cls(name, probabilities, domain, rows=rows)

    @classmethod
    def clustered_city(
        cls,
        grid: Grid,
        *,
        hotspots: int = 8,
        background: float = 0.1,
        spread_m: tuple[float, float] = (100.0, 500.0),
        seed: int = 0,
    ) -> Population:
        """A synthetic city: Gaussian hotspots over a uniform background, inside the region
        (:func:`aggregator.estimation.region_advice.clustered_city`, its arguments checked)."""
        hotspots = _count(hotspots, minimum=1, field="hotspots")
        if not 0 <= background <= 1:
            raise PopulationError("background must be in [0, 1]", field="background")
        low, high = spread_m
        if not 0 < low <= high:
            raise PopulationError("spread_m must be 0 < low <= high", field="spread_m")
        mass = city_mass(
            grid, hotspots=hotspots, background=background, spread_m=spread_m, seed=seed
        )
        name = f"clustered city ({hotspots} hotspots, seed {seed})"
        return cls(name, mass, cell_labels(grid), grid=grid)

    @classmethod
    def from_csv_points(
        cls,
        path: str | Path,
        grid: Grid | None = None,
        *,
        cell_size_m: float | None = None,
        lat_column: str = "lat",
        lon_column: str = "lon",
    ) -> Population:
        """Locations from a CSV file with ``lat`` and ``lon`` columns, one user per row.

        Every point must lie in ``grid``'s region. Without a grid, the region is
        the points' bounding box and ``cell_size_m`` is required.
        """
        records = _read_csv(path, (lat_column, lon_column))
        points = np.empty((len(records), 2))
        for i, (line, record) in enumerate(zip(_lines(records), records, strict=True)):
            for j, (column, limit) in enumerate(((lat_column, 90.0), (lon_column, 180.0))):
                raw = record[column].strip()
                try:
                    value = float(raw)
                except ValueError:
                    raise PopulationError(
                        f"{path}: line {line}: column {column!r} is not a number", field=column
                    ) from None
                if not math.isfinite(value) or abs(value) > limit:
                    raise PopulationError(
                        f"{path}: line {line}: column {column!r} is not a finite coordinate "
                        f"within ±{limit:g}",
                        field=column,
                    )
                points[i, j] = value
        if grid is None:
            if cell_size_m is None:
                raise PopulationError("give a grid or a cell size", field="cell_size_m")
            lat_min, lon_min = points.min(axis=0)
            lat_max, lon_max = points.max(axis=0)
            if not (lat_min < lat_max and lon_min < lon_max):
                raise PopulationError(f"{path}: the points do not span an area", field=lat_column)
            grid = Grid(Region(lat_min, lat_max, lon_min, lon_max), cell_size_m)
        region = grid.region
        inside = (
            (points[:, 0] >= region.lat_min)
            & (points[:, 0] <= region.lat_max)
            & (points[:, 1] >= region.lon_min)
            & (points[:, 1] <= region.lon_max)
        )
        if not inside.all():
            first = int(np.argmin(inside))
            outside = int((~inside).sum())
            raise PopulationError(
                f"{path}: line {_lines(records)[first]}: the point is outside the region "
                f"(lat {region.lat_min:g} to {region.lat_max:g}, lon {region.lon_min:g} to "
                f"{region.lon_max:g}); {outside} of {len(records)} points are",
                field="region",
            )
        rows = np.fromiter(
            (grid.cell_of(lat, lon) for lat, lon in points), dtype=np.int64, count=len(points)
        )
        probabilities = np.bincount(rows, minlength=grid.n_cells) / rows.size
        name = f"{Path(path).name} ({rows.size} points)"
        return cls(name, probabilities, cell_labels(grid), grid=grid, rows=rows, points=points)

    # -- drawing users ---------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The number of possible true values (labels or cells)."""
        return self.probabilities.size

    @property
    def is_location(self) -> bool:
        return self.grid is not None

    @property
    def n_rows(self) -> int | None:
        """The number of users of a data set, or None for a distribution."""
        return None if self.rows is None else int(self.rows.size)

    def default_n(self, fallback: int) -> int:
        return self.n_rows if self.n_rows is not None else fallback

    def draw_users(self, n: int | None, generator: np.random.Generator) -> np.ndarray:
        """Row numbers (data sets) or input indices (distributions) of ``n`` users.

        For a data set, ``n=None`` or ``n`` equal to its size takes every row
        once; another ``n`` resamples rows with replacement. A distribution
        needs ``n`` and draws independently from it.
        """
        if self.rows is not None:
            if n is None or n == self.rows.size:
                return np.arange(self.rows.size)
            return generator.integers(0, self.rows.size, size=_count(n, 1, "n"))
        if n is None:
            raise PopulationError("the number of users is required", field="n")
        return generator.choice(self.size, size=_count(n, 1, "n"), p=self.probabilities)

    def index_chunks(
        self, n: int | None, generator: np.random.Generator, chunk_size: int = DEFAULT_CHUNK
    ) -> Iterator[np.ndarray]:
        """The input indices of ``n`` users, in chunks of at most ``chunk_size``.

        Memory stays ``O(chunk_size + size)`` whatever ``n``: the number of
        users per value is drawn first (multinomial), then the users of a
        chunk are read off its cumulative sum. The order of users is
        irrelevant to a simulation, as each is perturbed independently.
        """
        if self.rows is not None and (n is None or n == self.rows.size):
            for start in range(0, self.rows.size, chunk_size):
                yield self.rows[start : start + chunk_size]
            return
        if self.rows is not None:
            total = _count(n, 1, "n")
            for start in range(0, total, chunk_size):
                stop = min(start + chunk_size, total)
                yield self.rows[generator.integers(0, self.rows.size, size=stop - start)]
            return
        if n is None:
            raise PopulationError("the number of users is required", field="n")
        total = _count(n, 1, "n")
        cumulative = np.cumsum(generator.multinomial(total, self.probabilities))
        for start in range(0, total, chunk_size):
            positions = np.arange(start, min(start + chunk_size, total))
            yield np.searchsorted(cumulative, positions, side="right")

    def indices_of(self, users: np.ndarray) -> np.ndarray:
        """Input indices of users from :meth:`draw_users`."""
        return self.rows[users] if self.rows is not None else users

    def client_values(
        self, users: np.ndarray, generator: np.random.Generator, *, as_location: bool
    ) -> list[Any]:
        """What each user's device is given as its true value.

        ``as_location`` (a planar Laplace campaign): ``{"lat", "lon"}``: the
        data set's own point, or a uniform point in the part of the user's cell
        inside the region. Otherwise the label of the user's input.
        """
        indices = self.indices_of(users)
        if not as_location:
            return [self.labels[i] for i in indices]
        if self.grid is None:
            raise PopulationError("a categorical population has no locations", field="population")
        if self.points is not None:
            return [{"lat": float(lat), "lon": float(lon)} for lat, lon in self.points[users]]
        grid = self.grid
        x_edges, y_edges = cell_edges_m(grid)
        row, col = np.divmod(indices, grid.cols)
        margin = _EDGE_MARGIN * grid.cell_size_m
        x = generator.uniform(x_edges[col] + margin, x_edges[col + 1] - margin)
        y = generator.uniform(y_edges[row] + margin, y_edges[row + 1] - margin)
        values = []
        for xi, yi in zip(x, y, strict=True):
            lat, lon = grid.to_latlon(float(xi), float(yi))
            values.append({"lat": lat, "lon": lon})
        return values


def _count(value: Any, minimum: int = 2, field: str = "k") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise PopulationError(
            f"{field} must be an integer >= {minimum}, got {value!r}", field=field
        )
    return int(value)


def _read_csv(path: str | Path, required: Sequence[str]) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            missing = [c for c in required if c not in header]
            if missing:
                found = ", ".join(repr(c) for c in header) or "none"
                raise PopulationError(
                    f"{path}: no column {missing[0]!r} in the header (columns: {found})",
                    field=missing[0],
                )
            records = []
            for record in reader:
                if None in record or any(record[c] is None for c in required):
                    raise PopulationError(
                        f"{path}: line {reader.line_num}: expected {len(header)} fields",
                        field="csv",
                    )
                record["__line__"] = reader.line_num
                records.append(record)
    except OSError as exc:
        raise PopulationError(f"cannot read {path}: {exc.strerror or exc}", field="csv") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PopulationError(f"{path} is not a readable CSV file: {exc}", field="csv") from exc
    if not records:
        raise PopulationError(f"{path}: no data rows", field="csv")
    return records


def _lines(records: list[dict]) -> list[int]:
    return [record["__line__"] for record in records]

"""Simulated populations: constructors, CSV loaders and their errors, drawing users."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.geo import Grid, Region
from simulate.populations import Population, PopulationError, cell_labels

REGION = Region(lat_min=48.10, lat_max=48.13, lon_min=11.50, lon_max=11.54)
GRID = Grid(REGION, 250.0)


def write(tmp_path, text: str, name: str = "data.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_uniform_and_zipf_follow_their_definitions():
    uniform = Population.uniform(5)
    assert np.allclose(uniform.probabilities, 0.2)
    assert uniform.labels == ("v0", "v1", "v2", "v3", "v4")
    zipf = Population.zipf(6, 1.5, labels=list("abcdef"))
    assert math.isclose(zipf.probabilities.sum(), 1.0)
    # Zipf's law: the i-th value's share over the j-th is (j / i) ** s.
    assert math.isclose(zipf.probabilities[0] / zipf.probabilities[3], 4**1.5)
    assert zipf.labels == tuple("abcdef")


@pytest.mark.parametrize(
    ("weights", "labels"),
    [
        ([1.0, -1.0], None),
        ([0.0, 0.0], None),
        ([1.0, math.nan], None),
        ([1.0], None),
        ([1, 2], ["a"]),
    ],
)
def test_bad_weights_are_refused(weights, labels):
    with pytest.raises(PopulationError):
        Population.from_weights(weights, labels)


def test_duplicate_labels_are_refused():
    with pytest.raises(PopulationError, match="distinct"):
        Population.uniform(2, labels=["a", "a"])


def test_csv_column_is_the_empirical_distribution(tmp_path):
    path = write(tmp_path, "user,fruit\n1,apple\n2,pear\n3,apple\n4,fig\n")
    population = Population.from_csv_column(path, "fruit")
    assert population.labels == ("apple", "fig", "pear")
    assert np.allclose(population.probabilities, [0.5, 0.25, 0.25])
    assert population.n_rows == 4
    # Every row once, in file order.
    users = population.draw_users(None, np.random.default_rng(0))
    assert list(population.indices_of(users)) == [0, 2, 0, 1]


def test_csv_column_errors_name_the_problem(tmp_path):
    missing = write(tmp_path, "user,colour\n1,red\n", "a.csv")
    with pytest.raises(PopulationError, match=r"no column 'fruit'.*'user', 'colour'"):
        Population.from_csv_column(missing, "fruit")
    empty = write(tmp_path, "fruit\napple\n\npear\n \n", "b.csv")
    with pytest.raises(PopulationError, match="line 5: column 'fruit' is empty"):
        Population.from_csv_column(empty, "fruit")
    outside = write(tmp_path, "fruit\napple\nkiwi\n", "c.csv")
    with pytest.raises(PopulationError, match=r"line 3: .* not one of the 2 labels") as caught:
        Population.from_csv_column(outside, "fruit", labels=["apple", "pear"])
    assert "kiwi" not in caught.value.message  # data values are never echoed
    with pytest.raises(PopulationError, match="cannot read"):
        Population.from_csv_column(tmp_path / "absent.csv", "fruit")
    header_only = write(tmp_path, "fruit\n", "d.csv")
    with pytest.raises(PopulationError, match="no data rows"):
        Population.from_csv_column(header_only, "fruit")


def test_csv_points_land_in_their_cells(tmp_path):
    rows = [(48.101, 11.501), (48.129, 11.539), (48.115, 11.52)]
    path = write(
        tmp_path, "id,lat,lon\n" + "".join(f"{i},{a},{o}\n" for i, (a, o) in enumerate(rows))
    )
    population = Population.from_csv_points(path, GRID)
    assert population.labels == cell_labels(GRID)
    assert list(population.rows) == [GRID.cell_of(a, o) for a, o in rows]
    assert math.isclose(population.probabilities.sum(), 1.0)
    values = population.client_values(np.arange(3), np.random.default_rng(0), as_location=True)
    assert values == [{"lat": a, "lon": o} for a, o in rows]


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("latitude,lon\n48.11,11.52\n", r"no column 'lat'.*'latitude', 'lon'"),
        ("lat,lon\n48.11,11.52\n48.12,east\n", r"line 3: column 'lon' is not a number"),
        ("lat,lon\n48.11,11.52\nnan,11.52\n", r"line 3: column 'lat' is not a finite coordinate"),
        ("lat,lon\n48.11,11.52\n95,11.52\n", r"line 3: column 'lat' is not a finite coordinate"),
        (
            "lat,lon\n48.11,11.52\n48.2,11.52\n48.3,11.52\n",
            r"line 3: the point is outside the region.*2 of 3",
        ),
        ("lat,lon\n48.11,11.52,7\n", r"line 2: expected 2 fields"),
        ("lat,lon\n48.11\n", r"line 2: expected 2 fields"),
    ],
)
def test_csv_points_errors_name_line_and_column(tmp_path, body, pattern):
    path = write(tmp_path, body)
    with pytest.raises(PopulationError, match=pattern) as caught:
        Population.from_csv_points(path, GRID)
    assert "48.2" not in caught.value.message and "east" not in caught.value.message


def test_csv_points_without_a_grid_take_their_bounding_box(tmp_path):
    path = write(tmp_path, "lat,lon\n48.10,11.50\n48.12,11.53\n")
    population = Population.from_csv_points(path, cell_size_m=500.0)
    assert population.grid.region == Region(48.10, 48.12, 11.50, 11.53)
    with pytest.raises(PopulationError, match="cell size"):
        Population.from_csv_points(path)


def test_clustered_city_is_a_seeded_clustered_distribution():
    city = Population.clustered_city(GRID, hotspots=3, background=0.1, seed=4)
    again = Population.clustered_city(GRID, hotspots=3, background=0.1, seed=4)
    other = Population.clustered_city(GRID, hotspots=3, background=0.1, seed=5)
    assert np.array_equal(city.probabilities, again.probabilities)
    assert not np.allclose(city.probabilities, other.probabilities)
    assert math.isclose(city.probabilities.sum(), 1.0)
    # The background alone gives every cell a share; hotspots concentrate the rest.
    assert city.probabilities.min() > 0
    assert city.probabilities.max() > 5 / GRID.n_cells
    assert city.size == GRID.n_cells


def test_index_chunks_are_bounded_and_follow_the_distribution():
    population = Population.zipf(20, 1.0)
    generator = np.random.default_rng(11)
    n = 400_000
    chunks = list(population.index_chunks(n, generator, chunk_size=64_000))
    assert max(c.size for c in chunks) <= 64_000
    counts = np.bincount(np.concatenate(chunks), minlength=20)
    assert counts.sum() == n
    # Multinomial counts: each within 5 standard deviations of its expectation.
    expected = n * population.probabilities
    sd = np.sqrt(n * population.probabilities * (1 - population.probabilities))
    assert np.all(np.abs(counts - expected) < 5 * sd)


def test_a_data_set_is_resampled_when_n_differs(tmp_path):
    path = write(tmp_path, "fruit\n" + "apple\n" * 3 + "pear\n")
    population = Population.from_csv_column(path, "fruit")
    chunks = list(population.index_chunks(100_000, np.random.default_rng(2), chunk_size=30_000))
    counts = np.bincount(np.concatenate(chunks), minlength=2)
    assert counts.sum() == 100_000
    assert abs(counts[0] / 100_000 - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 100_000)


def test_client_values_of_a_distribution_fall_in_the_users_cells():
    city = Population.clustered_city(GRID, hotspots=2, seed=1)
    generator = np.random.default_rng(3)
    users = city.draw_users(500, generator)
    values = city.client_values(users, generator, as_location=True)
    for index, value in zip(city.indices_of(users), values, strict=True):
        assert REGION.contains(value["lat"], value["lon"])
        assert GRID.cell_of(value["lat"], value["lon"]) == index
    labels = city.client_values(users[:3], generator, as_location=False)
    assert labels == [f"r{i // GRID.cols}c{i % GRID.cols}" for i in users[:3]]


def test_a_distribution_needs_n():
    with pytest.raises(PopulationError, match="number of users"):
        Population.uniform(3).draw_users(None, np.random.default_rng(0))

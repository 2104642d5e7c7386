"""A region's mechanisms ranked by simulation: the draws follow each channel, the ranking holds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.estimation import channel_for
from aggregator.estimation.region_advice import (
    _candidates,
    clustered_city,
    draw_reports,
    rank_grid,
    simulation_grid,
)
from shared.geo import Grid, Region

REGION = Region(lat_min=37.77, lat_max=37.78, lon_min=-122.42, lon_max=-122.41)


@pytest.mark.parametrize("epsilon", [0.005, 0.02])
def test_report_counts_follow_each_channel(epsilon):
    """10^7 users' reports drawn cell by cell: every output's count within 5 standard errors of
    its expectation under the channel (a binomial's), for every mechanism ranked."""
    grid = Grid(REGION, 200.0)
    users = np.random.default_rng(1).multinomial(10**7, clustered_city(grid, seed=3))
    generator = np.random.default_rng(2)
    names = []
    for name, mechanism, _, _ in _candidates(grid, epsilon, grid.n_cells):
        channel = channel_for(mechanism)
        counts = draw_reports(channel, users, generator)
        assert counts.shape == (channel.n_outputs,)
        assert counts.sum() == users.sum()
        expected = channel.forward(users / users.sum()) * users.sum()
        share = expected / users.sum()
        bound = 5 * np.sqrt(users.sum() * share * (1 - share)) + 1e-9
        assert np.all(np.abs(counts - expected) <= bound), name
        names.append(name)
    assert {"planar_laplace", "krr", "exponential_grid"} <= set(names)


def test_olh_over_many_cells_is_ranked_even_when_few_outputs_are_seen():
    """Ten users leave most of OLH's outputs unseen; the counts still cover every output."""
    grid = Grid(
        Region(lat_min=37.7723373, lat_max=37.7993168, lon_min=-122.4233913, lon_max=-122.3892533),
        150.0,
    )
    ranking = rank_grid(grid, math.log(16) / 150, 10)
    assert "olh" in [option.mechanism for option in ranking]


def test_olh_is_left_out_where_krr_is_better_by_the_closed_forms():
    """30 cells at 20 per cell (far fewer cells than 3 e^20 + 2): OLH is not simulated."""
    grid = Grid(REGION, 200.0)
    assert [name for name, *_ in _candidates(grid, 0.1, grid.n_cells)] == [
        "planar_laplace",
        "krr",
    ]
    assert "olh" in [name for name, *_ in _candidates(grid, 0.005, grid.n_cells)]


def test_a_large_grid_is_simulated_on_its_south_west_window():
    grid = Grid(REGION, 20.0)
    window = simulation_grid(grid)
    assert (window.rows, window.cols) == (24, 24) < (grid.rows, grid.cols)
    ranking = rank_grid(grid, 0.01, 1_000, trials=1)
    assert all("24 x 24-cell window" in option.basis for option in ranking)


def test_the_ranking_is_seeded_and_a_billion_users_are_drawn_and_estimated_closely():
    grid = Grid(REGION, 200.0)
    first = [o.to_dict() for o in rank_grid(grid, 0.01, 10**4)]
    assert [o.to_dict() for o in rank_grid(grid, 0.01, 10**4)] == first
    many = rank_grid(grid, 0.01, 10**9)
    assert all(o.expected_emd_m is not None and o.expected_emd_m < 5 for o in many)

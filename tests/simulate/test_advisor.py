"""The advisor's closed forms against Monte Carlo of the real samplers, and ``ldp-simulate advise``.

Each measured figure is the mean over ``TRIALS`` draws of ``||f_hat - f||^2``
(the unbiased inversion against the users' own distribution), with fixed
seeds; with 4,000 draws its standard error is at most 2.3% of the mean (a
draw's relative sd is at most sqrt(2), at k = 2), so the 10% bound is more
than 4 standard errors.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from click.testing import CliRunner

from aggregator.estimation import channel_for
from aggregator.estimation.advice import (
    OLH,
    OUE,
    crossover_k,
    geometric_mse,
    oracle_mse,
    rank_categorical,
    rank_range,
)
from aggregator.estimation.oracles import HadamardChannel
from scripts.advisor_crossover import USERS, sampled_mse, support_count_mse
from shared.mechanisms import KRR, Geometric, HadamardResponse
from shared.oracles import OLH as OLHMechanism
from shared.oracles import hash_range
from shared.spec import GEOMETRIC, RR
from simulate.cli import main
from simulate.sampling import sample

TRIALS = 4000
TOLERANCE = 0.10


def labels(k: int) -> list[str]:
    return [f"v{i}" for i in range(k)]


CASES = [(1.0, 2), (1.0, 10), (2.0, 21), (2.0, 60), (4.0, 135), (0.5, 7)]


@pytest.mark.parametrize(("epsilon", "k"), CASES)
def test_krr_closed_form_matches_the_sampler_within_10_percent(epsilon, k):
    mechanism = KRR(epsilon=epsilon, domain=labels(k))
    measured = sampled_mse(mechanism, channel_for(mechanism), k, TRIALS, k)
    expected = oracle_mse("krr", k, epsilon, USERS)
    assert measured == pytest.approx(expected, rel=TOLERANCE)


@pytest.mark.parametrize(("epsilon", "k"), CASES)
def test_hadamard_closed_form_matches_the_sampler_within_10_percent(epsilon, k):
    mechanism = HadamardResponse(epsilon=epsilon, domain=labels(k))
    measured = sampled_mse(mechanism, HadamardChannel(mechanism), k, TRIALS, k)
    expected = oracle_mse("hadamard_response", k, epsilon, USERS)
    assert measured == pytest.approx(expected, rel=TOLERANCE)


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
def test_the_krr_hadamard_crossover_is_where_the_measured_errors_cross(epsilon):
    """Half the crossover k, k-RR measures better; at twice it, Hadamard response does."""
    crossover = crossover_k(epsilon, "hadamard_response")
    assert oracle_mse("krr", crossover - 1, epsilon, 1) <= oracle_mse(
        "hadamard_response", crossover - 1, epsilon, 1
    )
    for k, krr_wins in ((max(2, crossover // 2), True), (2 * crossover, False)):
        krr = KRR(epsilon=epsilon, domain=labels(k))
        hadamard = HadamardResponse(epsilon=epsilon, domain=labels(k))
        krr_error = sampled_mse(krr, channel_for(krr), k, TRIALS, k)
        hadamard_error = sampled_mse(hadamard, HadamardChannel(hadamard), k, TRIALS, k)
        assert (krr_error < hadamard_error) is krr_wins, (k, krr_error, hadamard_error)


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
def test_krr_against_oue_and_olh_crosses_near_3e_plus_2(epsilon):
    """The exact crossover is at or below Wang et al.'s 3e^eps + 2 (which drops the f_v term)
    and the reference simulations of the support counts agree with the closed forms."""
    e = math.exp(epsilon)
    crossover = crossover_k(epsilon, OUE)
    assert 0.75 * (3 * e + 2) <= crossover <= 3 * e + 2 + 1
    assert crossover_k(epsilon, OLH) == pytest.approx(crossover, abs=2)
    for k in (crossover, 2 * crossover):
        oue = support_count_mse(0.5, 1 / (e + 1), k, TRIALS, k)
        assert oue == pytest.approx(oracle_mse(OUE, k, epsilon, USERS), rel=TOLERANCE)
        g = hash_range(epsilon)
        olh = support_count_mse(e / (e + g - 1), 1 / g, k, TRIALS, k)
        assert olh == pytest.approx(oracle_mse(OLH, k, epsilon, USERS), rel=TOLERANCE)


def test_olh_closed_form_matches_its_sampler_within_10_percent():
    epsilon, k = 2.0, 30
    mechanism = OLHMechanism(epsilon=epsilon, domain=labels(k))
    measured = sampled_mse(mechanism, channel_for(mechanism), k, TRIALS, k)
    assert measured == pytest.approx(oracle_mse(OLH, k, epsilon, USERS), rel=TOLERANCE)


@pytest.mark.parametrize(("epsilon", "m"), [(0.5, 20), (1.0, 50)])
def test_geometric_closed_form_matches_the_sampler_within_10_percent(epsilon, m):
    mechanism = Geometric(epsilon=epsilon, lo=0, hi=m - 1)
    x = np.arange(USERS) % m  # uniform users, as the closed form assumes by default
    truth = np.bincount(x, minlength=m) / USERS
    generator = np.random.default_rng(m)
    channel = channel_for(mechanism)
    errors = []
    for _ in range(1000):
        q = np.bincount(sample(mechanism, x, generator), minlength=m) / USERS
        errors.append(np.sum((channel.solve(q) - truth) ** 2))
    assert float(np.mean(errors)) == pytest.approx(
        geometric_mse(m, epsilon, USERS, truth), rel=TOLERANCE
    )


def test_rankings_best_first_with_hosting_flags():
    ranking = rank_categorical(2, 1.0, 1000)
    assert ranking[0].mechanism == RR and ranking[0].hosted
    assert [o.expected_mse for o in ranking] == sorted(o.expected_mse for o in ranking)
    large = rank_categorical(1000, 1.0, 1000)
    assert large[0].mechanism in (OUE, OLH)
    assert not large[0].hosted
    assert rank_range(0, 99, 0.5, 1000)[0].mechanism == GEOMETRIC


def invoke(*args: str):
    return CliRunner().invoke(main, ["advise", *args], catch_exceptions=False)


def test_advise_json_lists_every_mechanism_best_first():
    result = invoke("--domain-size", "8", "--epsilon", "1", "--users", "1e4", "--json")
    assert result.exit_code == 0, result.output
    ranking = json.loads(result.output)
    assert ranking[0]["mechanism"] == "krr"
    assert {o["mechanism"] for o in ranking} == {"krr", OUE, OLH, "hadamard_response"}
    assert all(o["basis"] == "closed form" and o["expected_mse"] > 0 for o in ranking)
    mse = [o["expected_mse"] for o in ranking]
    assert mse == sorted(mse)


def test_advise_table_and_errors():
    table = invoke("--lo", "0", "--hi", "99", "--epsilon", "0.5", "--users", "1e4")
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[1].split()[1] == GEOMETRIC
    assert "recommended: geometric" in table.output
    none = invoke("--epsilon", "1", "--users", "100")
    assert none.exit_code == 1 and "give one domain" in none.output
    both = invoke("--domain-size", "4", "--lo", "0", "--hi", "3", "-e", "1", "-n", "100")
    assert both.exit_code == 1 and "domain size and range" in both.output
    huge = invoke("--lo", "0", "--hi", str(10**9), "-e", "1", "-n", "100")
    assert huge.exit_code == 1 and "at most 10,000,000" in huge.output


def test_advise_region_simulates_emd_within_its_time_budget():
    started = time.perf_counter()
    result = invoke(
        "--region",
        "37.77,37.79,-122.43,-122.41",
        "--cell-size-m",
        "150",
        "--epsilon",
        "ln(2)/100",
        "--users",
        "1e4",
        "--json",
    )
    assert result.exit_code == 0, result.output
    ranking = json.loads(result.output)
    names = [o["mechanism"] for o in ranking]
    # Planar Laplace and the exponential mechanism, Manhattan and Euclidean, are close (within
    # 15% here).
    assert names[:3].count("exponential_grid") == 2 and "planar_laplace" in names[:3]
    assert {o.get("metric") for o in ranking[:3]} >= {"manhattan", "euclidean"}
    assert ranking[2]["expected_emd_m"] < 1.15 * ranking[0]["expected_emd_m"]
    assert all(o["basis"].startswith("simulation, 2 trials") for o in ranking)
    emd = [o["expected_emd_m"] for o in ranking]
    assert emd == sorted(emd)
    # k-RR and OLH over the cells at epsilon * cell move mass across the whole region; both
    # are hosted over a region's cells.
    assert {o["mechanism"] for o in ranking[-2:]} == {"krr", "olh"} and emd[-2] > 5 * emd[0]
    assert all(o["hosted"] for o in ranking)
    assert time.perf_counter() - started < 10  # 2 s unloaded; 2 cores shared here

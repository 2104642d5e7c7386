"""The in-process simulation: seeded runs against theory, the sampler against the channel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from aggregator.estimation import channel_for
from shared.geo import Grid, Region
from shared.mechanisms import KRR, Mechanism, PlanarLaplace
from shared.spec import CampaignSpec
from simulate.populations import Population, PopulationError, cell_labels
from simulate.runner import (
    ALL_METHODS,
    check_compatible,
    estimate_methods,
    perturb,
    simulate,
)

# 20 x 20 cells of 150 m, as in the reproduction of the IBU literature.
CITY_GRID = Grid(Region(48.10, 48.1269, 11.50, 11.5403), 150.0)


def krr_spec(population: Population, epsilon: float, mechanism: str = "krr") -> CampaignSpec:
    return CampaignSpec.from_dict(
        {
            "id": "sim",
            "title": "Simulation",
            "mechanism": mechanism,
            "epsilon": epsilon,
            "domain": list(population.labels),
        }
    )


def closed_form_inversion_mse(mechanism: KRR, probabilities: np.ndarray, n: int) -> float:
    """Mean over categories of Var(p_hat_x) = q_x (1 - q_x) / (n (p - q)^2), q = pi C."""
    p, q = mechanism.p_keep, mechanism.p_other
    expected_reports = (p - q) * probabilities + q
    return float(np.mean(expected_reports * (1 - expected_reports) / (n * (p - q) ** 2)))


def inversion_mse(population, mechanism, n, repeats, seed=0) -> float:
    """Mean over repeats of the inversion estimate's MSE against the population distribution."""
    channel = channel_for(mechanism)
    errors = []
    for r in range(repeats):
        _, reports = perturb(
            population,
            mechanism,
            n,
            np.random.default_rng([seed, r]),
            np.random.default_rng([seed, r, 1]),
            progress=False,
        )
        estimate = estimate_methods(reports, mechanism, ["inversion"], channel=channel)[
            "inversion"
        ].frequencies
        errors.append(np.mean((estimate - population.probabilities) ** 2))
    return float(np.mean(errors))


@pytest.mark.parametrize(
    ("k", "epsilon", "name"), [(20, 1.0, "krr"), (8, 2.0, "krr"), (2, 0.5, "rr")]
)
def test_krr_inversion_mse_is_within_20_percent_of_its_closed_form(k, epsilon, name):
    # 40 runs of n = 10^5: the relative sd of the averaged MSE is about sqrt(2 / (40 k)),
    # at most 11% (k = 2), so a 20% band holds while a 20% error in the formula would not.
    population = (
        Population.zipf(k, 1.1) if k > 2 else Population.from_weights([0.3, 0.7], ["no", "yes"])
    )
    mechanism = Mechanism.from_spec(krr_spec(population, epsilon, name))
    n = 100_000
    observed = inversion_mse(population, mechanism, n, repeats=40)
    theory = closed_form_inversion_mse(mechanism, population.probabilities, n)
    assert abs(observed / theory - 1) < 0.20, (observed, theory)
    # The bound discriminates: the same runs are far from the figure of a 1.3x larger epsilon.
    other = Mechanism.from_spec(krr_spec(population, epsilon * 1.3, name))
    assert abs(observed / closed_form_inversion_mse(other, population.probabilities, n) - 1) > 0.20


def chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test, with the cells expecting fewer than 5 reports pooled into one."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    statistic = float(np.sum((obs - exp) ** 2 / exp))
    return float(scipy.stats.chi2.sf(statistic, obs.size - 1))


@pytest.mark.parametrize("kind", ["planar", "krr"])
def test_chunked_perturbation_follows_the_channel(kind):
    """Reports given the users' true counts are multinomial with mean (true counts) C."""
    city = Population.clustered_city(CITY_GRID, hotspots=4, seed=2)
    if kind == "planar":
        mechanism = PlanarLaplace(epsilon=math.log(2) / 100, grid=CITY_GRID)
    else:
        mechanism = KRR(epsilon=math.log(8), domain=cell_labels(CITY_GRID))
    true_counts, reports = perturb(
        city,
        mechanism,
        300_000,
        np.random.default_rng(1),
        np.random.default_rng(2),
        chunk_size=70_000,
        progress=False,
    )
    assert true_counts.sum() == reports.sum() == 300_000
    expected = channel_for(mechanism).forward(true_counts.astype(float))
    # Fixed seeds: a deterministic check; a misaligned chunk or channel would give p ~ 0.
    assert chi_square_p_value(reports, expected) > 1e-3


def test_ten_million_users_in_process():
    population = Population.zipf(50, 1.1)
    mechanism = Mechanism.from_spec(krr_spec(population, 1.0))
    n = 10_000_000
    true_counts, reports = perturb(
        population, mechanism, n, np.random.default_rng(0), np.random.default_rng(1), progress=False
    )
    assert true_counts.sum() == reports.sum() == n
    estimate = estimate_methods(reports, mechanism, ["inversion"])["inversion"]
    sd = math.sqrt(closed_form_inversion_mse(mechanism, population.probabilities, n) * 50)
    # Every frequency within 5 standard deviations of the largest one's (about 1e-3).
    assert np.max(np.abs(estimate.frequencies - population.probabilities)) < 5 * sd


def test_ibu_deconvolves_planar_laplace_reports():
    city = Population.clustered_city(CITY_GRID, hotspots=5, seed=3)
    spec = CampaignSpec.from_dict(
        {
            "id": "city",
            "title": "City",
            "mechanism": "planar_laplace",
            "epsilon": math.log(2) / 100,
            "region": CITY_GRID.region.to_dict(),
            "cell_size_m": 150.0,
        }
    )
    result = simulate(city, [spec], [50_000], methods=["ibu", "noisy"], progress=False)
    scores = {row.method: row.scores for row in result.rows}
    assert scores["ibu"].emd_m < 0.7 * scores["noisy"].emd_m
    assert scores["ibu"].tv < scores["noisy"].tv
    assert scores["ibu"].kl is not None


def test_a_sweep_gives_one_row_per_configuration_and_is_reproducible():
    population = Population.zipf(10, 1.2)
    specs = [krr_spec(population, e) for e in (0.5, 2.0)]
    run = simulate(population, specs, [1000, 100_000], repeats=3, seed=7, progress=False)
    again = simulate(population, specs, [1000, 100_000], repeats=3, seed=7, progress=False)
    other = simulate(population, specs, [1000, 100_000], repeats=3, seed=8, progress=False)
    # Every method: k-RR takes them all.
    # Every method but the smoothing over a region's cells, which labels do not have.
    assert len(run.rows) == 2 * 2 * (len(ALL_METHODS) - 1)
    assert [r.to_dict() for r in run.rows] == [
        {**r.to_dict(), "seconds": a.seconds} for r, a in zip(again.rows, run.rows, strict=True)
    ]
    assert run.rows[0].scores.tv != other.rows[0].scores.tv
    assert len(run.snapshots) == 4
    tv = {(r.epsilon, r.n, r.method): r.scores.tv for r in run.rows}
    for epsilon in (0.5, 2.0):
        # More users, smaller error; a larger epsilon, smaller error.
        assert tv[(epsilon, 100_000, "inversion")] < tv[(epsilon, 1000, "inversion")]
    assert tv[(2.0, 100_000, "inversion")] < tv[(0.5, 100_000, "inversion")]
    # The uncorrected histogram is biased: it does not improve with n as the estimators do.
    assert tv[(0.5, 100_000, "noisy")] > 3 * tv[(0.5, 100_000, "ibu")]


def test_population_and_campaign_must_match():
    city = Population.clustered_city(CITY_GRID, seed=0)
    zipf = Population.zipf(4)
    with pytest.raises(PopulationError, match="location population"):
        check_compatible(zipf, PlanarLaplace(epsilon=0.01, grid=CITY_GRID))
    with pytest.raises(PopulationError, match="5 labels, the population 4"):
        check_compatible(zipf, KRR(epsilon=1.0, domain=list("abcde")))
    with pytest.raises(PopulationError, match="domain"):
        check_compatible(zipf, KRR(epsilon=1.0, domain=list("abcd")))
    check_compatible(city, KRR(epsilon=1.0, domain=cell_labels(CITY_GRID)))


def test_the_package_re_exports_its_public_names():
    import simulate as package

    assert sorted(package.__all__) == [
        "ALL_METHODS",
        "Population",
        "PopulationError",
        "Scores",
        "SimulationError",
        "SimulationResult",
        "ViaResult",
        "run_via_server",
        "score",
        "simulate",
    ]
    assert all(hasattr(package, name) for name in package.__all__)


def test_a_missing_extra_is_named():
    from simulate import EXTRA_MODULES, missing_modules

    assert missing_modules() == []
    assert missing_modules((*EXTRA_MODULES, "no_such_module_for_ldp")) == ["no_such_module_for_ldp"]

"""A geometric campaign through the API: its spec, its reports, its estimate."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest
from aggregator_testdata import GEOMETRIC_SPEC, KRR_SPEC, new_id

from aggregator.estimation import IBU, channel_for, estimate, ibu
from aggregator.estimation.ibu import IBUSteps, _Folds, held_out_folds
from aggregator.estimation.intervals import REFERENCE_MAX_STEPS, confidence_interval
from aggregator.estimation.ordinal import GeometricChannel
from shared.mechanisms import Geometric, Mechanism
from shared.spec import MAX_GEOMETRIC_EPSILON, MAX_RANGE_VALUES, CampaignSpec
from simulate.sampling import sample

CAMPAIGNS = "/api/v1/campaigns"
REPORTS = f"{CAMPAIGNS}/age/reports"


@pytest.fixture
def geometric_campaign(client, admin):
    response = client.post(CAMPAIGNS, json=GEOMETRIC_SPEC, headers=admin)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_a_geometric_campaign_is_served_with_its_range(client, geometric_campaign):
    served = client.get(f"{CAMPAIGNS}/age").get_json()
    assert (served["mechanism"], served["lo"], served["hi"]) == ("geometric", 0, 120)
    spec, _ = CampaignSpec.from_wire(served)
    assert spec.spec_hash == served["spec_hash"]
    mechanism = Mechanism.from_spec(spec)
    assert isinstance(mechanism, Geometric)
    assert (mechanism.lo, mechanism.hi, mechanism.epsilon) == (0, 120, 0.5)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lo": 120}, "lo"),
        ({"lo": 121}, "lo"),
        ({"hi": MAX_RANGE_VALUES}, "hi"),
        ({"lo": 1.5}, "lo"),
        ({"hi": "120"}, "hi"),
        ({"hi": True}, "hi"),
        ({"lo": None}, "lo"),
        ({"epsilon": MAX_GEOMETRIC_EPSILON * 1.01}, "epsilon"),
        ({"epsilon": 0}, "epsilon"),
        ({"domain": ["a", "b"]}, "domain"),
        ({"cell_size_m": 100}, "cell_size_m"),
    ],
)
def test_a_bad_geometric_spec_is_a_4xx_naming_the_field(client, admin, change, field):
    response = client.post(CAMPAIGNS, json={**GEOMETRIC_SPEC, **change}, headers=admin)
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == field


@pytest.mark.parametrize("missing", ["lo", "hi", "epsilon"])
def test_a_geometric_spec_needs_its_range_and_epsilon(client, admin, missing):
    spec = {key: value for key, value in GEOMETRIC_SPEC.items() if key != missing}
    response = client.post(CAMPAIGNS, json=spec, headers=admin)
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == missing


def test_the_range_fields_belong_to_geometric_only(client, admin):
    response = client.post(CAMPAIGNS, json={**KRR_SPEC, "lo": 0}, headers=admin)
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == "lo"


def test_the_largest_range_is_accepted(client, admin):
    spec = {**GEOMETRIC_SPEC, "lo": -50_000, "hi": -50_000 + MAX_RANGE_VALUES - 1}
    assert client.post(CAMPAIGNS, json=spec, headers=admin).status_code == 201


@pytest.mark.parametrize("value", [-1, 121, "42", 42.0, True, None, {"lat": 1, "lon": 2}])
def test_a_report_outside_the_range_or_not_an_integer_is_refused(client, geometric_campaign, value):
    response = client.post(REPORTS, json={"report_id": new_id(), "value": value})
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == "value"


def test_the_inversion_is_the_banded_closed_form_on_the_stored_counts(
    client, analyst, geometric_campaign
):
    values = [0] * 30 + [1] * 10 + [60] * 50 + [119] * 5 + [120] * 25
    body = {"reports": [{"report_id": new_id(), "value": v} for v in values]}
    assert client.post(REPORTS, json=body).status_code == 200
    served = client.get(f"{CAMPAIGNS}/age/estimate?method=inversion", headers=analyst).get_json()
    assert served["method"] == "inversion"
    assert served["range"] == {"lo": 0, "hi": 120}
    assert [row["label"] for row in served["estimates"]] == [str(v) for v in range(121)]
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(GEOMETRIC_SPEC))
    counts = np.bincount(values, minlength=121)
    expected = np.linalg.solve(channel_for(mechanism).to_dense().T, counts / counts.sum())
    got = np.array([row["frequency"] for row in served["estimates"]])
    np.testing.assert_allclose(got, expected, atol=1e-9)
    raw = np.array([row["raw_frequency"] for row in served["estimates"]])
    np.testing.assert_allclose(raw, counts / counts.sum())


def test_ibu_recovers_ages_perturbed_on_the_device(client, analyst, geometric_campaign):
    """2000 users perturbed by the exact sampler; mean age within 1.5 years (about 4 sd)."""
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(GEOMETRIC_SPEC))
    rng = random.Random(20251125)
    ages = [min(120, max(0, round(rng.gauss(40, 12)))) for _ in range(2000)]
    reports = [mechanism.perturb(age, rng) for age in ages]
    for start in range(0, len(reports), 500):
        chunk = reports[start : start + 500]
        body = {"reports": [{"report_id": new_id(), "value": v} for v in chunk]}
        assert client.post(REPORTS, json=body).status_code == 200
    for method in ("ibu", "projection"):
        served = client.get(f"{CAMPAIGNS}/age/estimate?method={method}", headers=analyst)
        rows = served.get_json()["estimates"]
        frequencies = np.array([row["frequency"] for row in rows])
        assert abs(frequencies.sum() - 1) < 1e-9
        mean = float(frequencies @ np.arange(121))
        assert abs(mean - np.mean(ages)) < 1.5, (method, mean)
        assert all(row["ci_low"] <= row["frequency"] <= row["ci_high"] for row in rows)


def test_the_channel_is_an_operator_with_an_exact_inverse():
    mechanism = Geometric(epsilon=0.3, lo=-3, hi=5)
    channel = channel_for(mechanism)
    assert isinstance(channel, GeometricChannel)
    dense = channel.to_dense()
    q = np.random.default_rng(3).dirichlet(np.ones(9))
    np.testing.assert_allclose(channel.solve(q), np.linalg.solve(dense.T, q), atol=1e-12)
    inverse = np.linalg.inv(dense)
    np.testing.assert_allclose(
        channel.inversion_second_moment(q), (inverse**2).T @ q, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("values", [2, 3, 9, 40])
def test_the_report_variance_is_the_mechanism_noise_of_each_count(values):
    """``report_variance(p)``: each report count's variance per user with the users' values at
    shares ``p``, ``sum_x p_x C[x, y] (1 - C[x, y])``, from the squared channel in O(m)."""
    mechanism = Geometric(epsilon=0.7, lo=0, hi=values - 1)
    channel = channel_for(mechanism)
    dense = channel.to_dense()
    p = np.random.default_rng(values).dirichlet(np.ones(values))
    np.testing.assert_allclose(
        channel.report_variance(p), p @ (dense * (1 - dense)), rtol=1e-12, atol=1e-15
    )


def _estimate_a_range_of_100000_values(method: str) -> None:
    """No m x m matrix: 200,000 reports over 10^5 values, with intervals, in little memory.

    A dense channel would take 80 GB; the O(m) operators' estimate with intervals stays within
    a few hundred bytes per value. (Its time is measured by scripts/bench_geometric.py.)
    """
    m = MAX_RANGE_VALUES
    mechanism = Geometric(epsilon=0.5, lo=0, hi=m - 1)
    generator = np.random.default_rng(11)
    truth = generator.integers(40_000, 40_100, size=200_000)
    counts = np.bincount(sample(mechanism, truth, generator), minlength=m)
    tracemalloc.start()
    try:
        result = estimate(mechanism, counts, method=method)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000 * m, (method, peak)
    assert result.frequencies.shape == (m,)
    inside = result.frequencies[40_000:40_100].sum()
    assert inside > 0.95, (method, inside)
    assert np.all(result.ci_low <= result.ci_high)


def test_a_range_of_100000_values_is_inverted_without_a_dense_matrix():
    _estimate_a_range_of_100000_values("inversion")


@pytest.mark.slow
def test_a_range_of_100000_values_is_estimated_by_ibu_without_a_dense_matrix():
    """IBU's two cross-validated runs, their bootstrap and the reference fit, on O(m) steps."""
    _estimate_a_range_of_100000_values("ibu")


def test_the_folds_and_the_refits_run_side_by_side_with_the_same_results(monkeypatch):
    """The geometric channel's products act on every row of a matrix, so cross-validation's
    ten folds, the bootstrap's 16 refits and the raw-share weight's replays each take one
    product per step for all their rows. Counts no setting of the mechanism makes likely
    (reports piled on a few values at 0.01 per unit) ran IBU thousands of steps one row at a
    time: 13 s for 11 values (2 s side by side)."""
    mechanism = Geometric(epsilon=0.01, lo=0, hi=10)
    channel = channel_for(mechanism)
    generator = np.random.default_rng(1)
    counts = generator.multinomial(1000, generator.dirichlet(np.full(11, 0.1))).astype(float)
    fitted = IBU().fit(counts, channel)
    steps = fitted.n_iter_
    assert steps > 1000  # the case that was slow
    products = 0
    forward = GeometricChannel.forward

    def counted(self, p):
        nonlocal products
        products += 1
        return forward(self, p)

    monkeypatch.setattr(GeometricChannel, "forward", counted)
    result = estimate(mechanism, counts, method="ibu")
    monkeypatch.undo()
    np.testing.assert_array_equal(result.frequencies, fitted.frequencies_)
    # One product per step of the fit, of the refits and of the 10-fold and 2-fold folds
    # (which run on past the chosen counts by at most a quarter of them), and of the reference
    # fit and its noise (at most 2,000 steps each); one row at a time it took 29 per step.
    assert products < 5 * steps + 2 * REFERENCE_MAX_STEPS, (products, steps)

    # Side by side as one at a time: the folds' steps, the replays and the intervals.
    train = counts - held_out_folds(counts, 10, 0)
    together = _Folds(channel, train)
    assert together._batch is not None
    together.advance(50)
    for row, fold in zip(together.predicted(), train, strict=True):
        apart = IBUSteps(channel, fold)
        apart.advance(50, 0.0)
        np.testing.assert_allclose(row, apart.predicted, rtol=1e-13)
    redrawn = generator.multinomial(1000, np.full(11, 1 / 11), size=4).astype(float)
    rows = fitted.replay(redrawn, channel)
    for row, again in zip(redrawn, rows, strict=True):
        np.testing.assert_allclose(fitted.replay(row, channel), again, rtol=1e-12)
    # A wide range steps fewer rows side by side (memory), with the same results.
    monkeypatch.setattr(ibu, "SIDE_BY_SIDE_VALUES", 3 * 11)
    np.testing.assert_array_equal(fitted.replay(redrawn, channel), rows)
    monkeypatch.undo()

    def refit(redraws: np.ndarray) -> np.ndarray:
        return fitted.replay(redraws, channel)

    bounds = [
        confidence_interval(
            counts, channel, fitted.frequencies_, 0.95, refit=refit, refit_rows=side_by_side
        )
        for side_by_side in (True, False)
    ]
    np.testing.assert_allclose(bounds[0].low, bounds[1].low, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(bounds[0].high, bounds[1].high, rtol=1e-12, atol=1e-15)

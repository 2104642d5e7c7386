"""An exponential_grid campaign through the API: its spec, its reports, its estimate."""

from __future__ import annotations

import random

import numpy as np
import pytest
from aggregator_testdata import GRID_SPEC, KRR_SPEC, PLANAR_SPEC, create_campaign, new_id, submit

from aggregator.estimation import GridKernelChannel, ManhattanKernelChannel, channel_for
from shared.mechanisms import ExponentialGrid, Mechanism
from shared.spec import (
    MAX_GRID_STEP_EPSILON,
    MIN_GRID_STEP_EPSILON,
    CampaignSpec,
)

CAMPAIGNS = "/api/v1/campaigns"
REPORTS = f"{CAMPAIGNS}/block/reports"


@pytest.fixture
def grid_campaign(client, admin):
    return create_campaign(client, admin, GRID_SPEC)


def test_a_grid_campaign_is_served_with_its_metric(client, grid_campaign):
    served = client.get(f"{CAMPAIGNS}/block").get_json()
    assert (served["mechanism"], served["metric"]) == ("exponential_grid", "euclidean")
    spec, _ = CampaignSpec.from_wire(served)
    assert spec.spec_hash == served["spec_hash"]
    mechanism = Mechanism.from_spec(spec)
    assert isinstance(mechanism, ExponentialGrid)
    assert (mechanism.metric, mechanism.epsilon) == ("euclidean", 0.005)
    assert isinstance(channel_for(mechanism), GridKernelChannel)


def test_manhattan_is_the_default_and_is_left_out_of_the_canonical_form():
    implicit = {key: value for key, value in GRID_SPEC.items() if key != "metric"}
    explicit = {**GRID_SPEC, "metric": "manhattan"}
    spec = CampaignSpec.from_dict(implicit)
    assert spec.metric == "manhattan"
    assert "metric" not in spec.to_dict()
    assert spec.spec_hash == CampaignSpec.from_dict(explicit).spec_hash
    assert spec.spec_hash != CampaignSpec.from_dict(GRID_SPEC).spec_hash
    assert isinstance(channel_for(Mechanism.from_spec(spec)), ManhattanKernelChannel)


@pytest.mark.parametrize("field", ["privacy_level", "privacy_radius_m"])
def test_exponential_grid_takes_epsilon_not_a_privacy_level(client, admin, field):
    response = client.post(CAMPAIGNS, json={**GRID_SPEC, field: 1.0}, headers=admin)
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"metric": "chebyshev"}, "metric"),
        ({"metric": 1}, "metric"),
        ({"epsilon": MAX_GRID_STEP_EPSILON / 200 * 1.01}, "epsilon"),  # 200 m cells
        ({"epsilon": MIN_GRID_STEP_EPSILON / 200 * 0.99}, "epsilon"),
        ({"epsilon": 0}, "epsilon"),
        ({"domain": ["a", "b"]}, "domain"),
        ({"lo": 0}, "lo"),
        ({"cell_size_m": 0.5}, "cell_size_m"),
        ({"region": None}, "region"),
    ],
)
def test_a_bad_grid_spec_is_a_4xx_naming_the_field(client, admin, change, field):
    response = client.post(CAMPAIGNS, json={**GRID_SPEC, **change}, headers=admin)
    assert 400 <= response.status_code < 500, response.get_json()
    assert response.get_json()["error"]["field"] == field


@pytest.mark.parametrize("base", [KRR_SPEC, PLANAR_SPEC])
def test_metric_belongs_to_exponential_grid_only(client, admin, base):
    response = client.post(CAMPAIGNS, json={**base, "metric": "euclidean"}, headers=admin)
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == "metric"


@pytest.mark.parametrize("value", [{"lat": 37.7, "lon": -122.4}, {"lat": 1}, "r0c0", 3])
def test_a_report_that_is_no_cell_centre_is_refused(client, grid_campaign, value):
    response = client.post(REPORTS, json={"report_id": new_id(), "value": value})
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == "value"


def test_ibu_recovers_locations_perturbed_on_the_device(client, analyst, grid_campaign):
    """1,500 users in one corner cell and 1,500 in the middle, perturbed by the exact sampler:
    the default estimate puts most of each group's mass back within one cell of it."""
    spec = CampaignSpec.from_dict(GRID_SPEC)
    mechanism = Mechanism.from_spec(spec)
    grid = mechanism.grid
    rng = random.Random(20251126)
    corner = grid.to_latlon(*grid.centre_xy(0))
    middle_cell = (grid.rows // 2) * grid.cols + grid.cols // 2
    middle = grid.to_latlon(*grid.centre_xy(middle_cell))
    reports = [mechanism.perturb(corner, rng) for _ in range(1500)]
    reports += [mechanism.perturb(middle, rng) for _ in range(1500)]
    submit(client, "block", reports, chunk=1000)
    served = client.get(f"{CAMPAIGNS}/block/estimate", headers=analyst).get_json()
    assert served["grid"]["rows"] == grid.rows and served["grid"]["cols"] == grid.cols
    assert served["estimates"][0]["label"] == "r0c0"
    assert "raw_frequency" not in served["estimates"][0]
    cells = np.array(served["grid"]["cells"])
    assert cells.sum() == pytest.approx(1.0)
    near_corner = cells[:2, :2].sum()
    r, c = divmod(middle_cell, grid.cols)
    near_middle = cells[r - 1 : r + 2, c - 1 : c + 2].sum()
    assert near_corner > 0.4 and near_middle > 0.4, (near_corner, near_middle)
    rows = served["estimates"]
    assert all(row["ci_low"] <= row["frequency"] <= row["ci_high"] for row in rows)


def test_the_inversion_runs_on_both_metrics(client, admin, analyst):
    for metric in ("manhattan", "euclidean"):
        spec = {**GRID_SPEC, "id": f"block-{metric}", "metric": metric}
        assert client.post(CAMPAIGNS, json=spec, headers=admin).status_code == 201
        mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
        rng = random.Random(5)
        centre = mechanism.grid.to_latlon(*mechanism.grid.centre_xy(7))
        body = {
            "reports": [
                {"report_id": new_id(), "value": mechanism.perturb(centre, rng)} for _ in range(300)
            ]
        }
        assert client.post(f"{CAMPAIGNS}/block-{metric}/reports", json=body).status_code == 200
        served = client.get(
            f"{CAMPAIGNS}/block-{metric}/estimate?method=inversion", headers=analyst
        ).get_json()
        frequencies = np.array([row["frequency"] for row in served["estimates"]])
        assert frequencies.sum() == pytest.approx(1.0)
        assert served["method"] == "inversion"

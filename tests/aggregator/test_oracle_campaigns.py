"""OLH and Hadamard response campaigns through the API: spec, reports, estimate of the top values."""

from __future__ import annotations

import random

import numpy as np
import pytest
from aggregator_testdata import HADAMARD_SPEC, KRR_SPEC, OLH_SPEC, create_campaign, new_id, submit

from aggregator.http.estimates import ORACLE_TOP_ROWS, applicable_methods, not_applicable
from shared.mechanisms import HadamardResponse, Mechanism
from shared.oracles import OLH
from shared.spec import MAX_DOMAIN_SIZE, CampaignSpec

CAMPAIGNS = "/api/v1/campaigns"


@pytest.mark.parametrize(("spec", "kind"), [(OLH_SPEC, OLH), (HADAMARD_SPEC, HadamardResponse)])
def test_an_oracle_campaign_is_served_and_rebuilt_from_its_spec(client, admin, spec, kind):
    served = create_campaign(client, admin, spec)
    parsed, _ = CampaignSpec.from_wire(served)
    assert parsed.spec_hash == served["spec_hash"]
    mechanism = Mechanism.from_spec(parsed)
    assert isinstance(mechanism, kind)
    assert mechanism.k == (spec.get("domain_size") or len(spec["domain"]))


def test_oue_is_refused_naming_olh(client, admin):
    response = client.post(CAMPAIGNS, json={**OLH_SPEC, "mechanism": "oue"}, headers=admin)
    assert 400 <= response.status_code < 500
    error = response.get_json()["error"]
    assert error["field"] == "mechanism" and "olh" in error["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"domain": ["a", "b"]}, "domain"),  # both domain and domain_size
        ({"domain_size": None}, "domain_size"),
        ({"domain_size": MAX_DOMAIN_SIZE + 1}, "domain_size"),
        ({"domain_size": 1}, "domain_size"),
        ({"domain_size": 10.5}, "domain_size"),
        ({"domain_size": True}, "domain_size"),
        ({"epsilon": 0}, "epsilon"),
        ({"lo": 0}, "lo"),
        ({"cell_size_m": 100}, "cell_size_m"),
    ],
)
def test_a_bad_oracle_spec_is_a_4xx_naming_the_field(client, admin, change, field):
    response = client.post(CAMPAIGNS, json={**OLH_SPEC, **change}, headers=admin)
    assert 400 <= response.status_code < 500, response.get_json()
    assert response.get_json()["error"]["field"] == field


def test_an_oracle_needs_a_domain_or_a_size(client, admin):
    spec = {key: value for key, value in OLH_SPEC.items() if key != "domain_size"}
    response = client.post(CAMPAIGNS, json=spec, headers=admin)
    assert response.status_code == 422
    assert "domain_size" in response.get_json()["error"]["message"]


def test_domain_size_belongs_to_the_oracles(client, admin):
    response = client.post(CAMPAIGNS, json={**KRR_SPEC, "domain_size": 10}, headers=admin)
    assert response.get_json()["error"]["field"] == "domain_size"


def test_the_largest_domain_size_is_accepted(client, admin):
    spec = {**OLH_SPEC, "domain_size": MAX_DOMAIN_SIZE}
    assert client.post(CAMPAIGNS, json=spec, headers=admin).status_code == 201


@pytest.mark.parametrize("value", [-1, 1024 * 4, "3", 3.0, True, None])
def test_an_olh_report_out_of_range_is_refused(client, admin, value):
    create_campaign(client, admin, OLH_SPEC)
    response = client.post(
        f"{CAMPAIGNS}/apps/reports", json={"report_id": new_id(), "value": value}
    )
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]["field"] == "value"


def test_olh_estimate_lists_the_top_values_from_device_reports(client, admin, analyst):
    """3,000 users, 40% of them on app 17 and 20% on app 4000: both lead the estimate."""
    create_campaign(client, admin, OLH_SPEC)
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(OLH_SPEC))
    rng = random.Random(20251126)
    values = [17] * 1200 + [4000] * 600 + [rng.randrange(5000) for _ in range(1200)]
    submit(client, "apps", [mechanism.perturb(v, rng) for v in values])
    served = client.get(f"{CAMPAIGNS}/apps/estimate", headers=analyst).get_json()
    assert served["method"] == "projection"
    assert served["domain_size"] == 5000
    rows = served["estimates"]
    assert len(rows) == min(ORACLE_TOP_ROWS, 5000)
    assert served["rows"]["shown"] == len(rows) and served["rows"]["of"] == 5000
    assert [row["value"] for row in rows[:2]] == [17, 4000]
    frequencies = [row["frequency"] for row in rows]
    assert frequencies == sorted(frequencies, reverse=True)
    assert abs(sum(frequencies) + served["rows"]["rest_frequency"] - 1) < 1e-9
    assert all(row["ci_low"] <= row["frequency"] <= row["ci_high"] for row in rows)
    # The unbiased estimate within 4 standard deviations (about 0.039 at 40%, 0.030 at 20%);
    # the projection shrinks every value by the noise that spreads over 5,000 values.
    inversion = client.get(f"{CAMPAIGNS}/apps/estimate?method=inversion", headers=analyst)
    body = inversion.get_json()
    assert body["interval_method"].startswith("analytic")
    unbiased = {row["value"]: row["frequency"] for row in body["estimates"]}
    assert abs(unbiased[17] - 0.4) < 0.16 and abs(unbiased[4000] - 0.2) < 0.12


def test_hadamard_estimate_by_label(client, admin, analyst):
    create_campaign(client, admin, HADAMARD_SPEC)
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(HADAMARD_SPEC))
    rng = random.Random(7)
    values = ["w3"] * 1500 + [f"w{rng.randrange(300)}" for _ in range(1500)]
    submit(client, "words", [mechanism.perturb(v, rng) for v in values])
    served = client.get(f"{CAMPAIGNS}/words/estimate", headers=analyst).get_json()
    rows = served["estimates"]
    assert len(rows) == 300 and served["rows"]["rest_frequency"] == 0.0
    assert rows[0]["value"] == rows[0]["label"] == "w3"
    assert abs(rows[0]["frequency"] - 0.5) < 0.08
    frequencies = np.array([row["frequency"] for row in rows])
    assert abs(frequencies.sum() - 1) < 1e-9


def test_ibu_is_refused_for_a_large_olh_campaign(client, admin, analyst):
    spec = {**OLH_SPEC, "domain_size": 20_000}  # 2 x 10^7 hashes a pass
    create_campaign(client, admin, spec)
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
    rng = random.Random(3)
    submit(client, "apps", [mechanism.perturb(rng.randrange(20_000), rng) for _ in range(50)])
    response = client.get(f"{CAMPAIGNS}/apps/estimate?method=ibu", headers=analyst)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "method_not_applicable" and "projection" in error["message"]


def test_the_methods_offered_are_the_methods_accepted():
    large = Mechanism.from_spec(CampaignSpec.from_dict({**OLH_SPEC, "domain_size": 20_000}))
    small = Mechanism.from_spec(CampaignSpec.from_dict({**OLH_SPEC, "domain_size": 30}))
    assert "ibu" not in applicable_methods(large)  # the dashboard's menu leaves it out
    assert not_applicable(large, "ibu") is not None
    assert "ibu" in applicable_methods(small) and not_applicable(small, "ibu") is None
    assert "mle" in applicable_methods(small) and "mle" not in applicable_methods(large)


def test_ibu_runs_for_a_small_olh_campaign(client, admin, analyst):
    spec = {**OLH_SPEC, "domain_size": 30}
    create_campaign(client, admin, spec)
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
    rng = random.Random(4)
    submit(
        client,
        "apps",
        [mechanism.perturb(7 if i % 2 else rng.randrange(30), rng) for i in range(1000)],
    )
    body = client.get(f"{CAMPAIGNS}/apps/estimate?method=ibu", headers=analyst).get_json()
    assert body["method"] == "ibu" and body["estimates"][0]["value"] == 7

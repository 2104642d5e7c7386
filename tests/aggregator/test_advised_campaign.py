"""Creating a campaign without a mechanism: the server chooses one and says why (real Redis)."""

from __future__ import annotations

import math

import pytest

from aggregator.estimation.advice import oracle_mse, rank_region
from shared.spec import DEFAULT_EXPECTED_USERS, CampaignSpec

LABELS = ["apple", "banana", "cherry", "damson"]
REGION = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}


def create(client, admin, **body):
    return client.post(
        "/api/v1/campaigns", json={"id": "planned", "title": "T", **body}, headers=admin
    )


def test_labels_get_krr_with_the_advice_and_the_same_request_again_is_200(client, admin):
    response = create(client, admin, epsilon=1.5, domain=LABELS)
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert body["mechanism"] == "krr" and body["domain"] == LABELS
    advice = body["advice"]
    assert advice["chosen"] == "krr"
    assert advice["expected_users"] == DEFAULT_EXPECTED_USERS
    assert advice["why"].startswith("krr: ")
    ranking = advice["ranking"]
    assert ranking[0]["mechanism"] == "krr"
    assert ranking[0]["expected_mse"] == pytest.approx(
        oracle_mse("krr", 4, 1.5, DEFAULT_EXPECTED_USERS)
    )
    assert {o["mechanism"]: o["hosted"] for o in ranking}["oue"] is False
    # The campaign is an ordinary krr campaign: its spec parses and pins as any other.
    served = client.get("/api/v1/campaigns/planned").get_json()
    assert "advice" not in served
    spec, _ = CampaignSpec.from_wire(served)
    assert spec.mechanism == "krr"
    again = create(client, admin, epsilon=1.5, domain=LABELS)
    assert again.status_code == 200
    assert again.get_json()["advice"]["chosen"] == "krr"


def test_two_labels_get_binary_randomized_response(client, admin):
    body = create(client, admin, epsilon=1, domain=["no", "yes"]).get_json()
    assert body["mechanism"] == "rr" and body["advice"]["chosen"] == "rr"


def test_a_large_domain_gets_the_best_hosted_mechanism_and_says_what_would_be_better(client, admin):
    labels = [f"item{i}" for i in range(200)]
    body = create(client, admin, epsilon=1, domain=labels, expected_users=10**6).get_json()
    # OLH is hosted: it is taken; OUE (same error, k bits a report) is not.
    assert body["mechanism"] == "olh"
    advice = body["advice"]
    assert advice["expected_users"] == 10**6
    ranked = [option["mechanism"] for option in advice["ranking"]]
    assert set(ranked[:2]) == {"oue", "olh"} and ranked.index("krr") > ranked.index("olh")
    if ranked[0] == "oue":
        assert "oue would be better but this service does not host it yet" in advice["why"]


def test_a_range_gets_geometric_when_it_is_wide_and_krr_over_its_values_when_it_is_small(
    client, admin
):
    wide = create(client, admin, epsilon=0.5, lo=0, hi=120).get_json()
    assert wide["mechanism"] == "geometric" and (wide["lo"], wide["hi"]) == (0, 120)
    assert wide["advice"]["ranking"][0]["mechanism"] == "geometric"
    small = client.post(
        "/api/v1/campaigns",
        json={"id": "rating", "title": "Rating", "epsilon": 2, "lo": 1, "hi": 4},
        headers=admin,
    ).get_json()
    assert small["mechanism"] == "krr" and small["domain"] == ["1", "2", "3", "4"]


def test_a_region_gets_the_grid_mechanism_that_moves_reports_least(client, admin):
    """At 0.01 per metre over 200 m cells, the Euclidean exponential mechanism moves a report
    about 140 m, planar Laplace 200 m (2 / epsilon, before snapping to cells)."""
    response = create(
        client, admin, region=REGION, cell_size_m=200, privacy_level=2, privacy_radius_m=200
    )
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert (body["mechanism"], body["metric"]) == ("exponential_grid", "euclidean")
    assert body["epsilon"] == pytest.approx(0.01)
    ranking = body["advice"]["ranking"]
    assert sorted((o["mechanism"], o.get("metric") or "") for o in ranking) == [
        ("exponential_grid", "euclidean"),
        ("exponential_grid", "manhattan"),
        ("planar_laplace", ""),
    ]
    assert (ranking[0]["mechanism"], ranking[0]["metric"]) == ("exponential_grid", "euclidean")
    displacements = {o.get("metric", "planar"): o["mean_displacement_m"] for o in ranking}
    assert displacements["planar"] == pytest.approx(200.0)
    assert displacements["euclidean"] == pytest.approx(139.6, abs=0.5)
    assert [o["mean_displacement_m"] for o in ranking] == sorted(displacements.values())
    assert all(o["basis"].startswith("closed-form proxy") for o in ranking)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"epsilon": 1}, "domain"),
        ({"epsilon": 1, "domain": LABELS, "lo": 0, "hi": 3}, "domain"),
        ({"domain": LABELS}, "epsilon"),
        ({"epsilon": 1, "lo": 0}, "hi"),
        ({"epsilon": 1, "lo": 5, "hi": 5}, "lo"),
        ({"epsilon": 1, "lo": 0, "hi": 10**6}, "hi"),
        ({"epsilon": 51, "domain": LABELS}, "epsilon"),
        ({"epsilon": 1, "domain": LABELS, "expected_users": 0}, "expected_users"),
        ({"epsilon": 1, "domain": LABELS, "privacy_level": 1}, "privacy_level"),
        ({"region": REGION, "cell_size_m": 200}, "epsilon"),
        ({"epsilon": 1, "domain": LABELS, "colour": "red"}, "colour"),
    ],
)
def test_an_incomplete_or_contradictory_request_is_refused_naming_the_field(
    client, admin, body, field
):
    response = create(client, admin, **body)
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "invalid_spec"
    assert error["field"] == field
    assert client.get("/api/v1/campaigns").get_json() == {"campaigns": []}


def test_expected_users_with_a_mechanism_is_refused(client, admin):
    response = create(client, admin, mechanism="krr", epsilon=1, domain=LABELS, expected_users=5)
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "expected_users"


def test_a_region_ranks_only_the_grid_steps_a_spec_takes():
    """Below 0.01 per cell the exponential_grid spec is refused, and its lattice sum (whose
    cost grows as 1 / step^2) would run for minutes: it is not ranked."""
    ranking = rank_region(200.0, 1e-7)
    assert [option.mechanism for option in ranking] == ["planar_laplace"]
    steps = {
        o.details["metric"]: o.epsilon * 200
        for o in rank_region(200.0, 0.01)
        if o.details.get("metric")
    }
    assert steps == pytest.approx({"euclidean": 2.0, "manhattan": 2.0 / math.sqrt(2)})

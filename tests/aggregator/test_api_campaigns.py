"""Campaign endpoints: admin auth, validation at the edge, JSON errors, immutability."""

from __future__ import annotations

import pytest
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC, PLANAR_SPEC

from aggregator.app import create_app
from aggregator.http.routes import LISTED_DOMAIN_LIMIT
from shared.spec import CampaignSpec


def error_of(response):
    body = response.get_json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "field"}
    return body["error"]


def test_create_returns_spec_with_server_hash(client, admin):
    response = client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin)
    assert response.status_code == 201
    body = response.get_json()
    spec = CampaignSpec.from_dict(KRR_SPEC)
    assert body["spec_hash"] == spec.spec_hash
    assert body["status"] == "open"
    assert response.headers["Location"].endswith("/api/v1/campaigns/fruit")
    # What the server serves parses back, as a client would pin it.
    parsed, meta = CampaignSpec.from_wire(client.get("/api/v1/campaigns/fruit").get_json())
    assert parsed == spec
    assert meta["spec_hash"] == spec.spec_hash


def test_create_same_spec_again_is_200_and_another_spec_409(client, admin, krr_campaign):
    again = client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin)
    assert again.status_code == 200
    assert again.get_json()["spec_hash"] == krr_campaign["spec_hash"]
    other = client.post("/api/v1/campaigns", json={**KRR_SPEC, "epsilon": 3}, headers=admin)
    assert other.status_code == 409
    assert error_of(other)["code"] == "campaign_exists"
    assert client.get("/api/v1/campaigns/fruit").get_json()["epsilon"] == 1.5


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": f"Bearer {ANALYST_TOKEN}"}, 403),
        ({"Authorization": "Bearer not-a-configured-token"}, 401),
        ({"Authorization": "Basic x"}, 401),
    ],
)
def test_create_needs_the_admin_token(client, headers, status):
    response = client.post("/api/v1/campaigns", json=KRR_SPEC, headers=headers)
    assert response.status_code == status
    assert error_of(response)["code"] in ("unauthorized", "forbidden")
    assert client.get("/api/v1/campaigns").get_json() == {"campaigns": []}


def test_admin_role_is_closed_when_no_token_is_configured(redis_url):
    app = create_app({"REDIS_URL": redis_url, "ADMIN_TOKEN": None})
    response = app.test_client().post(
        "/api/v1/campaigns", json=KRR_SPEC, headers={"Authorization": "Bearer None"}
    )
    assert response.status_code == 401


def test_numeric_token_from_the_environment_works(redis_url, monkeypatch):
    # A token setting is text, however it looks: this one stays a string, not a number.
    token = "1234567890" * 4
    monkeypatch.setenv("LDP_ADMIN_TOKEN", token)
    monkeypatch.setenv("LDP_REDIS_URL", redis_url)
    app = create_app()
    assert app.config["ADMIN_TOKEN"] == token
    response = app.test_client().post(
        "/api/v1/campaigns", json=KRR_SPEC, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"epsilon": -1}, "epsilon", "invalid_spec"),
        ({"epsilon": True}, "epsilon", "invalid_spec"),
        ({"domain": ["a", "a"]}, "domain[1]", "invalid_spec"),
        ({"mechanism": "laplace"}, "mechanism", "invalid_spec"),
        ({"colour": "red"}, "colour", "invalid_spec"),
        ({"spec_hash": "abc"}, "spec_hash", "invalid_spec"),
        ({"status": "closed"}, "status", "invalid_spec"),
        ({"id": "Bad Id"}, "id", "invalid_spec"),
    ],
)
def test_invalid_spec_is_422_naming_the_field(client, admin, change, field, code):
    response = client.post("/api/v1/campaigns", json={**KRR_SPEC, **change}, headers=admin)
    assert response.status_code == 422
    error = error_of(response)
    assert (error["field"], error["code"]) == (field, code)


def test_body_must_be_json(client, admin):
    not_json = client.post("/api/v1/campaigns", data="id=x", headers=admin)
    assert not_json.status_code == 415
    assert error_of(not_json)["code"] == "unsupported_media_type"
    broken = client.post(
        "/api/v1/campaigns", data="{", content_type="application/json", headers=admin
    )
    assert broken.status_code == 400
    assert error_of(broken)["code"] == "invalid_json"
    nan = client.post(
        "/api/v1/campaigns",
        data='{"id": "x", "title": "x", "mechanism": "rr", "epsilon": NaN}',
        content_type="application/json",
        headers=admin,
    )
    assert nan.status_code == 400
    deep = client.post(
        "/api/v1/campaigns", data="[" * 100_000, content_type="application/json", headers=admin
    )
    assert deep.status_code == 400
    assert client.post("/api/v1/campaigns", json=[1], headers=admin).status_code == 422


def test_body_too_large_is_413(config, admin):
    app = create_app({**config, "MAX_CONTENT_LENGTH": 1000})
    big = {**KRR_SPEC, "domain": [f"label-{i}" for i in range(500)]}
    response = app.test_client().post("/api/v1/campaigns", json=big, headers=admin)
    assert response.status_code == 413
    assert error_of(response)["code"] == "too_large"


def test_get_and_list_are_public(client, krr_campaign, planar_campaign):
    listed = client.get("/api/v1/campaigns").get_json()["campaigns"]
    assert [c["id"] for c in listed] == ["fruit", "where"]
    planar = client.get("/api/v1/campaigns/where").get_json()
    assert planar["spec_hash"] == CampaignSpec.from_dict(PLANAR_SPEC).spec_hash
    assert planar["region"] == PLANAR_SPEC["region"]


def test_the_list_leaves_out_a_large_domain_and_links_to_the_whole_spec(
    client, admin, krr_campaign
):
    # With every label listed, this list was 0.9 MB for each anonymous request.
    labels = [str(i) for i in range(100_000)]
    words = {"id": "words", "title": "Words", "mechanism": "krr", "epsilon": 1.0, "domain": labels}
    assert client.post("/api/v1/campaigns", json=words, headers=admin).status_code == 201
    response = client.get("/api/v1/campaigns")
    assert len(response.get_data()) < 2_000
    fruit, listed = response.get_json()["campaigns"]
    assert fruit == {**krr_campaign, "url": "/api/v1/campaigns/fruit"}
    assert "domain" not in listed
    assert listed["domain_labels"] == 100_000
    assert listed["url"] == "/api/v1/campaigns/words"
    # The campaign's own endpoint, which clients read, serves the whole domain.
    spec, meta = CampaignSpec.from_wire(client.get(listed["url"]).get_json())
    assert spec.domain == tuple(labels)
    assert meta["spec_hash"] == listed["spec_hash"] == CampaignSpec.from_dict(words).spec_hash


def test_a_domain_up_to_the_limit_is_listed_whole(client, admin):
    for campaign_id, size in (("at-limit", LISTED_DOMAIN_LIMIT), ("over", LISTED_DOMAIN_LIMIT + 1)):
        spec = {
            "id": campaign_id,
            "title": "T",
            "mechanism": "hadamard_response",
            "epsilon": 1.0,
            "domain": [f"w{i}" for i in range(size)],
        }
        assert client.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    at_limit, over = client.get("/api/v1/campaigns").get_json()["campaigns"]
    assert len(at_limit["domain"]) == LISTED_DOMAIN_LIMIT and "domain_labels" not in at_limit
    assert "domain" not in over and over["domain_labels"] == LISTED_DOMAIN_LIMIT + 1


@pytest.mark.parametrize("campaign_id", ["nope", "Not-A-Slug", "a" * 70, "x%7Bc%3Ay%7D"])
def test_unknown_or_malformed_campaign_is_404(client, campaign_id):
    response = client.get(f"/api/v1/campaigns/{campaign_id}")
    assert response.status_code == 404
    assert error_of(response)["code"] == "campaign_not_found"


def test_close_and_reopen(client, admin, analyst, krr_campaign):
    url = "/api/v1/campaigns/fruit"
    assert client.patch(url, json={"status": "closed"}, headers=analyst).status_code == 403
    closed = client.patch(url, json={"status": "closed"}, headers=admin)
    assert closed.status_code == 200
    assert closed.get_json()["status"] == "closed"
    assert closed.get_json()["spec_hash"] == krr_campaign["spec_hash"]
    assert client.get(url).get_json()["status"] == "closed"
    assert client.patch(url, json={"status": "open"}, headers=admin).get_json()["status"] == "open"


@pytest.mark.parametrize(
    "body", [{"status": "paused"}, {"epsilon": 9}, {"status": "closed", "epsilon": 9}, []]
)
def test_only_the_status_can_change(client, admin, krr_campaign, body):
    response = client.patch("/api/v1/campaigns/fruit", json=body, headers=admin)
    assert response.status_code == 422
    assert client.get("/api/v1/campaigns/fruit").get_json() == krr_campaign


def test_unknown_routes_and_methods_are_json(client):
    missing = client.get("/api/v1/nothing")
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "not_found"
    wrong = client.delete("/api/v1/campaigns")
    assert wrong.status_code == 405
    assert error_of(wrong)["code"] == "method_not_allowed"


def test_store_outage_is_503_without_details(admin):
    app = create_app({"REDIS_URL": "redis://127.0.0.1:1/0", "ADMIN_TOKEN": ADMIN_TOKEN})
    response = app.test_client().get("/api/v1/campaigns")
    assert response.status_code == 503
    error = error_of(response)
    assert error["code"] == "storage_unavailable"
    assert "127.0.0.1" not in error["message"]


def test_health(client):
    body = client.get("/api/v1/health").get_json()
    assert body["status"] == "ok"
    assert body["storage"]["accepting_reports"] is True


REGION = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}
CELLS_SPEC = {
    "id": "cells",
    "title": "Where, by cell",
    "mechanism": "krr",
    "epsilon": 2.0,
    "region": REGION,
    "cell_size_m": 200,
}


@pytest.mark.parametrize("mechanism", ["krr", "olh", "hadamard_response"])
def test_a_categorical_campaign_over_a_regions_cells(client, admin, mechanism):
    spec = {**CELLS_SPEC, "mechanism": mechanism}
    response = client.post("/api/v1/campaigns", json=spec, headers=admin)
    assert response.status_code == 201, response.get_json()
    served = client.get("/api/v1/campaigns/cells").get_json()
    parsed, meta = CampaignSpec.from_wire(served)
    assert parsed == CampaignSpec.from_dict(spec) and meta["spec_hash"] == parsed.spec_hash
    assert served["region"] == REGION and "domain" not in served


@pytest.mark.parametrize(
    ("mechanism", "change", "field", "words"),
    [
        ("rr", {}, "region", "applies only to planar_laplace, exponential_grid, krr"),
        ("rr", {"region": None}, "cell_size_m", "exponential_grid, krr, hadamard_response and"),
        ("krr", {"privacy_level": 2, "privacy_radius_m": 200}, "privacy_level", "near or far"),
        ("olh", {"privacy_radius_m": 200}, "privacy_radius_m", "near or far"),
        ("krr", {"domain": ["a", "b"]}, "region", "not both"),
        ("hadamard_response", {"domain": ["a", "b"]}, "region", "exactly one"),
        ("olh", {"domain_size": 100}, "region", "exactly one"),
        ("krr", {"cell_size_m": 1}, "cell_size_m", "at most 100,000 are allowed for krr"),
        ("olh", {"cell_size_m": 5000}, "cell_size_m", "needs at least 2"),
        ("geometric", {"lo": 0, "hi": 10}, "region", "geometric takes lo and hi"),
    ],
)
def test_a_region_a_mechanism_cannot_take_is_refused_naming_the_field(
    client, admin, mechanism, change, field, words
):
    spec = {**CELLS_SPEC, "mechanism": mechanism, **change}
    spec = {key: value for key, value in spec.items() if value is not None}
    response = client.post("/api/v1/campaigns", json=spec, headers=admin)
    assert response.status_code == 422, response.get_json()
    error = error_of(response)
    assert (error["code"], error["field"]) == ("invalid_spec", field), error
    assert words in error["message"]

"""Report submission: validation against the campaign, idempotent retries, closed campaigns, limits."""

from __future__ import annotations

import pytest
from aggregator_testdata import KRR_SPEC, create_campaign, new_id

from aggregator.app import create_app
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

URL = "/api/v1/campaigns/fruit/reports"


def counts_of(client, analyst, campaign="fruit"):
    body = client.get(f"/api/v1/campaigns/{campaign}/counts", headers=analyst).get_json()
    return {row["label"]: row["count"] for row in body["counts"]}, body["n"]


def test_single_report_then_its_retry(client, analyst, krr_campaign):
    report = {"report_id": new_id(), "value": "banana"}
    first = client.post(URL, json=report)
    assert first.status_code == 200
    assert first.get_json() == {"campaign": "fruit", "received": 1, "accepted": 1, "duplicates": 0}
    retry = client.post(URL, json=report)
    assert retry.get_json()["duplicates"] == 1
    counts, n = counts_of(client, analyst)
    assert counts == {"apple": 0, "banana": 1, "cherry": 0, "damson": 0}
    assert n == 1


def test_batch_with_repeats_and_retry(client, analyst, krr_campaign):
    labels = ["apple", "cherry", "cherry", "damson", "apple", "apple"]
    batch = [{"report_id": new_id(), "value": label} for label in labels]
    first = client.post(URL, json={"reports": [*batch, batch[0]]}).get_json()
    assert (first["received"], first["accepted"], first["duplicates"]) == (7, 6, 1)
    retry = client.post(URL, json={"reports": batch[3:]}).get_json()
    assert (retry["accepted"], retry["duplicates"]) == (0, 3)
    counts, n = counts_of(client, analyst)
    assert counts == {label: labels.count(label) for label in krr_campaign["domain"]}
    assert n == len(labels)


def test_report_ids_are_compared_in_canonical_form(client, krr_campaign):
    report_id = new_id()
    client.post(URL, json={"report_id": report_id, "value": "apple"})
    retry = client.post(URL, json={"report_id": report_id.upper(), "value": "apple"})
    assert retry.get_json()["duplicates"] == 1


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"report_id": "R1", "value": "apple"}, "report_id", "invalid_report"),
        ({"report_id": 7, "value": "apple"}, "report_id", "invalid_report"),
        ({"report_id": "ID", "value": "kiwi"}, "value", "invalid_report"),
        ({"report_id": "ID", "value": 3}, "value", "invalid_report"),
        ({"report_id": "ID"}, "value", "invalid_report"),
        ({"value": "apple"}, "report_id", "invalid_report"),
        ({"report_id": "ID", "value": "apple", "user": "bob"}, "user", "invalid_report"),
        ({"reports": []}, "reports", "invalid_report"),
        ({"reports": {"a": 1}}, "reports", "invalid_report"),
        ({"reports": ["apple"]}, "reports[0]", "invalid_report"),
        ({"reports": [{"report_id": "ID", "value": "apple"}], "x": 1}, "x", "invalid_report"),
        ({"report_id": "ID", "value": "apple", "spec_hash": 5}, "spec_hash", "invalid_report"),
    ],
)
def test_invalid_report_is_422_naming_the_field(client, krr_campaign, body, field, code):
    body = {key: (new_id() if value == "ID" else value) for key, value in body.items()}
    response = client.post(URL, json=body)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert (error["field"], error["code"]) == (field, code)


def test_one_bad_report_refuses_the_whole_batch(client, analyst, krr_campaign):
    batch = [{"report_id": new_id(), "value": v} for v in ("apple", "kiwi", "cherry")]
    response = client.post(URL, json={"reports": batch})
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "reports[1].value"
    assert counts_of(client, analyst)[1] == 0


def test_batch_size_is_capped(config, krr_campaign):
    client = create_app({**config, "MAX_BATCH": 5}).test_client()
    batch = [{"report_id": new_id(), "value": "apple"} for _ in range(6)]
    response = client.post(URL, json={"reports": batch})
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "reports"
    assert client.post(URL, json={"reports": batch[:5]}).get_json()["accepted"] == 5


def test_spec_hash_pins_the_campaign_version(client, analyst, krr_campaign):
    good = {"report_id": new_id(), "value": "apple", "spec_hash": krr_campaign["spec_hash"]}
    assert client.post(URL, json=good).get_json()["accepted"] == 1
    stale = {"report_id": new_id(), "value": "apple", "spec_hash": "0" * 64}
    response = client.post(URL, json=stale)
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "spec_mismatch"
    batch = {"reports": [{"report_id": new_id(), "value": "apple"}], "spec_hash": "0" * 64}
    assert client.post(URL, json=batch).status_code == 409
    assert counts_of(client, analyst)[1] == 1


def test_closed_campaign_is_409(client, admin, analyst, krr_campaign):
    client.patch("/api/v1/campaigns/fruit", json={"status": "closed"}, headers=admin)
    response = client.post(URL, json={"report_id": new_id(), "value": "apple"})
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "campaign_closed"
    assert counts_of(client, analyst)[1] == 0


def test_unknown_campaign_is_404(client):
    response = client.post("/api/v1/campaigns/nope/reports", json={"report_id": new_id()})
    assert response.status_code == 404


def test_planar_reports_must_be_cell_centres(client, analyst, planar_campaign):
    spec, _ = CampaignSpec.from_wire(planar_campaign)
    mechanism = Mechanism.from_spec(spec)
    url = "/api/v1/campaigns/where/reports"
    centre = mechanism.report_value(3)
    assert client.post(url, json={"report_id": new_id(), "value": centre}).status_code == 200
    off = {"lat": centre["lat"] + 0.0003, "lon": centre["lon"]}
    response = client.post(url, json={"report_id": new_id(), "value": off})
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "value"
    outside = {"lat": 10.0, "lon": 10.0}
    assert client.post(url, json={"report_id": new_id(), "value": outside}).status_code == 422
    body = client.get("/api/v1/campaigns/where/counts", headers=analyst).get_json()
    grid = spec.grid
    assert len(body["counts"]) == grid.rows * grid.cols
    row, col = divmod(3, grid.cols)
    # Each cell with its row, column and centre.
    assert body["counts"][3] == {"label": f"r{row}c{col}", "count": 1, "row": row, "col": col} | {
        "lat": centre["lat"],
        "lon": centre["lon"],
    }
    assert body["n"] == 1


def test_counts_need_the_analyst_role(client, admin, analyst, krr_campaign):
    url = "/api/v1/campaigns/fruit/counts"
    assert client.get(url).status_code == 401
    assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(url, headers=analyst).status_code == 200
    assert client.get(url, headers=admin).status_code == 200


def test_counts_report_hourly_arrivals(client, analyst, krr_campaign):
    client.post(URL, json={"reports": [{"report_id": new_id(), "value": "apple"}] * 1})
    body = client.get("/api/v1/campaigns/fruit/counts", headers=analyst).get_json()
    assert len(body["hourly"]) == 1
    assert body["hourly"][0]["count"] == 1
    assert body["hourly"][0]["hour"] % 3600 == 0


def test_reports_are_rate_limited_per_client(config, admin):
    client = create_app({**config, "RATELIMIT_REPORTS": "3 per minute", "SHARDS": 1})
    client = client.test_client()
    create_campaign(client, admin, KRR_SPEC)
    statuses = [
        client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code
        for _ in range(4)
    ]
    assert statuses == [200, 200, 200, 429]
    limited = client.post(URL, json={"report_id": new_id(), "value": "apple"})
    assert limited.get_json()["error"]["code"] == "rate_limited"
    assert int(limited.headers["Retry-After"]) > 0
    # Reading specs is not limited.
    assert client.get("/api/v1/campaigns/fruit").status_code == 200

"""Every kind of bad report submission gets its 4xx and error code, and changes nothing.

Each case is sent to a campaign that already holds reports; afterwards the
counts, the report stream and the report total must be exactly as before.
"""

from __future__ import annotations

import json

import pytest
from aggregator_testdata import KRR_SPEC, PLANAR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage.store import CampaignStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

PLANAR = Mechanism.from_spec(CampaignSpec.from_dict(PLANAR_SPEC))
CENTRE = PLANAR.report_value(5)
MAX_BODY = 64 * 1024
MAX_BATCH = 50


def state(store: CampaignStore, campaign_id: str) -> tuple:
    """Everything a submission could change: counts, hourly counts, stream, report total."""
    stream = len(list(store.iter_reports(campaign_id)))
    hourly = store.hourly_counts(campaign_id)
    return store.counts(campaign_id), hourly, stream, store.get_campaign(campaign_id).n_reports


@pytest.fixture
def client(config):
    app = create_app({**config, "MAX_CONTENT_LENGTH": MAX_BODY, "MAX_BATCH": MAX_BATCH})
    return app.test_client()


@pytest.fixture
def campaigns(client, admin, store):
    for spec in (KRR_SPEC, PLANAR_SPEC):
        assert client.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    for campaign_id, value in (("fruit", "apple"), ("where", CENTRE)):
        body = {"report_id": new_id(), "value": value}
        assert client.post(f"/api/v1/campaigns/{campaign_id}/reports", json=body).status_code == 200
    return store


def raw(text: str) -> bytes:
    return text.replace("ID", new_id()).encode()


def report(value) -> bytes:
    return json.dumps({"report_id": new_id(), "value": value}).encode()


# (name, campaign, body bytes, content type, status, code, field)
CASES = [
    ("malformed JSON", "fruit", b'{"report_id": ', None, 400, "invalid_json", None),
    ("trailing garbage", "fruit", raw('{"report_id":"ID","value":"apple"} x'), None, 400, "invalid_json", None),
    ("empty body", "fruit", b"", None, 400, "invalid_json", None),
    ("invalid UTF-8", "fruit", raw('{"report_id":"ID","value":"') + b'\xff\xfe"}', None, 400, "invalid_json", None),
    ("repeated key", "fruit", raw('{"report_id":"ID","value":"apple","value":"banana"}'), None, 400, "invalid_json", None),
    ("nested too deeply", "fruit", b"[" * 30000 + b"]" * 30000, None, 400, "invalid_json", None),
    ("not JSON: text/plain", "fruit", report("apple"), "text/plain", 415, "unsupported_media_type", None),
    ("not JSON: form", "fruit", b"report_id=1&value=apple", "application/x-www-form-urlencoded", 415, "unsupported_media_type", None),
    ("no content type", "fruit", report("apple"), "", 415, "unsupported_media_type", None),
    ("body over the limit", "fruit", raw('{"report_id":"ID","value":"' + "a" * MAX_BODY + '"}'), None, 413, "too_large", None),
    ("unknown field", "fruit", raw('{"report_id":"ID","value":"apple","user":"bob"}'), None, 422, "invalid_report", "user"),
    ("missing value", "fruit", raw('{"report_id":"ID"}'), None, 422, "invalid_report", "value"),
    ("missing report_id", "fruit", b'{"value":"apple"}', None, 422, "invalid_report", "report_id"),
    ("not an object", "fruit", b'["apple"]', None, 422, "invalid_report", None),
    ("report_id not a UUID", "fruit", b'{"report_id":"r-1","value":"apple"}', None, 422, "invalid_report", "report_id"),
    ("report_id a number", "fruit", b'{"report_id":12345,"value":"apple"}', None, 422, "invalid_report", "report_id"),
    ("label a boolean", "fruit", report(True), None, 422, "invalid_report", "value"),
    ("label a number", "fruit", report(1), None, 422, "invalid_report", "value"),
    ("label null", "fruit", report(None), None, 422, "invalid_report", "value"),
    ("label a list", "fruit", report(["apple"]), None, 422, "invalid_report", "value"),
    ("label outside the domain", "fruit", report("kiwi"), None, 422, "invalid_report", "value"),
    ("label differs in case", "fruit", report("Apple"), None, 422, "invalid_report", "value"),
    ("NaN", "fruit", raw('{"report_id":"ID","value":NaN}'), None, 400, "invalid_json", None),
    ("Infinity", "fruit", raw('{"report_id":"ID","value":-Infinity}'), None, 400, "invalid_json", None),
    ("1e400 as a label", "fruit", raw('{"report_id":"ID","value":1e400}'), None, 422, "invalid_report", "value"),
    ("huge integer", "fruit", raw('{"report_id":"ID","value":' + "9" * 5000 + "}"), None, 400, "invalid_json", None),
    ("NaN latitude", "where", raw('{"report_id":"ID","value":{"lat":NaN,"lon":-122.415}}'), None, 400, "invalid_json", None),
    ("1e400 latitude", "where", raw('{"report_id":"ID","value":{"lat":1e400,"lon":-122.415}}'), None, 422, "invalid_report", "value.lat"),
    ("huge integer latitude", "where", raw('{"report_id":"ID","value":{"lat":' + "9" * 400 + ',"lon":-122.415}}'), None, 422, "invalid_report", "value.lat"),
    ("longitude projected to infinity", "where", raw('{"report_id":"ID","value":{"lat":0.0,"lon":2.045364742627032e+303}}'), None, 422, "invalid_report", "value"),
    ("boolean latitude", "where", report({"lat": True, "lon": CENTRE["lon"]}), None, 422, "invalid_report", "value.lat"),
    ("string latitude", "where", report({"lat": str(CENTRE["lat"]), "lon": CENTRE["lon"]}), None, 422, "invalid_report", "value.lat"),
    ("missing longitude", "where", report({"lat": CENTRE["lat"]}), None, 422, "invalid_report", None),
    ("extra coordinate", "where", report({**CENTRE, "alt": 3}), None, 422, "invalid_report", None),
    ("a label for a location", "where", report("apple"), None, 422, "invalid_report", "value"),
    ("outside the region", "where", report({"lat": 10.0, "lon": 10.0}), None, 422, "invalid_report", "value"),
    ("off the report grid", "where", report({"lat": CENTRE["lat"] + 0.0003, "lon": CENTRE["lon"]}), None, 422, "invalid_report", "value"),
    ("unknown campaign", "nope", report("apple"), None, 404, "campaign_not_found", None),
    ("malformed campaign id", "NOPE!", report("apple"), None, 404, "campaign_not_found", None),
    ("spec hash mismatch", "fruit", raw('{"report_id":"ID","value":"apple","spec_hash":"' + "0" * 64 + '"}'), None, 409, "spec_mismatch", "spec_hash"),
    ("batch spec hash mismatch", "fruit", raw('{"reports":[{"report_id":"ID","value":"apple"}],"spec_hash":"' + "1" * 64 + '"}'), None, 409, "spec_mismatch", "spec_hash"),
    ("spec hash not a string", "fruit", raw('{"report_id":"ID","value":"apple","spec_hash":7}'), None, 422, "invalid_report", "spec_hash"),
    ("empty batch", "fruit", b'{"reports":[]}', None, 422, "invalid_report", "reports"),
    ("batch not a list", "fruit", b'{"reports":{"0":1}}', None, 422, "invalid_report", "reports"),
    ("too many reports in a batch", "fruit", json.dumps({"reports": [{"report_id": new_id(), "value": "apple"} for _ in range(MAX_BATCH + 1)]}).encode(), None, 422, "invalid_report", "reports"),
    ("unknown batch field", "fruit", raw('{"reports":[{"report_id":"ID","value":"apple"}],"user":1}'), None, 422, "invalid_report", "user"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("campaign_id", "body", "content_type", "status", "code", "field"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_submission_is_refused_and_changes_nothing(
    client, campaigns, campaign_id, body, content_type, status, code, field
):
    known = campaign_id in ("fruit", "where")
    before = state(campaigns, campaign_id) if known else None
    response = client.post(
        f"/api/v1/campaigns/{campaign_id}/reports",
        data=body,
        content_type="application/json" if content_type is None else content_type,
    )
    assert response.status_code == status, response.get_data()
    error = response.get_json()["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["code"] == code
    if field is not None:
        assert error["field"] == field
    assert error["message"] and "Traceback" not in error["message"]
    if known:
        assert state(campaigns, campaign_id) == before


def test_closed_campaign_is_409_and_changes_nothing(client, admin, campaigns):
    client.patch("/api/v1/campaigns/fruit", json={"status": "closed"}, headers=admin)
    before = state(campaigns, "fruit")
    for body in (
        {"report_id": new_id(), "value": "banana"},
        {"reports": [{"report_id": new_id(), "value": "banana"}]},
    ):
        response = client.post("/api/v1/campaigns/fruit/reports", json=body)
        assert response.status_code == 409
        assert response.get_json()["error"]["code"] == "campaign_closed"
    assert state(campaigns, "fruit") == before


@pytest.mark.parametrize("bad_at", [0, 3, MAX_BATCH - 1])
def test_one_bad_report_refuses_the_whole_batch_and_names_it(client, campaigns, bad_at):
    batch = [{"report_id": new_id(), "value": "cherry"} for _ in range(MAX_BATCH)]
    batch[bad_at] = {"report_id": new_id(), "value": True}
    before = state(campaigns, "fruit")
    response = client.post("/api/v1/campaigns/fruit/reports", json={"reports": batch})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["field"] == f"reports[{bad_at}].value"
    assert f"reports[{bad_at}].value" in error["message"]
    assert state(campaigns, "fruit") == before
    # Nothing was marked as seen: the client fixes the report and the retry counts all of them.
    batch[bad_at] = {**batch[bad_at], "value": "cherry"}
    fixed = client.post("/api/v1/campaigns/fruit/reports", json={"reports": batch}).get_json()
    assert (fixed["accepted"], fixed["duplicates"]) == (MAX_BATCH, 0)


def test_a_good_report_after_the_bad_ones_is_counted(client, campaigns):
    """The refusals above left no state that would block an honest report."""
    before_counts, _, before_stream, before_n = state(campaigns, "fruit")
    body = {"report_id": new_id(), "value": "damson"}
    assert client.post("/api/v1/campaigns/fruit/reports", json=body).get_json()["accepted"] == 1
    counts, _, stream, n = state(campaigns, "fruit")
    assert (stream, n) == (before_stream + 1, before_n + 1)
    assert counts[3] == before_counts.get(3, 0) + 1

"""Enrollment tokens: issued in bulk by the admin, one report each, spent atomically."""

from __future__ import annotations

import threading

import pytest
import redis
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.storage.errors import EnrollmentRefused
from aggregator.storage.ingest import StoredReport, token_digest
from aggregator.storage.store import CampaignStore

ENROLLED = {**KRR_SPEC, "id": "enrolled", "enrollment_required": True}
TOKENS = "/api/v1/campaigns/enrolled/enrollment-tokens"
REPORTS = "/api/v1/campaigns/enrolled/reports"


@pytest.fixture
def enrolled(client, admin):
    assert client.post("/api/v1/campaigns", json=ENROLLED, headers=admin).status_code == 201


def issue(client, admin, count: int) -> list[str]:
    response = client.post(TOKENS, json={"count": count}, headers=admin)
    assert response.status_code == 201, response.get_json()
    return response.get_json()["tokens"]


def counts(client, analyst) -> int:
    return client.get("/api/v1/campaigns/enrolled/counts", headers=analyst).get_json()["n"]


def test_the_admin_issues_distinct_tokens_shown_once(client, admin, enrolled, redis_url):
    body = client.post(TOKENS, json={"count": 50}, headers=admin).get_json()
    assert body["issued"] == 50 and body["unused"] == 50 and len(set(body["tokens"])) == 50
    assert client.get(TOKENS, headers=admin).get_json()["unused"] == 50
    # The store keeps digests only: the tokens themselves are nowhere in Redis.
    connection = redis.Redis.from_url(redis_url)
    keys = connection.keys("ldp:{c:enrolled:*}:enrollment")
    members = [m for key in keys for m in connection.smembers(key)]
    assert sorted(m.decode() for m in members) == sorted(token_digest(t) for t in body["tokens"])


@pytest.mark.parametrize(
    ("body", "status"),
    [({"count": 0}, 422), ({"count": 10_001}, 422), ({"count": True}, 422), ({}, 422)],
)
def test_bad_counts_are_refused(client, admin, enrolled, body, status):
    response = client.post(TOKENS, json=body, headers=admin)
    assert response.status_code == status
    assert client.get(TOKENS, headers=admin).get_json()["unused"] == 0


def test_tokens_need_the_admin_and_an_enrollment_campaign(client, admin, analyst, enrolled):
    assert client.post(TOKENS, json={"count": 1}).status_code == 401
    assert client.post(TOKENS, json={"count": 1}, headers=analyst).status_code == 403
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    refused = client.post(
        "/api/v1/campaigns/fruit/enrollment-tokens", json={"count": 1}, headers=admin
    )
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "enrollment_not_required"


def test_one_report_per_token_and_a_retry_is_a_duplicate(client, admin, analyst, enrolled):
    (token,) = issue(client, admin, 1)
    report = {"report_id": new_id(), "value": "apple", "enrollment_token": token}
    first = client.post(REPORTS, json=report)
    assert first.status_code == 200 and first.get_json()["accepted"] == 1
    again = client.post(REPORTS, json=report)  # the same report: a retry
    assert again.status_code == 200 and again.get_json()["duplicates"] == 1
    other = client.post(REPORTS, json={**report, "report_id": new_id()})
    assert other.status_code == 403
    assert other.get_json()["error"]["code"] == "enrollment_refused"
    assert counts(client, analyst) == 1
    assert client.get(TOKENS, headers=admin).get_json()["unused"] == 0


def test_missing_unknown_and_misplaced_tokens(client, admin, analyst, enrolled):
    missing = client.post(REPORTS, json={"report_id": new_id(), "value": "apple"})
    assert missing.status_code == 422
    assert missing.get_json()["error"]["code"] == "enrollment_required"
    assert missing.get_json()["error"]["field"] == "enrollment_token"
    unknown = client.post(
        REPORTS, json={"report_id": new_id(), "value": "apple", "enrollment_token": "x" * 32}
    )
    assert unknown.status_code == 403
    malformed = client.post(
        REPORTS, json={"report_id": new_id(), "value": "apple", "enrollment_token": "short"}
    )
    assert malformed.status_code == 422
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    misplaced = client.post(
        "/api/v1/campaigns/fruit/reports",
        json={"report_id": new_id(), "value": "apple", "enrollment_token": "y" * 32},
    )
    assert misplaced.status_code == 422
    assert counts(client, analyst) == 0


def test_a_batch_with_one_bad_token_stores_nothing_and_spends_nothing(
    client, admin, analyst, enrolled
):
    tokens = issue(client, admin, 3)
    batch = [
        {"report_id": new_id(), "value": "apple", "enrollment_token": tokens[0]},
        {"report_id": new_id(), "value": "banana", "enrollment_token": tokens[1]},
        {"report_id": new_id(), "value": "cherry", "enrollment_token": tokens[1]},  # reused
    ]
    refused = client.post(REPORTS, json={"reports": batch})
    assert refused.status_code == 403
    assert "report 2" in refused.get_json()["error"]["message"]
    assert counts(client, analyst) == 0
    assert client.get(TOKENS, headers=admin).get_json()["unused"] == 3
    batch[2]["enrollment_token"] = tokens[2]
    assert client.post(REPORTS, json={"reports": batch}).get_json()["accepted"] == 3
    assert client.get(TOKENS, headers=admin).get_json()["unused"] == 0


def test_the_stream_never_holds_the_token(client, admin, enrolled, redis_url):
    (token,) = issue(client, admin, 1)
    client.post(REPORTS, json={"report_id": new_id(), "value": "apple", "enrollment_token": token})
    connection = redis.Redis.from_url(redis_url)
    keys = connection.keys("ldp:{c:enrolled:*}:reports")
    entries = [entry for key in keys for entry in connection.xrange(key)]
    assert [set(fields) for _, fields in entries] == [{b"report_id", b"y", b"value"}]
    assert token.encode() not in repr(entries).encode()


def test_concurrent_reports_with_one_token_store_exactly_one(client, admin, enrolled, redis_url):
    (token,) = issue(client, admin, 1)
    outcomes: list[str] = []

    def send() -> None:
        store = CampaignStore(redis.Redis.from_url(redis_url))
        report = StoredReport(new_id(), 0, "apple", token)
        try:
            store.ingest("enrolled", [report], enrollment_required=True)
            outcomes.append("stored")
        except EnrollmentRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=send) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 19 + ["stored"]
    assert CampaignStore(redis.Redis.from_url(redis_url)).counts("enrolled") == {0: 1}

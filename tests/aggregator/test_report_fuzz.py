"""Property-based fuzzing of the report endpoint: thousands of generated requests, no 5xx.

Hypothesis builds request bodies from valid reports, near-misses (wrong types,
labels off by a character, coordinates off the grid, stray keys, batches with
one bad member), arbitrary JSON and raw bytes, under several content types,
against a k-RR and a planar campaign on a real Redis. Every answer must be a
200 with the accepted/duplicates body or a 4xx with the error body, and the
stored counts must equal what the 200s said was accepted. The run is
derandomised (fixed seed) so a failure reproduces.
"""

from __future__ import annotations

import json

import pytest
from aggregator_testdata import KRR_SPEC, PLANAR_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.app import create_app
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

MIN_REQUESTS = 2000
MAX_BATCH = 8
PLANAR = Mechanism.from_spec(CampaignSpec.from_dict(PLANAR_SPEC))
CENTRES = [PLANAR.report_value(y) for y in range(PLANAR.n_outputs)]
LABELS = KRR_SPEC["domain"]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
any_json = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
report_ids = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.text(max_size=40),
    json_scalars,
)
near_labels = st.sampled_from(LABELS).flatmap(
    lambda label: st.sampled_from([label, label.upper(), label + " ", label[:-1], label + "\u0000"])
)
coordinates = st.one_of(
    st.sampled_from(CENTRES),
    st.sampled_from(CENTRES).map(lambda c: {"lat": c["lat"] + 1e-4, "lon": c["lon"]}),
    st.fixed_dictionaries(
        {"lat": st.floats(-100, 100) | json_scalars, "lon": st.floats(-200, 200) | json_scalars}
    ),
    st.sampled_from(CENTRES).map(lambda c: {**c, "alt": 0}),
)
values = st.one_of(st.sampled_from(LABELS), near_labels, coordinates, any_json)


@st.composite
def reports(draw):
    report = {}
    if draw(st.integers(0, 9)):  # mostly present
        report["report_id"] = draw(report_ids)
    if draw(st.integers(0, 9)):
        report["value"] = draw(values)
    if not draw(st.integers(0, 5)):
        report["spec_hash"] = draw(st.text(max_size=64) | json_scalars)
    if not draw(st.integers(0, 7)):
        report[draw(st.text(max_size=8))] = draw(any_json)
    return report


batches = st.fixed_dictionaries({"reports": st.lists(reports(), max_size=MAX_BATCH + 2)})
structured = st.one_of(reports(), batches, any_json)


def encode(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=200))
    body = encode(draw(structured))
    if kind == 1 and body:  # damage a well-formed body
        cut = draw(st.integers(0, len(body)))
        return body[:cut] + draw(st.binary(max_size=4)) + body[cut + 1 :]
    return body


@st.composite
def valid_submissions(draw) -> tuple[str, bytes]:
    """A correct report or batch for one of the campaigns (retries included)."""
    campaign_id, pool = draw(st.sampled_from([("fruit", LABELS), ("where", CENTRES)]))
    made = st.fixed_dictionaries({"report_id": st.uuids().map(str), "value": st.sampled_from(pool)})
    if draw(st.booleans()):
        return campaign_id, encode(draw(made))
    batch = draw(st.lists(made, min_size=1, max_size=MAX_BATCH))
    if draw(st.booleans()):
        batch.append(batch[0])  # a repeat within the batch
    return campaign_id, encode({"reports": batch})


content_types = st.sampled_from(
    ["application/json"] * 6
    + ["application/json; charset=utf-8", "text/plain", "", "application/vnd.api+json"]
)
campaign_ids = st.sampled_from(["fruit"] * 4 + ["where"] * 4 + ["nope", "NOPE", "a" * 80])


@pytest.fixture
def client(config, admin):
    app = create_app({**config, "MAX_BATCH": MAX_BATCH, "RATELIMIT_ENABLED": False})
    client = app.test_client()
    for spec in (KRR_SPEC, PLANAR_SPEC):
        assert client.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    return client


def test_generated_report_requests_never_cause_a_server_error(client, analyst):
    sent = []
    accepted = {"fruit": 0, "where": 0}
    statuses: dict[int, int] = {}

    @settings(
        max_examples=MIN_REQUESTS + 100,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        target=st.tuples(campaign_ids, bodies()) | valid_submissions(), content_type=content_types
    )
    def send(target, content_type):
        campaign_id, body = target
        response = client.post(
            f"/api/v1/campaigns/{campaign_id}/reports", data=body, content_type=content_type
        )
        sent.append(response.status_code)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (body, response.get_data())
        answer = response.get_json()
        if response.status_code == 200:
            assert set(answer) == {"campaign", "received", "accepted", "duplicates"}
            assert answer["accepted"] + answer["duplicates"] == answer["received"]
            accepted[campaign_id] += answer["accepted"]
        else:
            assert 400 <= response.status_code < 500
            assert set(answer["error"]) == {"code", "message", "field"}

    send()
    assert len(sent) >= MIN_REQUESTS, statuses
    # The generator reached past the JSON parser and the validator, not only the 400s.
    assert statuses.get(200, 0) >= 300 and statuses.get(422, 0) >= 300, statuses
    for campaign_id, n in accepted.items():
        body = client.get(f"/api/v1/campaigns/{campaign_id}/counts", headers=analyst).get_json()
        assert body["n"] == n

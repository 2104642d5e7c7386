"""CORS: public spec and report endpoints answer other origins; nothing else does."""

from __future__ import annotations

import pytest
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.app import create_app

ORIGIN = "https://survey.example"
REPORTS = "/api/v1/campaigns/fruit/reports"


def cors_headers(response):
    return {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}


def preflight(client, url, method, headers="Content-Type"):
    return client.options(
        url,
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        },
    )


def test_a_browser_may_post_reports(client, krr_campaign):
    answer = preflight(client, REPORTS, "POST")
    assert answer.status_code == 200
    assert cors_headers(answer) == {
        "Access-Control-Allow-Origin": "*",
        "Access-Control-Allow-Methods": "POST",
        "Access-Control-Allow-Headers": "Content-Type",
        "Access-Control-Max-Age": "600",
    }
    response = client.post(
        REPORTS, json={"report_id": new_id(), "value": "apple"}, headers={"Origin": ORIGIN}
    )
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert "Retry-After" in response.headers["Access-Control-Expose-Headers"]
    assert "Access-Control-Allow-Credentials" not in response.headers


def test_errors_of_public_endpoints_are_readable_cross_origin(client, krr_campaign):
    bad = client.post(REPORTS, json={"report_id": "x", "value": 1}, headers={"Origin": ORIGIN})
    assert bad.status_code == 422
    assert bad.headers["Access-Control-Allow-Origin"] == "*"
    missing = client.get("/api/v1/campaigns/nope", headers={"Origin": ORIGIN})
    assert missing.status_code == 404
    assert missing.headers["Access-Control-Allow-Origin"] == "*"


def test_rate_limited_answer_carries_cors_and_retry_after(config, krr_campaign):
    client = create_app({**config, "RATELIMIT_REPORTS": "1 per minute"}).test_client()
    body = {"report_id": new_id(), "value": "apple"}
    client.post(REPORTS, json=body, headers={"Origin": ORIGIN})
    limited = client.post(REPORTS, json=body, headers={"Origin": ORIGIN})
    assert limited.status_code == 429
    assert limited.headers["Access-Control-Allow-Origin"] == "*"
    assert int(limited.headers["Retry-After"]) > 0


@pytest.mark.parametrize("url", ["/api/v1/campaigns", "/api/v1/campaigns/fruit"])
def test_specs_are_readable_cross_origin(client, krr_campaign, url):
    response = client.get(url, headers={"Origin": ORIGIN})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert preflight(client, url, "GET").headers["Access-Control-Allow-Methods"] == "GET"


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("POST", "/api/v1/campaigns"),
        ("PATCH", "/api/v1/campaigns/fruit"),
        ("GET", "/api/v1/campaigns/fruit/counts"),
        ("GET", "/api/v1/campaigns/fruit/estimate"),
    ],
)
def test_admin_and_analyst_endpoints_answer_no_cors(client, admin, krr_campaign, method, url):
    assert cors_headers(preflight(client, url, method, "Authorization, Content-Type")) == {}
    kwargs = {"json": KRR_SPEC} if method == "POST" else {}
    if method == "PATCH":
        kwargs = {"json": {"status": "open"}}
    response = client.open(url, method=method, headers={**admin, "Origin": ORIGIN}, **kwargs)
    assert response.status_code < 300
    assert cors_headers(response) == {}


def test_dashboard_answers_no_cors(client):
    response = client.get("/dashboard/", headers={"Origin": ORIGIN})
    assert cors_headers(response) == {}


def test_origins_can_be_narrowed_or_cors_turned_off(config, krr_campaign):
    narrowed = create_app({**config, "CORS_ORIGINS": [ORIGIN]}).test_client()
    ok = narrowed.get("/api/v1/campaigns/fruit", headers={"Origin": ORIGIN})
    assert ok.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in ok.headers["Vary"]
    other = narrowed.get("/api/v1/campaigns/fruit", headers={"Origin": "https://evil.example"})
    assert cors_headers(other) == {}
    off = create_app({**config, "CORS_ORIGINS": []}).test_client()
    assert cors_headers(off.get("/api/v1/campaigns/fruit", headers={"Origin": ORIGIN})) == {}

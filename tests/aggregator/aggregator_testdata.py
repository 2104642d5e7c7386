"""Specs, tokens and helpers shared by the aggregator tests."""

from __future__ import annotations

import uuid

from aggregator.app import create_app
from aggregator.services import EXTENSION

ADMIN_TOKEN = "test-admin-token-0123456789abcdefghij"
ANALYST_TOKEN = "test-analyst-token-0123456789abcdefghij"
KRR_SPEC = {
    "id": "fruit",
    "title": "Favourite fruit",
    "mechanism": "krr",
    "epsilon": 1.5,
    "domain": ["apple", "banana", "cherry", "damson"],
}
PLANAR_SPEC = {
    "id": "where",
    "title": "Where are you",
    "mechanism": "planar_laplace",
    "epsilon": 0.01,
    "region": {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41},
    "cell_size_m": 200,
}
GRID_SPEC = {
    "id": "block",
    "title": "Which block are you in",
    "mechanism": "exponential_grid",
    "metric": "euclidean",
    "epsilon": 0.005,
    "region": {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41},
    "cell_size_m": 200,
}
GEOMETRIC_SPEC = {
    "id": "age",
    "title": "Your age",
    "mechanism": "geometric",
    "epsilon": 0.5,
    "lo": 0,
    "hi": 120,
}

OLH_SPEC = {
    "id": "apps",
    "title": "Your most used app",
    "mechanism": "olh",
    "epsilon": 1.0,
    "domain_size": 5000,
}
HADAMARD_SPEC = {
    "id": "words",
    "title": "A word you typed",
    "mechanism": "hadamard_response",
    "epsilon": 1.0,
    "domain": [f"w{i}" for i in range(300)],
}


def new_id() -> str:
    return str(uuid.uuid4())


def create_campaign(client, admin, spec: dict) -> dict:
    """POST ``spec`` as the admin; the created campaign's wire form (201 asserted)."""
    response = client.post("/api/v1/campaigns", json=spec, headers=admin)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def submit(client, campaign_id: str, values: list, chunk: int = 500) -> None:
    """Post ``values`` as reports with fresh ids, ``chunk`` per request (200 asserted)."""
    for start in range(0, len(values), chunk):
        body = {
            "reports": [{"report_id": new_id(), "value": v} for v in values[start : start + chunk]]
        }
        response = client.post(f"/api/v1/campaigns/{campaign_id}/reports", json=body)
        assert response.status_code == 200, response.get_json()


def short_app_of(config, **settings):
    """An app whose store waits for 1 replica, or as many as the master has (none): as a
    cluster's does with LDP_ACK_REPLICAS unset while a promoted master has no replica."""
    app = create_app({**config, "ACK_REPLICAS": 1, **settings})
    app.extensions[EXTENSION].get().writer.only_present = True
    return app

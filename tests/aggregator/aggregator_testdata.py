"""Specs, tokens and helpers shared by the aggregator tests."""

from __future__ import annotations

import uuid

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

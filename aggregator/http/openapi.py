"""The OpenAPI 3.0 document of the API, served at ``/api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

import flask

from aggregator.estimation import METHODS
from aggregator.http.estimates import CONFIDENCE_LEVELS, DEFAULT_CONFIDENCE
from shared.spec import MECHANISMS

bp = flask.Blueprint("openapi", __name__, url_prefix="/api/v1")

_ERROR = {"$ref": "#/components/schemas/Error"}
_NUMBER = {"type": "number"}
_REPORT_REF = {"$ref": "#/components/schemas/Report"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _json_or_csv(schema: dict, description: str, *, headers: dict | None = None) -> dict:
    """A 200 that is JSON by default and a CSV attachment with ``format=csv``."""
    response = {
        "description": f"{description}; with format=csv a CSV attachment",
        "content": {
            "application/json": {"schema": schema},
            "text/csv": {"schema": {"type": "string"}},
        },
    }
    if headers:
        response["headers"] = headers
    return response


_RATE_LIMIT_HEADERS = {
    "X-RateLimit-Limit": {
        "description": "submissions allowed per window, per client address and campaign",
        "schema": {"type": "integer"},
    },
    "X-RateLimit-Remaining": {
        "description": "submissions left in this window",
        "schema": {"type": "integer"},
    },
    "X-RateLimit-Reset": {
        "description": "unix time at which the window ends",
        "schema": {"type": "integer"},
    },
}
_FORMAT = {
    "name": "format",
    "in": "query",
    "schema": {"type": "string", "enum": ["json", "csv"], "default": "json"},
}


def _errors(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "Malformed JSON",
        401: "Missing or unknown bearer token",
        403: "Token without the needed role",
        404: "Unknown campaign",
        409: "Campaign closed, id taken, spec mismatch, or no enrollment",
        413: "Body too large",
        415: "Body is not JSON",
        422: "Invalid input; `field` names it",
        429: "Rate limited; Retry-After says when to try again",
        507: "Report store full or campaign quota reached; nothing stored",
    }
    return {str(status): _json(_ERROR, reasons[status]) for status in statuses}


_CAMPAIGN_ID = {
    "name": "campaign_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
}
_REGION = {
    "type": "object",
    "additionalProperties": False,
    "required": ["lat_min", "lat_max", "lon_min", "lon_max"],
    "properties": {
        name: {"type": "number", "minimum": -180, "maximum": 180}
        for name in ("lat_min", "lat_max", "lon_min", "lon_max")
    },
}
_SPEC_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
    "title": {"type": "string", "minLength": 1, "maxLength": 200},
    "mechanism": {"type": "string", "enum": list(MECHANISMS)},
    "epsilon": {
        "type": "number",
        "exclusiveMinimum": True,
        "minimum": 0,
        "description": "LDP parameter; for planar_laplace, per metre",
    },
    "domain": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 2},
    "region": _REGION,
    "cell_size_m": {"type": "number", "minimum": 1},
    "privacy_level": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
    "privacy_radius_m": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
    "enrollment_required": {"type": "boolean"},
}
_VALUE = {
    "oneOf": [
        {"type": "string", "description": "a label of the campaign's domain (rr, krr)"},
        {
            "type": "object",
            "description": "a report-grid cell centre (planar_laplace)",
            "additionalProperties": False,
            "required": ["lat", "lon"],
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        },
    ]
}
_REPORT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["report_id", "value"],
    "properties": {
        "report_id": {"type": "string", "format": "uuid"},
        "value": _VALUE,
        "spec_hash": {"type": "string"},
        "enrollment_token": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_-]{16,128}$",
            "description": "required by, and only by, campaigns with enrollment_required",
        },
    },
}
_POISONING = {
    "type": "object",
    "description": "goodness-of-fit check against fake reports (k-RR and rr only)",
    "properties": {
        "flagged": {"type": "boolean", "nullable": True, "description": "null: not assessed"},
        "statistic": {"type": "number", "nullable": True, "description": "z-score"},
        "threshold": {"type": "number", "nullable": True, "description": "flagged below it"},
        "false_alarm_rate": {"type": "number"},
        "explanation": {"type": "string"},
    },
}


def _enrollment_tokens_path() -> dict[str, Any]:
    admin: list[dict[str, list[str]]] = [{"bearer": []}]
    tokens = {
        "type": "object",
        "properties": {
            "campaign": {"type": "string"},
            "issued": {"type": "integer"},
            "unused": {"type": "integer"},
            "tokens": {"type": "array", "items": {"type": "string"}},
        },
    }
    return {
        "parameters": [_CAMPAIGN_ID],
        "post": {
            "summary": "Issue single-use enrollment tokens (admin); shown only in this answer",
            "security": admin,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["count"],
                            "properties": {
                                "count": {"type": "integer", "minimum": 1, "maximum": 10000}
                            },
                        }
                    }
                },
            },
            "responses": {
                "201": _json(tokens, "Issued"),
                **_errors(400, 401, 403, 404, 409, 413, 415, 422, 429),
            },
        },
        "get": {
            "summary": "How many issued tokens are unused (admin)",
            "security": admin,
            "responses": {
                "200": _json(tokens, "Unused tokens"),
                **_errors(401, 403, 404, 409, 429),
            },
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI document (built on request; it is small)."""
    campaign = {
        "type": "object",
        "properties": {
            **_SPEC_PROPERTIES,
            "status": {"type": "string", "enum": ["open", "closed"]},
            "spec_hash": {"type": "string", "description": "hex SHA-256 of the canonical spec"},
            "created_at": {"type": "number", "description": "unix seconds"},
        },
        "required": ["id", "title", "mechanism", "epsilon", "status", "spec_hash"],
    }
    spec_in = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "title", "mechanism"],
        "properties": _SPEC_PROPERTIES,
    }
    estimate = {
        "type": "object",
        "required": ["campaign", "method", "n", "estimates"],
        "properties": {
            "campaign": {"type": "string"},
            "spec_hash": {"type": "string"},
            "method": {"type": "string", "enum": list(METHODS)},
            "n": {"type": "integer"},
            "confidence": {"type": "number"},
            "estimates": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "frequency": {"type": "number"},
                        "ci_low": {"type": "number"},
                        "ci_high": {"type": "number"},
                        "raw_frequency": {
                            "type": "number",
                            "description": "rr and krr only: share of the noisy reports",
                        },
                    },
                },
            },
            "estimator": {"type": "string", "description": "what ran, in words"},
            "warnings": {"type": "array", "items": {"type": "string"}},
            "n_iter": {"type": "integer", "nullable": True, "description": "IBU iterations"},
            "converged": {"type": "boolean", "nullable": True},
            "log_likelihood": {"type": "number", "nullable": True},
            "interval_method": {"type": "string"},
            "seconds": {"type": "number", "description": "estimation time"},
            "poisoning": _POISONING,
            "grid": {
                "type": "object",
                "description": "planar_laplace only: cells[row][col], row 0 south, col 0 west",
                "properties": {
                    "rows": {"type": "integer"},
                    "cols": {"type": "integer"},
                    "cell_size_m": {"type": "number"},
                    "region": _REGION,
                    "cells": {"type": "array", "items": {"type": "array", "items": _NUMBER}},
                },
            },
        },
    }
    admin: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "LDP aggregator",
            "version": "1",
            "description": "Collects locally perturbed reports and estimates distributions.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message", "field"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "field": {"type": "string", "nullable": True},
                            },
                        }
                    },
                },
                "Campaign": campaign,
                "CampaignSpec": spec_in,
                "Report": _REPORT,
                "Estimate": estimate,
            },
        },
        "paths": {
            "/api/v1/health": {
                "get": {
                    "summary": "Liveness and store reachability",
                    "responses": {"200": _json({"type": "object"}, "OK"), **_errors(429)},
                }
            },
            "/api/v1/campaigns": {
                "get": {
                    "summary": "List campaigns",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "campaigns": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Campaign"},
                                    }
                                },
                            },
                            "All campaigns, oldest first",
                        ),
                        **_errors(429),
                    },
                },
                "post": {
                    "summary": "Create a campaign (admin)",
                    "security": admin,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/CampaignSpec"}
                            }
                        },
                    },
                    "responses": {
                        "201": _json({"$ref": "#/components/schemas/Campaign"}, "Created"),
                        "200": _json(
                            {"$ref": "#/components/schemas/Campaign"}, "The same spec existed"
                        ),
                        **_errors(400, 401, 403, 409, 413, 415, 422, 429),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}": {
                "parameters": [_CAMPAIGN_ID],
                "get": {
                    "summary": "A campaign's spec and hash (public, for clients)",
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Campaign"}, "The campaign"),
                        **_errors(404, 429),
                    },
                },
                "patch": {
                    "summary": "Open or close a campaign (admin); the spec cannot change",
                    "security": admin,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["status"],
                                    "properties": {
                                        "status": {"type": "string", "enum": ["open", "closed"]}
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Campaign"}, "Updated"),
                        **_errors(400, 401, 403, 404, 413, 415, 422, 429),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}/reports": {
                "parameters": [_CAMPAIGN_ID],
                "post": {
                    "summary": "Submit one report or a batch; retries are idempotent",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        {"$ref": "#/components/schemas/Report"},
                                        {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["reports"],
                                            "properties": {
                                                "reports": {
                                                    "type": "array",
                                                    "minItems": 1,
                                                    "maxItems": 1000,
                                                    "items": _REPORT_REF,
                                                },
                                                "spec_hash": {"type": "string"},
                                            },
                                        },
                                    ]
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            **_json(
                                {
                                    "type": "object",
                                    "properties": {
                                        "campaign": {"type": "string"},
                                        "received": {"type": "integer"},
                                        "accepted": {"type": "integer"},
                                        "duplicates": {"type": "integer"},
                                    },
                                },
                                "Stored; duplicates were already stored",
                            ),
                            "headers": _RATE_LIMIT_HEADERS,
                        },
                        **_errors(400, 404, 409, 413, 415, 422, 429, 507),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}/counts": {
                "parameters": [_CAMPAIGN_ID, _FORMAT],
                "get": {
                    "summary": "Reports per output symbol and per hour (analyst)",
                    "security": admin,
                    "responses": {
                        "200": _json_or_csv({"type": "object"}, "Counts"),
                        **_errors(401, 403, 404, 422, 429),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}/enrollment-tokens": _enrollment_tokens_path(),
            "/api/v1/campaigns/{campaign_id}/estimate": {
                "parameters": [
                    _CAMPAIGN_ID,
                    {
                        "name": "method",
                        "in": "query",
                        "schema": {"type": "string", "enum": list(METHODS), "default": "ibu"},
                    },
                    {
                        "name": "confidence",
                        "in": "query",
                        "schema": {
                            "type": "number",
                            "enum": list(CONFIDENCE_LEVELS),
                            "default": DEFAULT_CONFIDENCE,
                        },
                    },
                    _FORMAT,
                ],
                "get": {
                    "summary": "Estimated distribution with confidence intervals (analyst)",
                    "security": admin,
                    "responses": {
                        "200": _json_or_csv(
                            {"$ref": "#/components/schemas/Estimate"},
                            "The estimate, cached until new reports arrive",
                            headers={
                                "X-Estimate-Cache": {
                                    "description": "hit: served from the cache; miss: computed",
                                    "schema": {"type": "string", "enum": ["hit", "miss"]},
                                }
                            },
                        ),
                        **_errors(401, 403, 404, 422, 429),
                        "503": {
                            **_json(
                                _ERROR,
                                "The estimate ran past the server's time limit and was "
                                "stopped, or another request's computation of it was not "
                                "ready in time; Retry-After says when to try again",
                            ),
                            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                        },
                    },
                },
            },
        },
    }


@bp.get("/openapi.json")
def openapi_json() -> flask.Response:
    return flask.jsonify(document())

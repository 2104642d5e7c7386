"""The OpenAPI 3.0 document of the API, served at ``/api/v1/openapi.json``.

Request bodies and parameters are generated from the descriptors the server
checks them with (:mod:`shared.spec`, :mod:`shared.wire`, the query parameters
and bodies of :mod:`aggregator.http`), so every bound shown is the one
enforced; the batch limit is the server's ``MAX_BATCH`` setting. Responses are
described here.
"""

from __future__ import annotations

from typing import Any

import flask

from aggregator.estimation import METHODS
from aggregator.http.enrollment import TOKEN_REQUEST
from aggregator.http.estimates import CONFIDENCE, METHOD
from aggregator.http.export import FORMAT
from aggregator.http.routes import LISTED_DOMAIN_LIMIT, STATUS_UPDATE
from aggregator.http.windows import (
    A_SINCE,
    A_UNTIL,
    B_SINCE,
    B_UNTIL,
    PERIODS,
    TOP,
    UNTIL,
    WINDOW_PARAMETERS,
)
from aggregator.services import current_settings
from aggregator.storage.store import STATUSES
from shared.schema import Shapes
from shared.spec import (
    ADVISED_SCHEMA,
    CAMPAIGN_ID,
    EUCLIDEAN,
    EXPONENTIAL_GRID,
    GEOMETRIC,
    HADAMARD_RESPONSE,
    KRR,
    MANHATTAN,
    OLH_NAME,
    PLANAR_LAPLACE,
    REGION,
    RR,
    SPEC_SCHEMAS,
)
from shared.wire import DEFAULT_MAX_BATCH, REPORT, report_batch

bp = flask.Blueprint("openapi", __name__, url_prefix="/api/v1")

_ERROR = {"$ref": "#/components/schemas/Error"}
_NUMBER = {"type": "number"}
_CAMPAIGN_REF = {"$ref": "#/components/schemas/Campaign"}
_CREATED_REF = {"$ref": "#/components/schemas/CreatedCampaign"}
# Who may call an endpoint: the admin token, or (for reading results) the analyst token, which
# the admin token also stands in for.
_ADMIN: list[dict[str, list[str]]] = [{"admin": []}]
_ANALYST: list[dict[str, list[str]]] = [{"analyst": []}, {"admin": []}]
_SPEC_VARIANTS = {
    RR: "RRSpec",
    KRR: "KRRSpec",
    PLANAR_LAPLACE: "PlanarSpec",
    GEOMETRIC: "GeometricSpec",
    EXPONENTIAL_GRID: "ExponentialGridSpec",
    HADAMARD_RESPONSE: "HadamardSpec",
    OLH_NAME: "OLHSpec",
}


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
    "schema": CAMPAIGN_ID.schema(),
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
_SERVER_PROPERTIES = {
    "status": {"type": "string", "enum": list(STATUSES)},
    "spec_hash": {"type": "string", "description": "hex SHA-256 of the canonical spec"},
    "created_at": {"type": "number", "description": "unix seconds"},
}


_ADVICE = {
    "type": "object",
    "description": "Why the server chose the mechanism (a campaign created without one)",
    "properties": {
        "chosen": {"type": "string", "description": "the mechanism's wire name"},
        "why": {"type": "string"},
        "expected_users": {"type": "integer"},
        "ranking": {
            "type": "array",
            "description": "every mechanism ranked, best first; hosted: whether this service "
            "runs it",
            "items": {
                "type": "object",
                "properties": {
                    "mechanism": {"type": "string"},
                    "expected_mse": {
                        "type": "number",
                        "nullable": True,
                        "description": "E||f_hat - f||^2 summed over the domain",
                    },
                    "epsilon": _NUMBER,
                    "basis": {"type": "string"},
                    "why": {"type": "string"},
                    "hosted": {"type": "boolean"},
                    "expected_emd_m": {
                        "type": "number",
                        "nullable": True,
                        "description": "a region: the simulated earth mover's distance in "
                        "metres of the mechanism's estimate (null where it is undefined)",
                    },
                    "expected_emd_se_m": {
                        "type": "number",
                        "nullable": True,
                        "description": "its standard error over the simulation's draws",
                    },
                    "metric": {"type": "string", "enum": [EUCLIDEAN, MANHATTAN]},
                    "as_cells": {
                        "type": "boolean",
                        "description": "an oracle over the region's cells",
                    },
                    "as_labels": {
                        "type": "boolean",
                        "description": "an oracle over a range's values as labels",
                    },
                },
                "required": ["mechanism", "expected_mse", "epsilon", "basis", "hosted"],
            },
        },
    },
    "required": ["chosen", "why", "expected_users", "ranking"],
}


def _json_body(schema: dict) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _by_mechanism(names: dict[str, str]) -> dict[str, Any]:
    """One of the schemas ``names`` (by mechanism), told apart by the body's ``mechanism``."""
    return {
        "oneOf": [_ref(name) for name in names.values()],
        "discriminator": {
            "propertyName": "mechanism",
            "mapping": {mechanism: _ref(name)["$ref"] for mechanism, name in names.items()},
        },
    }


def _spec_schemas() -> dict[str, Any]:
    """One schema per mechanism's spec, and the campaign (spec plus server fields) of each.

    A spec's schema is exact where a mechanism takes one of a few shapes (labels, a
    domain size, a region and its grid): one object per shape, so that a body valid
    against it has one of them. A served campaign is the shapes' fields together.
    """
    schemas: dict[str, Any] = {}
    campaigns: dict[str, str] = {}
    for mechanism, name in _SPEC_VARIANTS.items():
        described = SPEC_SCHEMAS[mechanism]
        schemas[name] = described.schema()
        served = (described.merged() if isinstance(described, Shapes) else described).schema()
        campaigns[mechanism] = f"{name[: -len('Spec')]}Campaign"
        schemas[campaigns[mechanism]] = {
            **served,
            "properties": {**served["properties"], **_SERVER_PROPERTIES},
            # A served spec always has its epsilon, whichever way it was given.
            "required": [*dict.fromkeys([*served["required"], "epsilon", "status", "spec_hash"])],
        }
    schemas["CampaignSpec"] = _by_mechanism(_SPEC_VARIANTS)
    schemas["AdvisedSpec"] = ADVISED_SCHEMA.schema()
    schemas["Advice"] = _ADVICE
    # What creating a campaign answers: the campaign, and the advice when the server chose.
    schemas["CreatedCampaign"] = {
        "oneOf": [
            {
                **schemas[f"{name[: -len('Spec')]}Campaign"],
                "properties": {
                    **schemas[f"{name[: -len('Spec')]}Campaign"]["properties"],
                    "advice": {"$ref": "#/components/schemas/Advice"},
                },
            }
            for name in _SPEC_VARIANTS.values()
        ]
    }
    schemas["Campaign"] = _by_mechanism(campaigns)
    schemas["ListedCampaign"] = {"oneOf": [_listed(schemas, name) for name in _SPEC_VARIANTS]}
    return schemas


def _listed(schemas: dict[str, Any], mechanism: str) -> dict[str, Any]:
    """A campaign of ``mechanism`` as the public list gives it (routes.listed)."""
    campaign = schemas[f"{_SPEC_VARIANTS[mechanism][: -len('Spec')]}Campaign"]
    properties = {
        **campaign["properties"],
        "url": {"type": "string", "description": "the campaign's own endpoint: its whole spec"},
    }
    if "domain" in properties:
        properties["domain_labels"] = {
            "type": "integer",
            "description": f"in place of a domain of more than {LISTED_DOMAIN_LIMIT} labels, "
            "which the list leaves out: its number of labels",
        }
    required = [name for name in campaign["required"] if name != "domain"]
    return {**campaign, "properties": properties, "required": [*required, "url"]}


def _enrollment_tokens_path() -> dict[str, Any]:
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
            "security": _ADMIN,
            "requestBody": _json_body(TOKEN_REQUEST.schema()),
            "responses": {
                "201": _json(tokens, "Issued"),
                **_errors(400, 401, 403, 404, 409, 413, 415, 422, 429),
            },
        },
        "get": {
            "summary": "How many issued tokens are unused (admin)",
            "security": _ADMIN,
            "responses": {
                "200": _json(tokens, "Unused tokens"),
                **_errors(401, 403, 404, 409, 429),
            },
        },
    }


def document(max_batch: int = DEFAULT_MAX_BATCH) -> dict[str, Any]:
    """The OpenAPI document for a server that takes batches of up to ``max_batch`` reports."""
    estimate = {
        "type": "object",
        "required": ["campaign", "method", "n", "estimates"],
        "properties": {
            "campaign": {"type": "string"},
            "spec_hash": {"type": "string"},
            "window": _WINDOW,
            "method": {
                "type": "string",
                "enum": list(METHODS),
                "description": "the estimator whose numbers these are; asking for it by name "
                "on the same counts gives the same numbers",
            },
            "n": {"type": "integer"},
            "confidence": {"type": "number"},
            "estimates": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {
                            "type": "string",
                            "description": "the category, the grid cell, or the integer value "
                            "as text (geometric, and olh or hadamard_response with a domain_size)",
                        },
                        "value": {
                            "oneOf": [{"type": "string"}, {"type": "integer"}],
                            "description": "olh and hadamard_response only: the value, its label "
                            "or its integer",
                        },
                        "frequency": {"type": "number"},
                        "ci_low": {"type": "number"},
                        "ci_high": {"type": "number"},
                        "raw_frequency": {
                            "type": "number",
                            "description": "rr, krr and geometric only: share of the noisy reports",
                        },
                    },
                },
            },
            "estimator": {"type": "string", "description": "what ran, in one line"},
            "details": {
                "type": "object",
                "description": "the facts behind the headline (folds, iterations, ...), by method",
            },
            "warnings": {"type": "array", "items": {"type": "string"}},
            "n_iter": {"type": "integer", "nullable": True, "description": "IBU iterations"},
            "converged": {"type": "boolean", "nullable": True},
            "log_likelihood": {"type": "number", "nullable": True},
            "interval_method": {"type": "string"},
            "seconds": {"type": "number", "description": "estimation time"},
            "poisoning": _POISONING,
            "domain_size": {
                "type": "integer",
                "description": "olh and hadamard_response only: the number of values",
            },
            "rows": {
                "type": "object",
                "description": "olh and hadamard_response only: estimates lists the values with "
                "the largest estimates, in decreasing order",
                "properties": {
                    "shown": {"type": "integer"},
                    "of": {"type": "integer"},
                    "order": {"type": "string"},
                    "rest_frequency": {
                        "type": "number",
                        "description": "the estimate's total over the values not listed",
                    },
                },
            },
            "range": {
                "type": "object",
                "description": "geometric only: the integers lo..hi, one estimate each in order",
                "properties": {"lo": {"type": "integer"}, "hi": {"type": "integer"}},
            },
            "grid": {
                "type": "object",
                "description": "campaigns over a region only (planar_laplace, exponential_grid, "
                "and krr, olh or hadamard_response with a region): cells[row][col], row 0 "
                "south, col 0 west; raw_cells the same for the share of the noisy reports "
                "(not for olh and hadamard_response, whose reports are not cells); a cell's "
                "centre is (lat[row], lon[col])",
                "properties": {
                    "rows": {"type": "integer"},
                    "cols": {"type": "integer"},
                    "cell_size_m": {"type": "number"},
                    "region": REGION.schema(),
                    "lat": {
                        "type": "array",
                        "items": _NUMBER,
                        "description": "the centres' latitude, one per row, south first",
                    },
                    "lon": {
                        "type": "array",
                        "items": _NUMBER,
                        "description": "the centres' longitude, one per column, west first",
                    },
                    "cells": {"type": "array", "items": {"type": "array", "items": _NUMBER}},
                    "raw_cells": {"type": "array", "items": {"type": "array", "items": _NUMBER}},
                },
            },
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "LDP aggregator",
            "version": "1",
            "description": "Collects locally perturbed reports and estimates distributions.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "securitySchemes": {
                "admin": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the admin token (LDP_ADMIN_TOKEN)",
                },
                "analyst": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the analyst token (LDP_ANALYST_TOKEN)",
                },
            },
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
                **_spec_schemas(),
                "Report": REPORT.schema(),
                "ReportBatch": report_batch(max_batch).schema(),
                "Estimate": estimate,
            },
        },
        "paths": {
            "/api/v1/health": {
                "get": {
                    "summary": "Liveness and store reachability",
                    "description": "Also which Redis masters have fewer replicas than writes "
                    "wait for; with the metrics or admin token each of them by address, and "
                    "the reports they acknowledged (docs/aggregator.md)",
                    "responses": {"200": _json({"type": "object"}, "OK"), **_errors(401, 429)},
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
                                        "items": {"$ref": "#/components/schemas/ListedCampaign"},
                                    }
                                },
                            },
                            f"All campaigns, oldest first; a domain of more than "
                            f"{LISTED_DOMAIN_LIMIT} labels is left out (domain_labels, and the "
                            "whole spec at url)",
                        ),
                        **_errors(429),
                    },
                },
                "post": {
                    "summary": "Create a campaign (admin)",
                    "security": _ADMIN,
                    "description": "Without a mechanism (AdvisedSpec) the server ranks the "
                    "mechanisms it hosts for the domain at expected_users and creates the "
                    "campaign with the best; the response's advice says which and why.",
                    "requestBody": _json_body(
                        {"oneOf": [_ref("CampaignSpec"), _ref("AdvisedSpec")]}
                    ),
                    "responses": {
                        "201": _json(_CREATED_REF, "Created"),
                        "200": _json(_CREATED_REF, "The same spec existed"),
                        **_errors(400, 401, 403, 409, 413, 415, 422, 429),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}": {
                "parameters": [_CAMPAIGN_ID],
                "get": {
                    "summary": "A campaign's spec and hash (public, for clients)",
                    "responses": {
                        "200": _json(_CAMPAIGN_REF, "The campaign"),
                        **_errors(404, 429),
                    },
                },
                "patch": {
                    "summary": "Open or close a campaign (admin); the spec cannot change",
                    "security": _ADMIN,
                    "requestBody": _json_body(STATUS_UPDATE.schema()),
                    "responses": {
                        "200": _json(_CAMPAIGN_REF, "Updated"),
                        **_errors(400, 401, 403, 404, 413, 415, 422, 429),
                    },
                },
            },
            "/api/v1/campaigns/{campaign_id}/reports": {
                "parameters": [_CAMPAIGN_ID],
                "post": {
                    "summary": "Submit one report or a batch; retries are idempotent",
                    "requestBody": _json_body(
                        {
                            "oneOf": [
                                {"$ref": "#/components/schemas/Report"},
                                {"$ref": "#/components/schemas/ReportBatch"},
                            ]
                        }
                    ),
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
                "parameters": [
                    _CAMPAIGN_ID,
                    FORMAT.openapi(),
                    *(parameter.openapi() for parameter in WINDOW_PARAMETERS),
                ],
                "get": {
                    "summary": "Reports per output symbol and per hour (analyst), over all time "
                    "or a window (then with its window and warnings)",
                    "security": _ANALYST,
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
                    METHOD.openapi(),
                    CONFIDENCE.openapi(),
                    FORMAT.openapi(),
                    *(parameter.openapi() for parameter in WINDOW_PARAMETERS),
                ],
                "get": {
                    "summary": "Estimated distribution with confidence intervals (analyst), over "
                    "all time or a window: n, the estimate and its intervals are the window's",
                    "security": _ANALYST,
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
            **_window_paths(),
        },
    }


_WINDOW = {
    "type": "object",
    "description": "the window the figures are over (absent: all time); both ends included, "
    "in the campaign's periods (a once campaign is counted by day)",
    "properties": {
        "since": {"type": "string"},
        "until": {"type": "string"},
        "period": {"type": "string", "enum": ["day", "week"]},
    },
}
_INTERVAL_ROW = {"type": "array", "items": {"type": "number", "nullable": True}}
_TIMED_OUT = {
    **_json(
        _ERROR,
        "The estimates ran past the server's time limit and were stopped (those computed are "
        "cached); Retry-After says when to try again",
    ),
    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
}


def _window_paths() -> dict[str, Any]:
    """The trend of estimates per period and the comparison of two windows."""
    trend = {
        "type": "object",
        "properties": {
            "campaign": {"type": "string"},
            "spec_hash": {"type": "string"},
            "window": _WINDOW,
            "method": {"type": "string", "enum": list(METHODS)},
            "confidence": _NUMBER,
            "n": {"type": "integer", "description": "reports in the whole window"},
            "periods": {
                "type": "array",
                "description": "each period of the window, oldest first",
                "items": {
                    "type": "object",
                    "properties": {
                        "period": {"type": "string"},
                        "n": {"type": "integer"},
                        "warnings": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
            "series": {
                "type": "array",
                "description": "the top categories (or cells) by their estimated share over the "
                "whole window, largest first; per period (as in periods) the estimate and its "
                "interval, null where the period has no reports",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "value": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                        "frequency": _INTERVAL_ROW,
                        "ci_low": _INTERVAL_ROW,
                        "ci_high": _INTERVAL_ROW,
                    },
                },
            },
            "interval_method": {"type": "string", "nullable": True},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
    }
    side = {
        "type": "object",
        "properties": {"window": _WINDOW, "n": {"type": "integer"}},
    }
    comparison = {
        "type": "object",
        "properties": {
            "campaign": {"type": "string"},
            "spec_hash": {"type": "string"},
            "method": {"type": "string", "enum": list(METHODS)},
            "confidence": _NUMBER,
            "a": side,
            "b": side,
            "differences": {
                "type": "array",
                "description": "per category (or cell) in output order; olh and "
                "hadamard_response: the 1,000 largest absolute differences, decreasing",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "value": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                        "a": {"type": "number", "description": "window a's estimate"},
                        "b": {"type": "number", "description": "window b's estimate"},
                        "difference": {"type": "number", "description": "b - a"},
                        "ci_low": _NUMBER,
                        "ci_high": _NUMBER,
                        "excludes_zero": {
                            "type": "boolean",
                            "description": "the interval does not hold 0: clearly non-zero",
                        },
                    },
                },
            },
            "excluding_zero": {"type": "integer"},
            "rows": {"type": "object"},
            "interval_method": {"type": "string"},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
    }
    return {
        "/api/v1/campaigns/{campaign_id}/trend": {
            "parameters": [
                _CAMPAIGN_ID,
                METHOD.openapi(),
                CONFIDENCE.openapi(),
                PERIODS.openapi(),
                TOP.openapi(),
                {
                    **UNTIL.openapi(),
                    "description": "the trend's last period (default: the "
                    "current one); as the estimate's until",
                },
            ],
            "get": {
                "summary": "The estimate of each of the last periods for the top categories (or "
                "cells), with intervals (analyst)",
                "security": _ANALYST,
                "responses": {
                    "200": _json(
                        trend,
                        "The trend; each period's estimate is cached as that "
                        "period's window estimate",
                    ),
                    **_errors(401, 403, 404, 422, 429),
                    "503": _TIMED_OUT,
                },
            },
        },
        "/api/v1/campaigns/{campaign_id}/compare": {
            "parameters": [
                _CAMPAIGN_ID,
                METHOD.openapi(),
                CONFIDENCE.openapi(),
                A_SINCE.openapi(),
                A_UNTIL.openapi(),
                B_SINCE.openapi(),
                B_UNTIL.openapi(),
            ],
            "get": {
                "summary": "Each category's difference between the estimates of windows b and "
                "a, with an interval holding both windows' noise (analyst); each window needs "
                "its since or its until",
                "security": _ANALYST,
                "responses": {
                    "200": {
                        **_json(comparison, "The comparison, cached until new reports arrive"),
                        "headers": {
                            "X-Estimate-Cache": {
                                "description": "hit: served from the cache; miss: computed",
                                "schema": {"type": "string", "enum": ["hit", "miss"]},
                            }
                        },
                    },
                    **_errors(401, 403, 404, 422, 429),
                    "503": _TIMED_OUT,
                },
            },
        },
    }


@bp.get("/openapi.json")
def openapi_json() -> flask.Response:
    return flask.jsonify(document(current_settings().max_batch))

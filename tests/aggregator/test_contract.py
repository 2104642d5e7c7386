"""The served OpenAPI document against the server's behaviour.

Every bound the document shows on a request (minimum, maximum, minLength,
maxLength, minItems, maxItems, uniqueItems, pattern, enum, format) is walked:
a value just inside it is accepted and a value just outside is refused with a
4xx whose ``field`` names it. Conversely, every bound the validators enforce
(their descriptors and the limits they are built from) is in the document.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aggregator_testdata import KRR_SPEC

from aggregator.estimation import METHODS
from aggregator.http.enrollment import MAX_TOKENS_PER_REQUEST, TOKEN_REQUEST
from aggregator.http.estimates import CONFIDENCE, CONFIDENCE_LEVELS, METHOD, not_applicable
from aggregator.http.export import FORMAT, FORMATS
from aggregator.http.routes import STATUS_UPDATE
from aggregator.http.windows import PERIOD_PATTERN
from aggregator.storage.store import STATUSES
from shared.mechanisms import Mechanism
from shared.periods import PERIODS
from shared.spec import (
    CAMPAIGN_ID,
    MAX_BOUND,
    MAX_DOMAIN,
    MAX_EPSILON,
    MAX_GEOMETRIC_EPSILON,
    MAX_LABEL_LENGTH,
    MAX_LATITUDE,
    MAX_TITLE_LENGTH,
    MIN_CELL_SIZE_M,
    SPEC_SCHEMAS,
    CampaignSpec,
)
from shared.wire import ENROLLMENT_TOKEN, REPORT, report_batch

# Small, so that a batch at the limit is cheap, and not the default, so that the document
# is seen to follow the setting.
MAX_BATCH = 4
CAMPAIGNS = "/api/v1/campaigns"
BOUND_KEYWORDS = (
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "pattern",
    "enum",
    "format",
)
_LONGEST_IDS = (f"{i:064d}" for i in itertools.count())
# A value that matches each documented pattern (a fresh one each time, as ids must differ;
# None: an enrollment token the server issued, the only kind a report can spend) and one
# that does not.
PATTERN_EXAMPLES = {
    f"^{CAMPAIGN_ID.pattern}$": (lambda: next(_LONGEST_IDS), "a" * 65),
    f"^{ENROLLMENT_TOKEN.pattern}$": (None, "t" * 15),
    # A window's period: a date for a campaign counted by day (the walk's campaigns are).
    f"^{PERIOD_PATTERN}$": (lambda: "2026-12-01", "2026-12-1"),
}
# A region of about 220 m x 180 m: small enough for 1 m cells.
REGION = {"lat_min": 37.77, "lat_max": 37.772, "lon_min": -122.42, "lon_max": -122.418}
# Campaigns created without a mechanism: one body per form of the domain.
ADVISED_BASES = [
    {"id": "x", "title": "Fruit", "epsilon": 1.0, "domain": ["apple", "banana", "cherry"]},
    {"id": "x", "title": "Age", "epsilon": 0.5, "lo": 0, "hi": 120},
    {"id": "x", "title": "Where", "epsilon": 0.01, "region": REGION, "cell_size_m": 20},
    {"id": "x", "title": "Where", "region": REGION, "cell_size_m": 20}
    | {"privacy_level": 2, "privacy_radius_m": 200},
]
SPEC_BASES = {
    "rr": {"id": "x", "title": "Q", "mechanism": "rr", "epsilon": 1.0, "domain": ["no", "yes"]},
    "krr": {
        "id": "x",
        "title": "Fruit",
        "mechanism": "krr",
        "epsilon": 1.0,
        "domain": ["apple", "banana", "cherry"],
    },
    "planar_laplace": {
        "id": "x",
        "title": "Where",
        "mechanism": "planar_laplace",
        "epsilon": 0.01,
        "region": REGION,
        "cell_size_m": 20,
    },
    "exponential_grid": {
        "id": "x",
        "title": "Which block",
        "mechanism": "exponential_grid",
        "metric": "euclidean",
        "epsilon": 0.01,
        "region": REGION,
        "cell_size_m": 20,
    },
    "geometric": {
        "id": "x",
        "title": "Age",
        "mechanism": "geometric",
        "epsilon": 0.5,
        "lo": 0,
        "hi": 120,
    },
    "hadamard_response": {
        "id": "x",
        "title": "Word",
        "mechanism": "hadamard_response",
        "epsilon": 1.0,
        "domain": ["apple", "banana", "cherry"],
    },
    "olh": {"id": "x", "title": "App", "mechanism": "olh", "epsilon": 1.0, "domain_size": 5000},
}
# A spec of several shapes (labels, a domain size, a region's cells; epsilon or a privacy level
# within a radius) is walked on one body per shape.
CELLS = {"epsilon": 1.0, "region": REGION, "cell_size_m": 20}
SHAPE_BASES = {mechanism: [base] for mechanism, base in SPEC_BASES.items()}
SHAPE_BASES["krr"].append({"id": "x", "title": "Where", "mechanism": "krr", **CELLS})
SHAPE_BASES["planar_laplace"].append(
    {"id": "x", "title": "Where", "mechanism": "planar_laplace", "region": REGION}
    | {"cell_size_m": 20, "privacy_level": 2, "privacy_radius_m": 200}
)
SHAPE_BASES["hadamard_response"] += [
    {"id": "x", "title": "Word", "mechanism": "hadamard_response", "epsilon": 1.0}
    | {"domain_size": 500},
    {"id": "x", "title": "Where", "mechanism": "hadamard_response", **CELLS},
]
SHAPE_BASES["olh"] += [
    {"id": "x", "title": "App", "mechanism": "olh", "epsilon": 1.0}
    | {"domain": ["apple", "banana", "cherry"]},
    {"id": "x", "title": "Where", "mechanism": "olh", **CELLS},
]


@pytest.fixture
def config(config):
    return {**config, "MAX_BATCH": MAX_BATCH}


@pytest.fixture
def served(client) -> dict[str, Any]:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def _resolve(schema: dict, document: dict) -> dict:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _bounds(schema: dict, document: dict, path: tuple = ()) -> Iterator[tuple[tuple, str, Any]]:
    """Every (path, keyword, value) bound in ``schema``; array items are walked at index 0."""
    schema = _resolve(schema, document)
    for keyword in BOUND_KEYWORDS:
        if keyword in schema and schema[keyword] is not False:
            yield path, keyword, schema
    for name, item in schema.get("properties", {}).items():
        yield from _bounds(item, document, (*path, name))
    if "items" in schema:
        yield from _bounds(schema["items"], document, (*path, 0))
    for choice in schema.get("oneOf", ()):
        yield from _bounds(choice, document, path)


def _field_name(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _set(body: Any, path: tuple, value: Any) -> Any:
    body = copy.deepcopy(body)
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return body


def _get(body: Any, path: tuple) -> Any:
    """The value at ``path``; None where the base body leaves an optional field out."""
    for part in path:
        if part not in body:
            return None
        body = body[part]
    return body


def _many(items: list, n: int) -> list:
    """``n`` distinct items like the first of ``items``: reports with fresh ids, or labels.

    Labels are as short as they can be: 100,000 of them fit in the 1 MiB body limit
    only if they average under about 7 characters.
    """
    first = items[0]
    if isinstance(first, dict):
        return [{**first, "report_id": str(uuid.uuid4())} for _ in range(n)]
    return [str(i) for i in range(n)]


def _boundary(keyword: str, schema: dict, current: Any) -> list[tuple[str, Any]]:
    """("inside", value) and ("outside", value) for one bound; None for an inside with none."""
    step = 1 if schema.get("type") == "integer" else 0.001
    if keyword == "minimum":
        low = schema["minimum"]
        if schema.get("exclusiveMinimum"):
            return [("inside", low + step), ("outside", low)]
        return [("inside", low), ("outside", low - step)]
    if keyword == "maximum":
        return [("inside", schema["maximum"]), ("outside", schema["maximum"] + step)]
    if keyword == "minLength":
        n = schema["minLength"]
        return [("inside", "x" * n), ("outside", "x" * (n - 1))]
    if keyword == "maxLength":
        n = schema["maxLength"]
        return [("inside", "x" * n), ("outside", "x" * (n + 1))]
    if keyword == "minItems":
        n = schema["minItems"]
        return [("inside", _many(current, n)), ("outside", _many(current, n - 1))]
    if keyword == "maxItems":
        n = schema["maxItems"]
        return [("inside", _many(current, n)), ("outside", _many(current, n + 1))]
    if keyword == "uniqueItems":
        return [("inside", current), ("outside", [*current[:-1], current[0]])]
    if keyword == "pattern":
        inside, outside = PATTERN_EXAMPLES[schema["pattern"]]
        return [("inside", inside and inside()), ("outside", outside)]
    if keyword == "enum":
        first = schema["enum"][0]
        outside = first + 0.01 if isinstance(first, float) else f"not-{first}"
        return [("inside", value) for value in schema["enum"]] + [("outside", outside)]
    assert keyword == "format" and schema["format"] == "uuid", schema
    return [("inside", str(uuid.uuid4()).upper()), ("outside", "not-a-uuid")]


def _with_companions(body: dict, path: tuple, keyword: str, value: Any) -> dict | None:
    """``body`` with ``path`` set to ``value`` and the fields that must agree with it.

    A region's other corner stays 0.001 degrees away on the inner side; a minimum
    at its upper bound (or a maximum at its lower one) has no inner side, so no
    valid body has it (None); a geometric range's ends likewise. The privacy level and radius come together, instead
    of epsilon.
    """
    if path[:1] == ("region",) and isinstance(value, (int, float)):
        axis, end = path[1].split("_")
        if (end, keyword) in (("min", "maximum"), ("max", "minimum")):
            return None
        other = f"{axis}_{'max' if end == 'min' else 'min'}"
        corner = value + 0.001 if end == "min" else value - 0.001
        return _set(_set(body, path, value), ("region", other), corner)
    if path in (("lo",), ("hi",)) and isinstance(value, int):
        # The other end of a geometric range stays 10 values away on the inner side.
        if (path[0], keyword) in (("lo", "maximum"), ("hi", "minimum")):
            return None
        other = ("hi",) if path == ("lo",) else ("lo",)
        return _set(_set(body, path, value), other, value + 10 if path == ("lo",) else value - 10)
    # An oracle takes a domain or a domain size: setting one drops the other.
    if path[:1] == ("domain",) and "domain_size" in body:
        body = {key: v for key, v in body.items() if key != "domain_size"}
        body["domain"] = SPEC_BASES["krr"]["domain"]
    if path == ("domain_size",) and "domain" in body:
        body = {key: v for key, v in body.items() if key != "domain"}
    if path in (("privacy_level",), ("privacy_radius_m",)):
        body = {key: v for key, v in body.items() if key != "epsilon"}
        body = {**body, "privacy_level": 0.001, "privacy_radius_m": 200}
    return _set(body, path, value)


class Walker:
    """Sends the bodies and query strings a walk needs, with fresh ids where they must differ."""

    def __init__(self, client, admin, analyst):
        self.client, self.admin, self.analyst = client, admin, analyst
        self.ids = (f"walk-{i}" for i in itertools.count())
        self.plain = self.create({**KRR_SPEC, "id": "plain"})
        self.enrolled = self.create({**KRR_SPEC, "id": "enrolled", "enrollment_required": True})

    def create(self, spec: dict) -> str:
        response = self.client.post(CAMPAIGNS, json=spec, headers=self.admin)
        assert response.status_code == 201, response.get_json()
        return spec["id"]

    def token(self) -> str:
        url = f"{CAMPAIGNS}/{self.enrolled}/enrollment-tokens"
        response = self.client.post(url, json={"count": 1}, headers=self.admin)
        return response.get_json()["tokens"][0]

    def spec(self, body: dict, path: tuple):
        if path != ("id",):
            body = {**body, "id": next(self.ids)}
        return self.client.post(CAMPAIGNS, json=body, headers=self.admin)

    def report(self, body: dict, path: tuple):
        campaign = self.enrolled if "enrollment_token" in path else self.plain
        if campaign == self.enrolled:
            body = copy.deepcopy(body)
            for report in body.get("reports", [body]):
                report.setdefault("enrollment_token", self.token())
        return self.client.post(f"{CAMPAIGNS}/{campaign}/reports", json=body)

    def update(self, body: dict, path: tuple):
        campaign = self.create({**KRR_SPEC, "id": next(self.ids)})
        return self.client.patch(f"{CAMPAIGNS}/{campaign}", json=body, headers=self.admin)

    def tokens(self, body: dict, path: tuple):
        url = f"{CAMPAIGNS}/{self.enrolled}/enrollment-tokens"
        return self.client.post(url, json=body, headers=self.admin)


SPEC_NAMES = {
    "RRSpec": "rr",
    "KRRSpec": "krr",
    "PlanarSpec": "planar_laplace",
    "GeometricSpec": "geometric",
    "ExponentialGridSpec": "exponential_grid",
    "HadamardSpec": "hadamard_response",
    "OLHSpec": "olh",
}


def _fits(base: dict, shape: dict) -> bool:
    """Whether ``base`` has the fields ``shape`` requires and no other than it describes."""
    return set(shape.get("required", ())) <= base.keys() <= shape["properties"].keys()


def _named_choices(schema: dict, document: dict) -> Iterator[tuple[str, dict]]:
    """(name, schema) of each body a request takes, through ``oneOf`` of named schemas."""
    resolved = _resolve(schema, document)
    for choice in resolved.get("oneOf", [schema]):
        ref = choice.get("$ref", "")
        name = ref.rsplit("/", 1)[1] if ref else "/".join(choice["required"])
        if name == "CampaignSpec":
            yield from _named_choices(choice, document)
        else:
            yield name, choice


def _body_cases(document: dict, walker: Walker):
    """(name, schema, base body, sender) for every request body the document describes; a
    schema of several shapes (``oneOf``) is walked shape by shape, each on its own body."""
    report = {"report_id": str(uuid.uuid4()), "value": "apple"}
    bases = {
        **{name: (SHAPE_BASES[mechanism], walker.spec) for name, mechanism in SPEC_NAMES.items()},
        "AdvisedSpec": (ADVISED_BASES, walker.spec),
        "Report": ([report], walker.report),
        "ReportBatch": ([{"reports": [report]}], walker.report),
        "status": ([{"status": "closed"}], walker.update),
        "count": ([{"count": 1}], walker.tokens),
    }
    for item in document["paths"].values():
        for method, operation in item.items():
            if method == "parameters" or "requestBody" not in operation:
                continue
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            for name, choice in _named_choices(schema, document):
                assert name in bases, f"no example body for {name}: add one to the walk"
                resolved = _resolve(choice, document)
                examples, send = bases[name]
                if "properties" in resolved:
                    yield name, resolved, examples[0], send
                    continue
                shapes = resolved["oneOf"]
                assert len(examples) == len(shapes), f"one example body per shape of {name}"
                for shape in shapes:
                    [base] = [base for base in examples if _fits(base, shape)]
                    yield name, shape, base, send


def test_every_documented_request_bound_is_enforced(served, client, admin, analyst):
    walker = Walker(client, admin, analyst)
    checked = set()
    for name, schema, base, send in _body_cases(served, walker):
        for path, keyword, node in _bounds(schema, served):
            current = _get(base, path) if path else base
            if current is None and path[:1] == ("domain",):
                # An oracle's base gives a domain size; its labels' bounds start from krr's.
                current = _get(SPEC_BASES["krr"], path)
            for side, value in _boundary(keyword, node, current):
                if value is None and keyword == "pattern":
                    value = walker.token()
                body = _with_companions(base, path, keyword, value)
                if body is None and side == "inside":
                    continue  # no valid body has this value (see _with_companions)
                body = body or _set(base, path, value)
                response = send(body, path)
                where = f"{name} {_field_name(path)} {keyword} {side} {value!r:.60}"
                if side == "inside":
                    assert response.status_code < 300, (where, response.get_json())
                else:
                    assert 400 <= response.status_code < 500, where
                    field = response.get_json()["error"]["field"]
                    expected = _field_name(path)
                    assert field == expected or field.startswith(f"{expected}["), (where, field)
                checked.add((name, _field_name(path), keyword, side))
    # The walk reached the bounds that matter most.
    for expected in [
        ("KRRSpec", "domain", "maxItems", "inside"),
        ("KRRSpec", "domain[0]", "maxLength", "outside"),
        ("KRRSpec", "cell_size_m", "minimum", "inside"),
        ("KRRSpec", "region.lat_max", "maximum", "inside"),
        ("KRRSpec", "epsilon", "minimum", "outside"),
        ("OLHSpec", "region.lon_min", "minimum", "outside"),
        ("HadamardSpec", "cell_size_m", "minimum", "outside"),
        ("PlanarSpec", "privacy_level", "minimum", "outside"),
        ("PlanarSpec", "region.lat_max", "maximum", "inside"),
        ("PlanarSpec", "region.lat_min", "minimum", "outside"),
        ("GeometricSpec", "lo", "minimum", "inside"),
        ("GeometricSpec", "hi", "maximum", "outside"),
        ("GeometricSpec", "epsilon", "maximum", "inside"),
        ("ExponentialGridSpec", "metric", "enum", "outside"),
        ("ExponentialGridSpec", "cell_size_m", "minimum", "inside"),
        ("OLHSpec", "domain_size", "maximum", "inside"),
        ("OLHSpec", "domain_size", "maximum", "outside"),
        ("HadamardSpec", "domain", "maxItems", "inside"),
        ("ReportBatch", "reports", "maxItems", "outside"),
        ("Report", "enrollment_token", "pattern", "inside"),
        ("count", "count", "maximum", "inside"),
        ("AdvisedSpec", "expected_users", "minimum", "outside"),
        ("AdvisedSpec", "hi", "maximum", "outside"),
    ]:
        assert expected in checked


def test_every_documented_query_bound_is_enforced(served, client, analyst, krr_campaign):
    for path, item in served["paths"].items():
        if "{campaign_id}" not in path:
            continue
        for parameter in item.get("parameters", []):
            if parameter["in"] != "query":
                continue
            schema = parameter["schema"]
            url = path.replace("{campaign_id}", krr_campaign["id"])
            for keyword in BOUND_KEYWORDS:
                if keyword not in schema:
                    continue
                for side, value in _boundary(keyword, schema, None):
                    response = client.get(
                        url, query_string={parameter["name"]: value}, headers=analyst
                    )
                    where = f"{path} {parameter['name']}={value} {side}"
                    refused = parameter["name"] == "method" and not_applicable(
                        Mechanism.from_spec(CampaignSpec.from_dict(KRR_SPEC)), value
                    )
                    if side == "inside" and refused:
                        # A method the campaign's mechanism cannot use.
                        assert response.status_code == 422, where
                        assert response.get_json()["error"]["code"] == "method_not_applicable"
                    elif side == "inside":
                        assert response.status_code == 200, where
                    else:
                        assert response.status_code == 422, where
                        assert response.get_json()["error"]["field"] == parameter["name"], where


def test_a_campaign_id_outside_its_pattern_is_not_found(served, client, analyst, krr_campaign):
    pattern = served["paths"]["/api/v1/campaigns/{campaign_id}"]["parameters"][0]["schema"]
    inside, outside = PATTERN_EXAMPLES[pattern["pattern"]]
    assert client.get(f"{CAMPAIGNS}/{krr_campaign['id']}").status_code == 200
    assert client.get(f"{CAMPAIGNS}/{outside}").status_code == 404
    assert client.get(f"{CAMPAIGNS}/{inside()}").status_code == 404  # well formed, but unknown


def _values(schema: Any, document: dict) -> Iterator[tuple[str, Any]]:
    """Every (keyword, value) pair anywhere in ``schema``, references followed."""
    if isinstance(schema, dict):
        schema = _resolve(schema, document)
        for key, value in schema.items():
            if key in BOUND_KEYWORDS:
                yield key, value
            yield from _values(value, document)
    elif isinstance(schema, list):
        for item in schema:
            yield from _values(item, document)


def test_every_enforced_bound_is_in_the_served_document(served):
    schemas = served["components"]["schemas"]
    # The validators' descriptors, as the server emits them, are the document's schemas.
    names = {
        "rr": "RRSpec",
        "krr": "KRRSpec",
        "planar_laplace": "PlanarSpec",
        "geometric": "GeometricSpec",
        "exponential_grid": "ExponentialGridSpec",
        "hadamard_response": "HadamardSpec",
        "olh": "OLHSpec",
    }
    for mechanism, descriptor in SPEC_SCHEMAS.items():
        assert schemas[names[mechanism]] == descriptor.schema()
    assert schemas["Report"] == REPORT.schema()
    assert schemas["ReportBatch"] == report_batch(MAX_BATCH).schema()
    parameters = {
        (path, parameter["name"]): parameter
        for path, item in served["paths"].items()
        for parameter in item.get("parameters", [])
    }
    estimate = "/api/v1/campaigns/{campaign_id}/estimate"
    for parameter in (METHOD, CONFIDENCE, FORMAT):
        assert parameters[(estimate, parameter.name)] == parameter.openapi()
    operations = served["paths"]
    tokens = operations["/api/v1/campaigns/{campaign_id}/enrollment-tokens"]["post"]
    assert tokens["requestBody"]["content"]["application/json"]["schema"] == TOKEN_REQUEST.schema()
    patch = operations["/api/v1/campaigns/{campaign_id}"]["patch"]
    assert patch["requestBody"]["content"]["application/json"]["schema"] == STATUS_UPDATE.schema()
    # And the limits those descriptors are built from are each in it, where they apply.
    found = set()
    for keyword, value in _values(served, served):
        found.add((keyword, tuple(value) if isinstance(value, list) else value))
    for bound in [
        ("maxItems", MAX_DOMAIN),
        ("maxLength", MAX_LABEL_LENGTH),
        ("maxLength", MAX_TITLE_LENGTH),
        ("maximum", MAX_EPSILON),
        ("maximum", MAX_GEOMETRIC_EPSILON),
        ("maximum", MAX_BOUND),
        ("minimum", -MAX_LATITUDE),
        ("maximum", MAX_LATITUDE),
        ("minimum", MIN_CELL_SIZE_M),
        ("maxItems", MAX_BATCH),
        ("maximum", MAX_TOKENS_PER_REQUEST),
        ("enum", tuple(METHODS)),
        ("enum", tuple(CONFIDENCE_LEVELS)),
        ("enum", tuple(FORMATS)),
        ("enum", tuple(STATUSES)),
        ("enum", PERIODS),
        ("pattern", f"^{CAMPAIGN_ID.pattern}$"),
        ("pattern", f"^{ENROLLMENT_TOKEN.pattern}$"),
    ]:
        assert bound in found, bound
    assert ("maxItems", 1000) not in found  # the batch limit is the setting, not a constant


def test_analyst_endpoints_name_the_analyst_scheme(served):
    schemes = served["components"]["securitySchemes"]
    assert set(schemes) == {"admin", "analyst"}
    for path in ("counts", "estimate"):
        operation = served["paths"][f"/api/v1/campaigns/{{campaign_id}}/{path}"]["get"]
        assert {"analyst": []} in operation["security"]
    create = served["paths"]["/api/v1/campaigns"]["post"]
    assert create["security"] == [{"admin": []}]

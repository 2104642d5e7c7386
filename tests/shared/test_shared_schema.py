"""Field descriptors: each check names the field, and each schema shows the bound checked."""

from __future__ import annotations

import functools
import math

import pytest

from aggregator.http.estimates import EstimateLimits
from aggregator.storage.retention import retention_seconds
from shared.errors import SpecError, ValidationError
from shared.schema import Array, Boolean, Number, Object, OneOf, String, is_positive_finite


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, True),
        (0.5, True),
        (1e-300, True),
        (10**300, True),
        (0, False),
        (-1, False),
        (math.nan, False),
        (math.inf, False),
        (-math.inf, False),
        (10**400, False),  # too large for a float: not an OverflowError
        (True, False),
        ("1", False),
        (None, False),
    ],
)
def test_is_positive_finite(value, expected):
    assert is_positive_finite(value) is expected


def test_settings_checked_with_the_positive_finite_helper_refuse_huge_integers_cleanly():
    # An integer too large for a float is refused as a bad value, not an OverflowError.
    with pytest.raises(ValueError, match="ESTIMATE_TIMEOUT_S"):
        EstimateLimits(timeout_s=10**400)
    with pytest.raises(ValueError, match="RETENTION_DAYS"):
        retention_seconds(10**400)


def refused(descriptor, value, field="f", error=ValidationError) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        descriptor.check(value, field, error)
    assert info.value.field is not None
    return info.value


def test_number_bounds_and_schema():
    epsilon = Number(minimum=0, exclusive_minimum=True, maximum=50)
    assert epsilon.schema() == {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 50,
    }
    assert epsilon.check(50, "epsilon") == 50.0
    assert epsilon.check(1e-9, "epsilon") == 1e-9
    for bad in (0, -1, 50.001, math.nan, math.inf, True, "1", 10**400):
        assert refused(epsilon, bad, "epsilon").field == "epsilon"
    count = Number(integer=True, minimum=1, maximum=3)
    assert count.schema() == {"type": "integer", "minimum": 1, "maximum": 3}
    for bad in (0, 4, 1.0, True):
        refused(count, bad)
    levels = Number(enum=(0.9, 0.95))
    assert levels.check(0.95, "c") == 0.95
    assert "0.9, 0.95" in refused(levels, 0.951).message


def test_string_bounds_pattern_enum_and_uuid():
    title = String(max_length=3, description="a title")
    assert title.schema() == {
        "type": "string",
        "minLength": 1,
        "maxLength": 3,
        "description": "a title",
    }
    assert title.check("abc", "title") == "abc"
    for bad in ("", "abcd", 3, None):
        assert refused(title, bad, "title").field == "title"
    token = String(pattern=r"[a-z]{2,3}", pattern_text="2 or 3 letters")
    assert token.schema() == {"type": "string", "pattern": "^[a-z]{2,3}$"}
    assert token.check("ab", "t") == "ab"
    for bad in ("a", "abcd", "ab\n", "AB"):
        assert "2 or 3 letters" in refused(token, bad).message
    choice = String(enum=("json", "csv"))
    assert choice.schema() == {"type": "string", "enum": ["json", "csv"]}
    for bad in ("xml", 1, None, ["json"]):
        refused(choice, bad)
    report_id = String(format="uuid")
    assert report_id.schema() == {"type": "string", "format": "uuid"}
    assert report_id.check("{12345678-1234-5678-1234-56781234567A}", "id") == (
        "12345678-1234-5678-1234-56781234567a"
    )
    refused(report_id, "not-a-uuid")


def test_array_names_the_item_at_fault():
    labels = Array(String(max_length=5), min_items=2, max_items=3, unique_items=True, noun="labels")
    assert labels.schema() == {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": 5},
        "minItems": 2,
        "maxItems": 3,
        "uniqueItems": True,
    }
    assert labels.check(["a", "b"], "domain") == ["a", "b"]
    assert refused(labels, ["a"], "domain").field == "domain"
    assert refused(labels, ["a", "b", "c", "d"], "domain").field == "domain"
    assert refused(labels, ("a", "b"), "domain").field == "domain"
    assert refused(labels, ["a", "toolong"], "domain").field == "domain[1]"
    assert refused(labels, ["a", "b", "a"], "domain").field == "domain[2]"


def test_object_refuses_unknown_then_missing_then_bad_values_with_dotted_fields():
    region = Object(
        {"lat": Number(minimum=-85, maximum=85), "lon": Number()}, required=("lat", "lon")
    )
    schema = region.schema()
    assert schema["additionalProperties"] is False and schema["required"] == ["lat", "lon"]
    assert region.check({"lat": 1, "lon": 2}, "region") == {"lat": 1.0, "lon": 2.0}
    assert refused(region, {"lat": 1, "lon": 2, "alt": 3}, "region").field == "region.alt"
    assert refused(region, {"lat": 1}, "region").field == "region.lon"
    assert refused(region, {"lat": 86, "lon": 2}, "region").field == "region.lat"
    assert refused(region, [1, 2], "region").field == "region"
    with pytest.raises(ValidationError) as info:
        region.check({"lat": 1}, None)
    assert info.value.field == "lon"


def test_the_error_class_or_factory_is_the_callers():
    error = refused(Boolean(), "yes", "enrollment_required", SpecError)
    assert isinstance(error, SpecError) and error.code == "invalid_spec"
    factory = functools.partial(ValidationError, code="invalid_parameter")
    assert refused(String(enum=("a",)), "b", "format", factory).code == "invalid_parameter"


def test_one_of_picks_the_shape_by_json_type():
    value = OneOf((String(min_length=0), Object({"lat": Number()}, required=("lat",))))
    assert value.schema()["oneOf"][1]["required"] == ["lat"]
    assert value.check("apple", "value") == "apple"
    assert value.check({"lat": 1}, "value") == {"lat": 1.0}
    assert refused(value, {"lon": 1}, "value").field == "value.lon"
    assert "a string or an object" in refused(value, 3, "value").message
    assert refused(value, True, "value").field == "value"

"""Field descriptors: one description of a JSON value that both checks it and documents it.

Each descriptor validates an already parsed JSON value, raising the caller's
:class:`~shared.errors.ValidationError` subclass with the dotted ``field`` path
(``region.lat_min``, ``reports[3].report_id``), and emits the same bounds as an
OpenAPI 3.0 schema object, so that a bound is written once and the document
cannot drift from the checks. Rules that tie several fields together (a
region's minimum below its maximum, a grid's number of cells) stay next to the
parsing that needs them; a descriptor's ``description`` says so in words.

Standard library only: the client imports this through :mod:`shared.spec`.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ValidationError

# What a check raises: a ValidationError subclass, or a factory taking (message, field=...)
# such as ``functools.partial(ValidationError, code="invalid_parameter")``.
ErrorType = Callable[..., ValidationError]


def is_positive_finite(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool), finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float
        return False


def positive_finite(value: Any, name: str) -> float:
    """``value`` as a float if it is a real number, finite and > 0, for a constructor's argument.

    TypeError for a non-number (booleans included), ValueError for one out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not is_positive_finite(value):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


def finite_number(value: Any, field: str, error: ErrorType = ValidationError) -> float:
    """A JSON number as a finite float; booleans, strings, NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{field} must be a number, got {type(value).__name__}", field=field)
    try:
        number = float(value)
    except OverflowError:
        raise error(f"{field} is too large", field=field) from None
    if not math.isfinite(number):
        raise error(f"{field} must be finite, got {value!r}", field=field)
    return number


def _with_description(schema: dict[str, Any], description: str) -> dict[str, Any]:
    if description:
        schema["description"] = description
    return schema


@dataclass(frozen=True)
class Number:
    """A finite JSON number (or integer) within optional bounds."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    integer: bool = False
    enum: tuple[float, ...] | None = None
    description: str = ""
    # The minimum in words, for the error message (its value by default).
    minimum_text: str = ""

    def check(self, value: Any, field: str, error: ErrorType = ValidationError) -> float:
        """``value`` if it is a number within the bounds (an int when ``integer``)."""
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int):
                raise error(f"{field} must be an integer", field=field)
            number: float = value
        else:
            number = finite_number(value, field, error)
        if self.enum is not None and number not in self.enum:
            raise error(f"{field} must be one of {', '.join(map(str, self.enum))}", field=field)
        if self.minimum is not None:
            if self.exclusive_minimum:
                if not number > self.minimum:
                    raise error(f"{field} must be > {self.minimum}, got {number!r}", field=field)
            elif not number >= self.minimum:
                least = self.minimum_text or self.minimum
                raise error(f"{field} must be at least {least}, got {number!r}", field=field)
        if self.maximum is not None and not number <= self.maximum:
            raise error(f"{field} must be at most {self.maximum}, got {number!r}", field=field)
        return number

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer" if self.integer else "number"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
            if self.exclusive_minimum:
                out["exclusiveMinimum"] = True
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.enum is not None:
            out["enum"] = list(self.enum)
        return _with_description(out, self.description)


@dataclass(frozen=True)
class String:
    """A JSON string: length bounds, a pattern (matched whole), a set of values, or a UUID.

    ``format="uuid"`` accepts what :class:`uuid.UUID` parses (any case, with or
    without hyphens or braces) and returns it in canonical form (lower case,
    hyphenated); the other bounds then do not apply.
    """

    min_length: int = 1
    max_length: int | None = None
    pattern: str | None = None
    # The pattern in words, for the error message.
    pattern_text: str = ""
    enum: tuple[str, ...] | None = None
    format: str | None = None
    description: str = ""

    def check(self, value: Any, field: str, error: ErrorType = ValidationError) -> str:
        if self.enum is not None:
            if value not in self.enum or not isinstance(value, str):
                raise error(
                    f"{field} must be one of {', '.join(self.enum)}, got {value!r}", field=field
                )
            return value
        if not isinstance(value, str):
            raise error(f"{field} must be a string, got {type(value).__name__}", field=field)
        if self.format == "uuid":
            try:
                return str(uuid.UUID(value))
            except ValueError:
                raise error(f"{field} must be a UUID", field=field) from None
        if self.pattern is not None:
            if not re.fullmatch(self.pattern, value):
                raise error(f"{field} must be {self.pattern_text or self.pattern}", field=field)
            return value
        if len(value) < self.min_length or (
            self.max_length is not None and len(value) > self.max_length
        ):
            upper = "" if self.max_length is None else f" to {self.max_length}"
            raise error(f"{field} must have {self.min_length}{upper} characters", field=field)
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string"}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        elif self.format is not None:
            out["format"] = self.format
        elif self.pattern is not None:
            # Anchored: the check matches the whole string.
            out["pattern"] = f"^{self.pattern}$"
        else:
            if self.min_length:
                out["minLength"] = self.min_length
            if self.max_length is not None:
                out["maxLength"] = self.max_length
        return _with_description(out, self.description)


@dataclass(frozen=True)
class Boolean:
    """``true`` or ``false``."""

    description: str = ""

    def check(self, value: Any, field: str, error: ErrorType = ValidationError) -> bool:
        if not isinstance(value, bool):
            raise error(f"{field} must be true or false", field=field)
        return value

    def schema(self) -> dict[str, Any]:
        return _with_description({"type": "boolean"}, self.description)


@dataclass(frozen=True)
class Array:
    """A JSON list of ``items``, with bounds on its length and optionally distinct items.

    :meth:`check` checks the list itself and each item, naming an item's field
    ``{field}[i]``; a repeated item is named at its second occurrence.
    """

    items: Descriptor
    min_items: int = 0
    max_items: int | None = None
    unique_items: bool = False
    description: str = ""
    # What the list holds, in words, for the error messages.
    noun: str = "items"

    def check_length(self, value: Any, field: str, error: ErrorType = ValidationError) -> list[Any]:
        if not isinstance(value, list):
            raise error(f"{field} must be a list of {self.noun}", field=field)
        if len(value) < self.min_items or (
            self.max_items is not None and len(value) > self.max_items
        ):
            if self.max_items == self.min_items:
                bounds = f"exactly {self.min_items}"
            elif self.max_items is None:
                bounds = f"at least {self.min_items}"
            else:
                bounds = f"{self.min_items} to {self.max_items}"
            raise error(f"{field} must have {bounds} {self.noun}, got {len(value)}", field=field)
        return value

    def check(self, value: Any, field: str, error: ErrorType = ValidationError) -> list[Any]:
        items = [
            self.items.check(item, f"{field}[{i}]", error)
            for i, item in enumerate(self.check_length(value, field, error))
        ]
        if self.unique_items:
            seen: set[Any] = set()
            for i, item in enumerate(items):
                if item in seen:
                    raise error(f"duplicate {item!r} in {field}", field=f"{field}[{i}]")
                seen.add(item)
        return items

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.items.schema()}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        if self.unique_items:
            out["uniqueItems"] = True
        return _with_description(out, self.description)


@dataclass(frozen=True)
class Object:
    """A JSON object with known properties; unknown keys are refused, ``required`` must be there.

    :meth:`check` refuses the first unknown key (sorted), then the first missing
    required one, then checks each present property; it returns a new dict of
    the checked values. A property is named ``{prefix}{name}``.
    """

    properties: Mapping[str, Descriptor]
    required: Sequence[str] = ()
    description: str = ""
    noun: str = "an object"
    extra_schema: Mapping[str, Any] = field(default_factory=dict)

    def check_keys(
        self, value: Any, field: str | None, error: ErrorType = ValidationError
    ) -> dict[str, Any]:
        """``value`` as a dict with no unknown and no missing key; values are not checked."""
        prefix = f"{field}." if field else ""
        if not isinstance(value, dict):
            raise error(f"{field or 'the body'} must be {self.noun}", field=field)
        unknown = value.keys() - self.properties.keys()
        if unknown:
            first = min(unknown)
            raise error(f"unknown field {first!r}", field=f"{prefix}{first}")
        for name in self.required:
            if name not in value:
                raise error(f"{prefix}{name} is required", field=f"{prefix}{name}")
        return value

    def check(
        self, value: Any, field: str | None, error: ErrorType = ValidationError
    ) -> dict[str, Any]:
        prefix = f"{field}." if field else ""
        self.check_keys(value, field, error)
        return {
            name: self.properties[name].check(value[name], f"{prefix}{name}", error)
            for name in self.properties
            if name in value
        }

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: item.schema() for name, item in self.properties.items()},
        }
        if self.required:
            out["required"] = list(self.required)
        out.update(self.extra_schema)
        return _with_description(out, self.description)


@dataclass(frozen=True)
class OneOf:
    """A value of one of several shapes, told apart by their JSON type (a string or an object)."""

    choices: tuple[Descriptor, ...]
    description: str = ""

    def check(self, value: Any, field: str, error: ErrorType = ValidationError) -> Any:
        for choice in self.choices:
            if isinstance(value, _JSON_TYPES[type(choice)]) and not (
                isinstance(value, bool) and not isinstance(choice, Boolean)
            ):
                return choice.check(value, field, error)
        kinds = " or ".join(_JSON_NAMES[type(choice)] for choice in self.choices)
        raise error(f"{field} must be {kinds}, got {type(value).__name__}", field=field)

    def schema(self) -> dict[str, Any]:
        return _with_description(
            {"oneOf": [choice.schema() for choice in self.choices]}, self.description
        )


@dataclass(frozen=True)
class Shapes:
    """An object of exactly one of several shapes, each an :class:`Object` with its own
    required properties (a domain of labels, a domain size, a region and its grid).

    No value may fit two shapes: each shape requires a property the others do not
    have. The schema is the shapes' ``oneOf``. :meth:`check` checks the properties
    as :meth:`merged` (every property of any shape) does; which shape a value has is
    left to the caller, which refuses a mix in its own words, naming the field.
    """

    choices: tuple[Object, ...]
    description: str = ""

    @property
    def properties(self) -> dict[str, Descriptor]:
        """Every shape's properties (one that several shapes have, as the last describes it)."""
        return {name: item for choice in self.choices for name, item in choice.properties.items()}

    @property
    def required(self) -> tuple[str, ...]:
        """What every shape requires."""
        first, *others = self.choices
        return tuple(name for name in first.required if all(name in o.required for o in others))

    def merged(self) -> Object:
        """One object with every shape's properties, requiring what every shape requires."""
        return Object(self.properties, self.required, self.description, self.choices[0].noun)

    def check(
        self, value: Any, field: str | None, error: ErrorType = ValidationError
    ) -> dict[str, Any]:
        return self.merged().check(value, field, error)

    def schema(self) -> dict[str, Any]:
        return _with_description(
            {"oneOf": [choice.schema() for choice in self.choices]}, self.description
        )


Descriptor = Number | String | Boolean | Array | Object | OneOf | Shapes
_JSON_TYPES: dict[type, type | tuple[type, ...]] = {
    Number: (int, float),
    String: str,
    Boolean: bool,
    Array: list,
    Object: dict,
    Shapes: dict,
}
_JSON_NAMES = {
    Number: "a number",
    String: "a string",
    Boolean: "a boolean",
    Array: "a list",
    Object: "an object",
    Shapes: "an object",
}

"""Query parameters, each described once: parsed with its descriptor, documented from it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ValidationError
from shared.schema import Number, String

# A query parameter that is not one the endpoint offers, or not a value it takes.
invalid_parameter = functools.partial(ValidationError, code="invalid_parameter")


@dataclass(frozen=True)
class QueryParameter:
    """One query parameter: its name, the values it takes and its default."""

    name: str
    values: String | Number
    default: Any
    description: str = ""
    # OpenAPI extensions ("x-..." keys) of the parameter object.
    extensions: dict[str, Any] = field(default_factory=dict)

    def parse(self, raw: str | None) -> Any:
        """The parameter's value from the query string (its default when absent)."""
        if raw is None:
            return self.default
        if isinstance(self.values, Number) and self.values.integer:
            # Digits only: "1e3", "30.0" and "+5" are not the integers they may stand for.
            value: Any = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else raw
            return self.values.check(value, self.name, invalid_parameter)
        if isinstance(self.values, Number):
            try:
                number = float(raw)
            except ValueError:
                number = math.nan
            return self.values.check(number, self.name, invalid_parameter)
        return self.values.check(raw, self.name, invalid_parameter)

    def openapi(self) -> dict[str, Any]:
        """The parameter object of the OpenAPI document."""
        out: dict[str, Any] = {
            "name": self.name,
            "in": "query",
            "schema": self.values.schema(),
        }
        if self.default is not None:
            out["schema"]["default"] = self.default
        if self.description:
            out["description"] = self.description
        return {**out, **self.extensions}

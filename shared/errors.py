"""Errors shared by the client and the aggregator.

The tree::

    LDPError
     └── ValidationError (also a ValueError)
          ├── SpecError      a campaign spec is malformed or violates a constraint
          └── ReportError    a report does not fit its campaign

Every error carries a ``message``, a stable machine-readable ``code`` (a
class default, or given) and, where one input is at fault, the ``field`` (a
dotted path such as ``region.lat_min`` or ``reports[3].value``); ``to_dict()``
is the ``{"code", "message", "field"}`` shape the HTTP layer puts on the wire.
The client's and the aggregator's own errors derive from :class:`LDPError`.
"""

from __future__ import annotations


class LDPError(Exception):
    """Base class of every error raised by this project."""

    code = "error"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "field": self.field}


class ValidationError(LDPError, ValueError):
    """Input that does not satisfy the protocol."""

    code = "invalid"


class SpecError(ValidationError):
    """A campaign spec that cannot be accepted."""

    code = "invalid_spec"


class ReportError(ValidationError):
    """A report that does not fit its campaign."""

    code = "invalid_report"

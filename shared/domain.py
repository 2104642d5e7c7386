"""The value set of a large-domain frequency oracle: labels, or the integers ``0..K-1``.

A campaign over a few thousand named categories lists them (``domain``); one
over up to a million values (zip codes, app ids, hashed words) gives only their
number (``domain_size``) and its values are the integers ``0 .. K - 1``, which
the caller maps to and from its own identifiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.errors import ReportError
from shared.geo import Grid


class Domain:
    """Either a tuple of distinct labels or a size ``K`` (values ``0 .. K - 1``).

    Parameters
    ----------
    labels : sequence of str, optional
        At least two distinct labels.
    size : int, optional
        At least 2; exactly one of ``labels`` and ``size`` is given.
    """

    def __init__(self, *, labels: Sequence[str] | None = None, size: int | None = None):
        if (labels is None) == (size is None):
            raise TypeError("give exactly one of domain (labels) and domain_size")
        self.labels: tuple[str, ...] | None
        if labels is not None:
            if isinstance(labels, str) or not isinstance(labels, Sequence):
                raise TypeError("domain must be a sequence of labels")
            values = tuple(labels)
            if not all(isinstance(label, str) for label in values):
                raise TypeError("domain labels must be strings")
            # The index doubles as the distinctness check (one hashing pass over the labels).
            index = dict(zip(values, range(len(values)), strict=True))
            if len(values) < 2 or len(index) != len(values):
                raise ValueError(f"domain must have at least 2 distinct labels, got {len(values)}")
            self.labels = values
            self.size = len(values)
            # Each label's index (None for a domain given by its size).
            self.positions: dict[str, int] | None = index
        else:
            if isinstance(size, bool) or not isinstance(size, int):
                raise TypeError(f"domain_size must be an integer, got {type(size).__name__}")
            if size < 2:
                raise ValueError(f"domain_size must be at least 2, got {size}")
            self.labels = None
            self.size = size
            self.positions = None

    def index(self, value: Any, field: str = "value") -> int:
        """The index of a true value; :class:`ReportError` if it is not in the domain."""
        if self.positions is not None:
            if not isinstance(value, str) or value not in self.positions:
                raise ReportError("the value is not one of the campaign's labels", field=field)
            return self.positions[value]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.size:
            raise ReportError(f"the value must be an integer in [0, {self.size})", field=field)
        return value

    def value(self, x: int) -> str | int:
        """The value of index ``x``: its label, or ``x`` itself."""
        return self.labels[x] if self.labels is not None else x


class OverDomain:
    """What a mechanism whose true values are a :class:`Domain` (``self.values``) exposes.

    Where the values are a region's cells (``self.grid``), a true value is a location,
    snapped to its cell (:meth:`shared.geo.Grid.locate`).
    """

    values: Domain
    grid: Grid | None = None

    @property
    def k(self) -> int:
        """The number of values."""
        return self.values.size

    @property
    def domain(self) -> tuple[str, ...] | None:
        """The labels, or ``None`` where the values are the integers ``0 .. k - 1``."""
        return self.values.labels

    @property
    def n_inputs(self) -> int:
        return self.k

    def encode(self, value: Any) -> int:
        if self.grid is not None:
            return self.grid.locate(value)
        return self.values.index(value)

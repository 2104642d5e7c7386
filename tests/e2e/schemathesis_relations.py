"""Schemathesis hook: the spec rules that relate fields, which OpenAPI 3.0 cannot state.

The served document describes each mechanism's spec exactly where JSON Schema
can: its fields and their bounds, and one object per shape (labels, a domain
size, a region and its grid), so no body mixes two. What it cannot state is an
order or a count across fields: a region's minimum below its maximum and small
enough for one planar projection, a grid of at most so many cells, ``lo`` below
``hi`` and at most 100,000 values apart, a location epsilon that the grid's
sampler resolves. The document says these in words (the fields' descriptions);
a body generated from the document breaks them by chance and is refused with a
422 that names the field.

``filter_failure`` drops a "schema-valid request rejected" failure (ST202) when,
and only when, the refusal is one of those rules: a 422 ``invalid_spec`` whose
field and message are listed in :data:`RELATIONS`. Every other failure, and
every other refusal of a schema-valid body, still fails the run, and
schemathesis counts the dropped ones in its summary. Loaded with
``SCHEMATHESIS_HOOKS=schemathesis_relations`` (this directory on the path).
"""

from __future__ import annotations

import json
import re

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

# (field, message) of each refusal that only a relation between fields explains.
RELATIONS = [
    # A region's minimum below its maximum, on each axis.
    (r"region\.(lat|lon)_min", r"region\.(lat|lon)_min must be below (lat|lon)_max"),
    # A region small enough for one planar projection (its extent against its latitude).
    ("region", r"the region is too large for one planar projection"),
    # The region's grid: at most so many cells for the mechanism, at least two values.
    (
        "cell_size_m",
        r"the grid would have \d+ x \d+ cells?; (at most [\d,]+ are allowed|\w+ needs)",
    ),
    # An integer range: lo below hi, at most 100,000 values.
    ("lo", r"lo must be below hi"),
    ("hi", r"the range \[-?\d+, -?\d+\] holds [\d,]+ values; at most"),
    # A location epsilon against the grid (the planar sampler's resolution and reach, the
    # exponential mechanism's loss between neighbouring cells), given as epsilon or as a level
    # within a radius.
    (
        "epsilon|privacy_level",
        r"epsilon \S+ per metre (is too (small|large)|times the)"
        r"|the grid must be under 2\*\*47 cells across"
        r"|privacy_level / privacy_radius_m = .* per metre; it must be a finite epsilon",
    ),
]


def is_relation(status: int, body: str) -> bool:
    """Whether a refusal is one of :data:`RELATIONS`."""
    if status != 422:
        return False
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    if error.get("code") != "invalid_spec":
        return False
    return any(
        re.fullmatch(field, error.get("field") or "") and re.match(message, error["message"])
        for field, message in RELATIONS
    )


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keep every failure but an ST202 whose refusal is a relation between fields."""
    if isinstance(failure, RejectedPositiveData):
        return not is_relation(response.status_code, response.text)
    return True

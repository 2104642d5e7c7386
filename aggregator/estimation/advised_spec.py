"""A campaign created without a mechanism: the request's domain ranked, the best hosted taken.

The ranking is :mod:`aggregator.estimation.advice`'s; this module reads the request body,
checks what a spec with a mechanism would check before anything is ranked, and builds the
spec of the first option the service hosts.
"""

from __future__ import annotations

import math
from typing import Any

from aggregator.estimation.advice import Option, rank_categorical, rank_range
from aggregator.estimation.region_advice import rank_grid
from shared.errors import SpecError
from shared.geo import Grid
from shared.spec import (
    ADVISED_SCHEMA,
    DEFAULT_EXPECTED_USERS,
    GEOMETRIC,
    MAX_CELLS,
    MAX_EPSILON,
    PLANAR_LAPLACE,
    CampaignSpec,
    check_krr_epsilon,
    check_range,
)


def _advised_ranking(values: dict[str, Any], n: int) -> tuple[list[Option], list[dict[str, Any]]]:
    """The ranking for a request's domain, and the spec fields of each option (same order)."""
    forms = [
        name
        for name, fields in (
            ("domain", ("domain",)),
            ("lo and hi", ("lo", "hi")),
            ("region with cell_size_m", ("region", "cell_size_m")),
        )
        if any(f in values for f in fields)
    ]
    if len(forms) != 1:
        raise SpecError(
            "give one domain: domain (labels), lo and hi (an integer range), or region with "
            "cell_size_m" + (f"; got {' and '.join(forms)}" if forms else ""),
            field="domain",
        )
    planar_fields = ("privacy_level", "privacy_radius_m")
    if forms[0] != "region with cell_size_m":
        for name in planar_fields:
            if name in values:
                raise SpecError(f"{name} applies only to a region", field=name)
        if "epsilon" not in values:
            raise SpecError("epsilon is required", field="epsilon")
        epsilon = values["epsilon"]
        if epsilon > MAX_EPSILON:
            raise SpecError(
                f"epsilon must be at most {MAX_EPSILON}, got {epsilon!r}", field="epsilon"
            )
    if forms[0] == "domain":
        labels = list(values["domain"])
        # Every mechanism for labels takes the epsilons k-RR's weights exist for: refused
        # here as the spec with a mechanism refuses them, before any closed form is computed.
        check_krr_epsilon(epsilon, len(labels))
        ranking = rank_categorical(len(labels), epsilon, n)
        return ranking, [{"domain": labels} for _ in ranking]
    if forms[0] == "lo and hi":
        for name in ("lo", "hi"):
            if name not in values:
                raise SpecError(f"{name} is required for a range", field=name)
        lo, hi = int(values["lo"]), int(values["hi"])
        check_range(lo, hi)
        ranking = rank_range(lo, hi, epsilon, n)
        labels = [str(v) for v in range(lo, hi + 1)]
        fields = [
            {"lo": lo, "hi": hi} if o.mechanism == GEOMETRIC else {"domain": labels}
            for o in ranking
        ]
        return ranking, fields
    for name in ("region", "cell_size_m"):
        if name not in values:
            raise SpecError(f"{name} is required for a region", field=name)
    region_fields = {
        name: values[name]
        for name in ("region", "cell_size_m", "epsilon", *planar_fields)
        if name in values
    }
    epsilon = _region_epsilon(values)
    ranking = rank_grid(_grid(values), epsilon, n)
    # Only planar Laplace's spec takes the privacy level form; the others get their epsilon.
    grid_fields = {"region": values["region"], "cell_size_m": values["cell_size_m"]}
    return ranking, [
        region_fields if o.mechanism == PLANAR_LAPLACE else grid_fields for o in ranking
    ]


def _grid(values: dict[str, Any]) -> Grid:
    """The request's region and grid, checked as every region spec checks them (the largest
    grid any takes; a mechanism that takes fewer cells is refused when its spec is built)."""
    return CampaignSpec.parse_grid(values, "a region", max_cells=MAX_CELLS, stored=False)


def _region_epsilon(values: dict[str, Any]) -> float:
    """A region's epsilon per metre, its privacy fields checked as a spec with a mechanism
    checks them (:class:`SpecError` naming the field, before anything is ranked)."""
    level, radius = values.get("privacy_level"), values.get("privacy_radius_m")
    if (level is None) != (radius is None):
        raise SpecError(
            "privacy_level and privacy_radius_m go together",
            field="privacy_level" if level is None else "privacy_radius_m",
        )
    derived = None if level is None or radius is None else level / radius
    if derived is not None and not (math.isfinite(derived) and derived > 0):
        raise SpecError(
            f"privacy_level / privacy_radius_m = {level!r} / {radius!r} is {derived!r} per "
            "metre; it must be a finite epsilon above 0",
            field="privacy_level",
        )
    if "epsilon" not in values:
        if derived is None:
            raise SpecError(
                "give epsilon (per metre) or privacy_level with privacy_radius_m", field="epsilon"
            )
        return derived
    epsilon = float(values["epsilon"])
    if derived is not None and not math.isclose(epsilon, derived, rel_tol=1e-12):
        raise SpecError(
            f"epsilon {epsilon!r} disagrees with privacy_level / privacy_radius_m = {derived!r}",
            field="epsilon",
        )
    return epsilon


def spec_and_advice(data: Any) -> tuple[CampaignSpec, dict[str, Any] | None]:
    """The spec a campaign-creation body asks for, and the advice behind it when the body
    names no mechanism (:func:`advise_spec`; ``None`` otherwise). Raises :class:`SpecError`."""
    if isinstance(data, dict) and "mechanism" not in data:
        return advise_spec(data)
    if isinstance(data, dict) and "expected_users" in data:
        raise SpecError(
            "expected_users applies only when the server chooses the mechanism "
            "(a campaign created without one)",
            field="expected_users",
        )
    return CampaignSpec.from_dict(data), None


def advise_spec(data: Any) -> tuple[CampaignSpec, dict[str, Any]]:
    """The spec of a campaign created without a mechanism, and the advice behind it.

    ``data`` is a request body of :data:`shared.spec.ADVISED_SCHEMA`. The
    mechanisms for its domain are ranked at ``expected_users`` (default
    :data:`shared.spec.DEFAULT_EXPECTED_USERS`) and the first the service hosts
    whose spec is valid is taken. Raises :class:`SpecError` naming the field.
    """
    values = ADVISED_SCHEMA.check(data, None, SpecError)
    n = int(values.pop("expected_users", DEFAULT_EXPECTED_USERS))
    common: dict[str, Any] = {
        name: values.pop(name)
        for name in ("id", "title", "enrollment_required", "period")
        if name in values
    }
    ranking, fields = _advised_ranking(values, n)
    first_error: SpecError | None = None
    for option, extra in zip(ranking, fields, strict=True):
        if not option.hosted:
            continue
        body: dict[str, Any] = {**common, **extra, "mechanism": option.mechanism}
        if "metric" in option.details:
            body["metric"] = option.details["metric"]
        if option.mechanism != PLANAR_LAPLACE:
            body["epsilon"] = option.epsilon
        try:
            spec = CampaignSpec.from_dict(body)
        except SpecError as exc:
            first_error = first_error or exc
            continue
        best = ranking[0]
        why = f"{option.mechanism}: {option.why}"
        if option.expected_mse is not None:
            why += f"; expected squared error {option.expected_mse:.3g} at {n:,} users"
        if best is not option:
            why += f"; {best.mechanism} would be better" + (
                "" if best.hosted else " but this service does not host it yet"
            )
        advice = {
            "chosen": option.mechanism,
            "why": why,
            "expected_users": n,
            "ranking": [o.to_dict() for o in ranking],
        }
        return spec, advice
    if first_error is not None:
        raise first_error
    raise SpecError("no mechanism this service hosts fits this domain", field="domain")

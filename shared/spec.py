"""Campaign specs: parsing, validation, canonical form and hash.

A spec is parsed once, at the edge, into an immutable :class:`CampaignSpec`;
everything after that trusts it. The canonical form is JSON with sorted keys,
no white space and floats in their shortest round-trip form, leaving out
optional fields that hold their defaults; its SHA-256 is the spec hash, the
same on every machine, which clients pin.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shared.errors import SpecError, ValidationError
from shared.exactness import check_planar_epsilon, krr_weights
from shared.geo import Grid, Region

RR = "rr"
KRR = "krr"
PLANAR_LAPLACE = "planar_laplace"
MECHANISMS = (RR, KRR, PLANAR_LAPLACE)

RR_DEFAULT_DOMAIN = ("no", "yes")
MIN_DOMAIN = 2
MAX_DOMAIN = 100_000
MAX_LABEL_LENGTH = 200
MAX_TITLE_LENGTH = 200
# Categorical epsilon above this gives no meaningful protection.
MAX_EPSILON = 50.0
MIN_CELL_SIZE_M = 1.0
# A region's projected distances may overstate great-circle ones by at most this factor (the
# client charges the factor; see Region.projection_distortion).
MAX_PROJECTION_DISTORTION = 1.1
MAX_CELLS = 512 * 512
# Checked with fullmatch: "$" would also accept a trailing newline.
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")

# Fields the server adds when it serves a spec; not part of the hashed spec.
SERVER_FIELDS = frozenset({"status", "spec_hash", "created_at"})
_SPEC_FIELDS = frozenset(
    {
        "id",
        "title",
        "mechanism",
        "epsilon",
        "domain",
        "region",
        "cell_size_m",
        "privacy_level",
        "privacy_radius_m",
        "enrollment_required",
    }
)
_REGION_FIELDS = ("lat_min", "lat_max", "lon_min", "lon_max")


def finite_number(value: Any, field: str, error: type[ValidationError] = SpecError) -> float:
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


def _positive(value: Any, field: str) -> float:
    number = finite_number(value, field)
    if number <= 0:
        raise SpecError(f"{field} must be > 0, got {number!r}", field=field)
    return number


def _string(value: Any, field: str, max_length: int) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{field} must be a string, got {type(value).__name__}", field=field)
    if not value or len(value) > max_length:
        raise SpecError(f"{field} must have 1 to {max_length} characters", field=field)
    return value


@dataclass(frozen=True)
class CampaignSpec:
    """The immutable description of a collection campaign.

    ``epsilon`` is the local-DP parameter for ``rr`` and ``krr`` and the
    geo-indistinguishability parameter, per metre, for ``planar_laplace``.
    """

    id: str
    title: str
    mechanism: str
    epsilon: float
    domain: tuple[str, ...] | None = None
    region: Region | None = None
    cell_size_m: float | None = None
    privacy_level: float | None = None
    privacy_radius_m: float | None = None
    enrollment_required: bool = False

    @classmethod
    def from_dict(cls, data: Any, *, stored: bool = False) -> CampaignSpec:
        """Parse and validate a spec; raise :class:`SpecError` naming the field.

        ``stored=True`` reads a spec the server accepted earlier: the limits that
        only bind new campaigns (a region's projection distortion, whose cost the
        client charges anyway) are not applied, so a campaign created before such
        a limit existed stays readable with all its reports.
        """
        if not isinstance(data, dict):
            raise SpecError("a campaign spec must be a JSON object", field=None)
        unknown = sorted(set(data) - _SPEC_FIELDS)
        if unknown:
            raise SpecError(f"unknown field {unknown[0]!r}", field=unknown[0])
        for required in ("id", "title", "mechanism"):
            if required not in data:
                raise SpecError(f"{required} is required", field=required)
        campaign_id = data["id"]
        if not isinstance(campaign_id, str) or not ID_PATTERN.fullmatch(campaign_id):
            raise SpecError(
                "id must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit",
                field="id",
            )
        title = _string(data["title"], "title", MAX_TITLE_LENGTH)
        mechanism = data["mechanism"]
        if mechanism not in MECHANISMS:
            raise SpecError(
                f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}",
                field="mechanism",
            )
        enrollment = data.get("enrollment_required", False)
        if not isinstance(enrollment, bool):
            raise SpecError(
                "enrollment_required must be true or false", field="enrollment_required"
            )
        common = {"id": campaign_id, "title": title, "enrollment_required": enrollment}
        if mechanism == PLANAR_LAPLACE:
            return cls._planar_from_dict(data, common, stored=stored)
        return cls._categorical_from_dict(data, mechanism, common)

    @classmethod
    def _categorical_from_dict(
        cls, data: dict[str, Any], mechanism: str, common: dict[str, Any]
    ) -> CampaignSpec:
        for field in ("region", "cell_size_m", "privacy_level", "privacy_radius_m"):
            if field in data:
                raise SpecError(f"{field} applies only to planar_laplace", field=field)
        if "epsilon" not in data:
            raise SpecError("epsilon is required", field="epsilon")
        epsilon = _positive(data["epsilon"], "epsilon")
        if epsilon > MAX_EPSILON:
            raise SpecError(f"epsilon must be at most {MAX_EPSILON}", field="epsilon")
        if "domain" in data:
            domain = cls._parse_domain(data["domain"])
        elif mechanism == RR:
            domain = RR_DEFAULT_DOMAIN
        else:
            raise SpecError("domain is required for krr", field="domain")
        if mechanism == RR and len(domain) != 2:
            raise SpecError("rr takes exactly two labels", field="domain")
        try:
            krr_weights(epsilon, len(domain))
        except ValueError as exc:
            raise SpecError(str(exc), field="epsilon") from None
        return cls(mechanism=mechanism, epsilon=epsilon, domain=domain, **common)

    @staticmethod
    def _parse_domain(raw: Any) -> tuple[str, ...]:
        if not isinstance(raw, list):
            raise SpecError("domain must be a list of labels", field="domain")
        if not MIN_DOMAIN <= len(raw) <= MAX_DOMAIN:
            raise SpecError(
                f"domain must have {MIN_DOMAIN} to {MAX_DOMAIN} labels, got {len(raw)}",
                field="domain",
            )
        labels = tuple(
            _string(label, f"domain[{i}]", MAX_LABEL_LENGTH) for i, label in enumerate(raw)
        )
        if len(set(labels)) != len(labels):
            seen: set[str] = set()
            for i, label in enumerate(labels):
                if label in seen:
                    raise SpecError(f"duplicate label {label!r}", field=f"domain[{i}]")
                seen.add(label)
        return labels

    @classmethod
    def _planar_from_dict(
        cls, data: dict[str, Any], common: dict[str, Any], *, stored: bool
    ) -> CampaignSpec:
        if "domain" in data:
            raise SpecError("planar_laplace takes a region, not a domain", field="domain")
        region = cls._parse_region(data.get("region"), bound_distortion=not stored)
        if "cell_size_m" not in data:
            raise SpecError("cell_size_m is required for planar_laplace", field="cell_size_m")
        cell = _positive(data["cell_size_m"], "cell_size_m")
        if cell < MIN_CELL_SIZE_M:
            raise SpecError(f"cell_size_m must be at least {MIN_CELL_SIZE_M}", field="cell_size_m")
        grid = Grid(region, cell)
        if grid.n_cells > MAX_CELLS:
            raise SpecError(
                f"the grid would have {grid.rows} x {grid.cols} cells; at most {MAX_CELLS} are "
                "allowed: use larger cells or a smaller region",
                field="cell_size_m",
            )
        level = radius = None
        if "privacy_level" in data or "privacy_radius_m" in data:
            if "privacy_level" not in data or "privacy_radius_m" not in data:
                field = "privacy_radius_m" if "privacy_level" in data else "privacy_level"
                raise SpecError("privacy_level and privacy_radius_m go together", field=field)
            level = _positive(data["privacy_level"], "privacy_level")
            radius = _positive(data["privacy_radius_m"], "privacy_radius_m")
        if "epsilon" in data:
            epsilon = _positive(data["epsilon"], "epsilon")
            if (
                level is not None
                and radius is not None
                and not math.isclose(epsilon, level / radius, rel_tol=1e-12)
            ):
                raise SpecError(
                    f"epsilon {epsilon!r} disagrees with privacy_level / privacy_radius_m "
                    f"= {level / radius!r}",
                    field="epsilon",
                )
        elif level is not None and radius is not None:
            epsilon = level / radius
        else:
            raise SpecError(
                "give epsilon (per metre) or privacy_level with privacy_radius_m", field="epsilon"
            )
        try:
            check_planar_epsilon(epsilon, grid)
        except ValueError as exc:
            field = "epsilon" if "epsilon" in data else "privacy_level"
            raise SpecError(str(exc), field=field) from None
        return cls(
            mechanism=PLANAR_LAPLACE,
            epsilon=epsilon,
            region=region,
            cell_size_m=cell,
            privacy_level=level,
            privacy_radius_m=radius,
            **common,
        )

    @staticmethod
    def _parse_region(raw: Any, *, bound_distortion: bool = True) -> Region:
        if raw is None:
            raise SpecError("region is required for planar_laplace", field="region")
        if not isinstance(raw, dict):
            raise SpecError("region must be an object", field="region")
        unknown = sorted(set(raw) - set(_REGION_FIELDS))
        if unknown:
            raise SpecError(f"unknown field {unknown[0]!r}", field=f"region.{unknown[0]}")
        values = {}
        for name in _REGION_FIELDS:
            if name not in raw:
                raise SpecError(f"region.{name} is required", field=f"region.{name}")
            values[name] = finite_number(raw[name], f"region.{name}")
        for axis, limit in (("lat", 90.0), ("lon", 180.0)):
            low, high = values[f"{axis}_min"], values[f"{axis}_max"]
            for name, value in ((f"{axis}_min", low), (f"{axis}_max", high)):
                if not -limit <= value <= limit:
                    raise SpecError(
                        f"region.{name} must be within ±{limit}", field=f"region.{name}"
                    )
            if not low < high:
                raise SpecError(
                    f"region.{axis}_min must be below {axis}_max", field=f"region.{axis}_min"
                )
        if abs(values["lat_min"]) > 85 or abs(values["lat_max"]) > 85:
            raise SpecError(
                "regions beyond ±85° latitude are not supported", field="region.lat_max"
            )
        region = Region(**values)
        distortion = region.projection_distortion()
        if bound_distortion and distortion > MAX_PROJECTION_DISTORTION:
            raise SpecError(
                f"the region is too large for one planar projection: its distances would "
                f"overstate ground distances by up to a factor {distortion:.5g}, and at most "
                f"{MAX_PROJECTION_DISTORTION} is allowed; use a smaller region (the allowed "
                "extent shrinks towards the poles)",
                field="region",
            )
        return region

    @classmethod
    def from_wire(cls, data: Any) -> tuple[CampaignSpec, dict[str, Any]]:
        """Parse a spec as a server serves it: the spec plus server fields (status, hash)."""
        if not isinstance(data, dict):
            raise SpecError("a campaign spec must be a JSON object", field=None)
        meta = {key: data[key] for key in SERVER_FIELDS if key in data}
        spec = cls.from_dict({key: v for key, v in data.items() if key not in SERVER_FIELDS})
        return spec, meta

    def to_dict(self) -> dict[str, Any]:
        """The canonical dict: only fields that apply, optional ones only when set."""
        out: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
        }
        if self.domain is not None:
            out["domain"] = list(self.domain)
        if self.region is not None:
            out["region"] = self.region.to_dict()
            out["cell_size_m"] = self.cell_size_m
        if self.privacy_level is not None:
            out["privacy_level"] = self.privacy_level
            out["privacy_radius_m"] = self.privacy_radius_m
        if self.enrollment_required:
            out["enrollment_required"] = True
        return out

    def canonical_json(self) -> bytes:
        return json.dumps(
            self.to_dict(),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")

    @cached_property
    def spec_hash(self) -> str:
        """Hex SHA-256 of the canonical JSON."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    @cached_property
    def grid(self) -> Grid:
        if self.region is None or self.cell_size_m is None:
            raise AttributeError(f"campaign {self.id!r} has no grid ({self.mechanism})")
        return Grid(self.region, self.cell_size_m)

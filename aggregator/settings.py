"""The aggregator's settings: one typed, validated object, read once at start-up.

Every setting is a field of :class:`Settings` with its type, its default, its
environment variable (``LDP_<NAME>``) and a one-line description.
:meth:`Settings.from_env` reads the environment, :meth:`Settings.from_mapping` a
dict keyed by the settings' names (``{"REDIS_URL": ..., "ADMIN_TOKEN": ...}``);
both check every value and raise :class:`SettingsError`, naming the variable and
the value, for the first bad one (a token's value is never shown). The app
factory keeps the object in ``app.extensions``
(:func:`aggregator.services.current_settings`) and also copies it into
``app.config`` under the same names, where Flask and its extensions look for
their own keys.

Values from the environment are text: numbers and flags (``1``/``0``,
``true``/``false``, ``yes``/``no``, ``on``/``off``) are parsed, ``null`` or an
empty value leaves an optional setting unset, and a string may be written as a
JSON string (``'"100 per minute"'``).
``scripts/render_settings.py`` renders the fields into docs/aggregator.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import flask

from aggregator.http import auth, cors
from aggregator.http.estimates import DEFAULT_MAX_WORK, DEFAULT_TIMEOUT_S
from aggregator.http.ratelimits import DEFAULT_LOGIN_LIMIT, DEFAULT_PUBLIC_LIMIT, parse_limit
from aggregator.http.reports import DEFAULT_MAX_BATCH, DEFAULT_REPORT_BUDGET
from aggregator.storage.capacity import DEFAULT_CHECK_INTERVAL_S, DEFAULT_HIGH_WATER
from aggregator.storage.estimate_cache import DEFAULT_MARK_SHARE, CacheBudget
from aggregator.storage.layout import DEFAULT_SHARDS, MAX_SHARDS
from aggregator.storage.redis_server import (
    DEFAULT_DATA_DIR,
    DEFAULT_FSYNC,
    FSYNC_POLICIES,
    parse_memory_size,
)
from aggregator.storage.retention import DAY_S, DEFAULT_PERIOD_RETENTION_DAYS
from aggregator.storage.store import (
    DEFAULT_CAMPAIGN_MAX_REPORTS,
    DEFAULT_REPORT_ID_TTL_S,
    RAW_REPORTS_MODES,
    RAW_REPORTS_OFF,
)
from shared.schema import is_positive_finite

ENV_PREFIX = "LDP_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_UNSET = frozenset({"", "null"})
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")
# What a basemap's tile URL template may hold (Leaflet's TileLayer fills them).
TILE_URL_PLACEHOLDERS = frozenset({"z", "x", "y", "-y", "s", "r"})


class SettingsError(ValueError):
    """A setting has a bad value; the message names its variable and (unless secret) the value."""

    def __init__(self, env_var: str, message: str) -> None:
        super().__init__(message)
        self.env_var = env_var


class _Bad(ValueError):
    """A converter's refusal; the caller names the setting and what its value must be."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """How one setting's value is read and checked.

    ``convert`` takes a Python value (from a mapping, or already converted) and
    returns the typed value or raises :class:`_Bad`; ``from_text`` first turns
    an environment variable's text into the Python value ``convert`` expects.
    """

    type_name: str
    requirement: str
    convert: Callable[[Any], Any]
    optional: bool = False
    secret: bool = False

    def check(self, value: Any) -> Any:
        if value is None or (self.optional and isinstance(value, str) and value in _UNSET):
            if self.optional:
                return None
            raise _Bad
        return self.convert(value)

    def from_text(self, text: str) -> Any:
        if self.optional and text.strip().lower() in _UNSET:
            return None
        return self.check(_unquote(text))


def _unquote(text: str) -> str:
    """The string a JSON string literal stands for; other text unchanged."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            decoded = json.loads(text)
        except ValueError:
            return text
        if isinstance(decoded, str):
            return decoded
    return text


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad
    return value


def _non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad
    return value


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _Bad


def _whole(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise _Bad from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad
        if value < minimum or (maximum is not None and value > maximum):
            raise _Bad
        return value

    return convert


def _real(value: Any) -> int | float:
    """A real number (not a bool) from a number or its text."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise _Bad from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad
    return value


def _positive(maximum: float | None = None) -> Callable[[Any], float]:
    """A number finite and > 0 (and ``<= maximum``)."""

    def convert(value: Any) -> float:
        number = _real(value)
        if not is_positive_finite(number) or (maximum is not None and number > maximum):
            raise _Bad
        return float(number)

    return convert


def _zero_or_positive(value: Any) -> float:
    """A number finite and >= 0."""
    number = _real(value)
    if number != 0 and not is_positive_finite(number):
        raise _Bad
    return float(number)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise _Bad
        return value

    return convert


def _memory_size(value: Any) -> int | None:
    try:
        return parse_memory_size(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise _Bad from None


def _rate_limit(value: Any) -> str:
    """A rate limit as :func:`aggregator.http.ratelimits.parse_limit` reads it."""
    if not isinstance(value, str):
        raise _Bad
    try:
        amount, _ = parse_limit(value)
    except ValueError:
        raise _Bad from None
    if amount < 1:
        raise _Bad
    return value.strip()


def _redis_url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(REDIS_URL_SCHEMES):
        raise _Bad
    return value


def _origins(value: Any) -> str | tuple[str, ...]:
    """``"*"``, or a list of origins (a JSON list in the environment; ``[]``: no CORS)."""
    if isinstance(value, str):
        if value.strip() == "*":
            return "*"
        if value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except ValueError:
                raise _Bad from None
        else:
            value = [value]
    if isinstance(value, list | tuple) and all(
        isinstance(origin, str) and origin.strip() and origin != "*" for origin in value
    ):
        return tuple(origin.strip() for origin in value)
    raise _Bad


def _tile_url(value: Any) -> str:
    """A tile URL template: http(s), a host, ``{z}``, ``{x}`` and ``{y}`` (or ``{-y}``), and no
    placeholder Leaflet cannot fill; ``{s}`` only as the host's first label."""
    if not isinstance(value, str):
        raise _Bad
    value = value.strip()
    parts = urlsplit(value)
    names = set(re.findall(r"\{([^{}]*)\}", value))
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or not {"z", "x"} <= names
        or not names & {"y", "-y"}
        or not names <= TILE_URL_PLACEHOLDERS
        or "{s}" in parts.netloc.removeprefix("{s}.")
        or any(c in value for c in " \"'<>;,")
    ):
        raise _Bad
    return value


def _retention_days(value: Any) -> float | None:
    days = _zero_or_positive(value)
    return None if days == 0 else days


TOKEN = Kind("secret", "a token", _non_empty_text, optional=True, secret=True)
FLAG = Kind("flag", "true or false (1/0, yes/no, on/off)", _flag)
OPTIONAL_FLAG = Kind("flag or unset", "true, false or unset (null)", _flag, optional=True)
TEXT = Kind("text", "a non-empty string", _non_empty_text)
OPTIONAL_TEXT = Kind("text or unset", "a string or unset", _text, optional=True)
RATE_LIMIT = Kind("rate limit", "a rate limit such as '600 per minute'", _rate_limit)
PORT = Kind("whole number", "a port number from 0 to 65535", _whole(0, 65535))
SECONDS = Kind("seconds", "a finite number of seconds >= 0", _zero_or_positive)
POSITIVE_WHOLE = Kind("whole number", "a whole number >= 1", _whole(1))
COUNT = Kind("whole number", "a whole number >= 0", _whole(0))


def setting(kind: Kind, default: Any, description: str) -> Any:
    """A field of :class:`Settings`: its kind, default and one-line description."""
    return dataclasses.field(
        default=default,
        repr=not kind.secret,  # a printed Settings shows no token
        metadata={"kind": kind, "description": description},
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of the aggregator, typed and checked (see the module's docstring).

    The field ``redis_url`` is the setting ``REDIS_URL``, read from ``LDP_REDIS_URL``;
    likewise for every field. Constructing one (or :meth:`replace`) checks every value.
    """

    admin_token: str | None = setting(
        TOKEN,
        None,
        "bearer token of the admin role, at least 32 characters (unset: admin endpoints closed)",
    )
    analyst_token: str | None = setting(
        TOKEN,
        None,
        "bearer token of the analyst role (the admin token also works), at least 32 characters",
    )
    metrics_token: str | None = setting(
        TOKEN,
        None,
        "bearer token of a metrics scraper for `GET /metrics` (the admin token also opens it), "
        "at least 32 characters",
    )
    metrics_public: bool = setting(
        FLAG,
        False,
        "`GET /metrics` without a token too, for a scraper on a private network: it then lists "
        "no report counts, no campaign and no Redis address (a token still gets everything)",
    )
    allow_weak_tokens: bool = setting(
        FLAG,
        False,
        "accept tokens shorter than 32 characters or published as examples (`change-me`, "
        "`admin-secret`, ...): development only",
    )
    redis_url: str | None = setting(
        Kind(
            "URL or unset",
            "a redis://, rediss:// or unix:// URL, or unset",
            _redis_url,
            optional=True,
        ),
        None,
        "`redis://`, `rediss://` or `unix://` URL of an external Redis (unset: the embedded one)",
    )
    data_dir: str = setting(
        TEXT, DEFAULT_DATA_DIR, "embedded Redis directory (AOF, snapshot, socket, log), made 0700"
    )
    redis_fsync: str = setting(
        Kind("choice", f"one of {', '.join(FSYNC_POLICIES)}", _choice(FSYNC_POLICIES)),
        DEFAULT_FSYNC,
        f"embedded Redis `appendfsync`: {', '.join(FSYNC_POLICIES)} (see Durability)",
    )
    redis_maxmemory: int | None = setting(
        Kind(
            "memory size",
            "bytes or a size such as '512mb' or '2gb' (0: no limit)",
            _memory_size,
            optional=True,
        ),
        None,
        "embedded Redis `maxmemory`: bytes or `512mb`, `2gb`; `0` for none (unset: a quarter "
        "of the machine's or cgroup's memory, at least 64 MiB); the policy is `noeviction`",
    )
    storage_high_water: float = setting(
        Kind(
            "number",
            "a number > 0 and <= 1",
            _positive(maximum=1.0),
        ),
        DEFAULT_HIGH_WATER,
        "share of Redis's `maxmemory` above which new reports are refused (507)",
    )
    storage_check_interval_s: float = setting(
        SECONDS, DEFAULT_CHECK_INTERVAL_S, "how long a worker reuses its reading of Redis's memory"
    )
    cache_high_water: float | None = setting(
        Kind(
            "number or unset",
            "a number > 0 and <= 1, below LDP_STORAGE_HIGH_WATER, or unset",
            _positive(maximum=1.0),
            optional=True,
        ),
        None,
        "share of Redis's `maxmemory` from which no new estimate is cached (it is still "
        "answered); below `LDP_STORAGE_HIGH_WATER` (unset: five sixths of it, `0.75` at its "
        "default)",
    )
    cache_max_bytes: int | None = setting(
        Kind(
            "memory size or unset",
            "bytes or a size such as '64mb' (0: cache nothing), or unset",
            _memory_size,
            optional=True,
        ),
        None,
        "most memory all cached estimates may take: bytes or `64mb`; `0` caches nothing "
        "(unset: a tenth of Redis's `maxmemory`, or 256 MiB without one)",
    )
    cache_campaign_max_bytes: int | None = setting(
        Kind(
            "memory size or unset",
            "bytes or a size such as '16mb', at most LDP_CACHE_MAX_BYTES, or unset",
            _memory_size,
            optional=True,
        ),
        None,
        "most memory one campaign's cached estimates may take; its least recently computed "
        "are evicted to make room (unset: a quarter of `LDP_CACHE_MAX_BYTES`)",
    )
    campaign_max_reports: int = setting(
        COUNT,
        DEFAULT_CAMPAIGN_MAX_REPORTS,
        "most reports one campaign may hold (507 `campaign_full` beyond); `0` for no quota",
    )
    report_id_ttl_s: int = setting(
        POSITIVE_WHOLE,
        DEFAULT_REPORT_ID_TTL_S,
        "seconds a report id is remembered at least, for deduplication (default: 90 days); "
        "fixed for a campaign when it is created",
    )
    retention_days: float | None = setting(
        Kind("days", "a finite number of days >= 0", _retention_days, optional=True),
        None,
        "kept raw reports older than this many days are trimmed on every ingest; counts "
        "stay (unset or `0`: keep them all)",
    )
    period_retention_days: float | None = setting(
        Kind("days", "a finite number of days >= 0", _retention_days, optional=True),
        DEFAULT_PERIOD_RETENTION_DAYS,
        "counts per period (for estimates over windows and trends) are kept this many days "
        "after their period ends, then expire; all-time counts stay (unset or `0`: keep them "
        "all)",
    )
    raw_reports: str = setting(
        Kind("choice", "one of off, keep", _choice(RAW_REPORTS_MODES)),
        RAW_REPORTS_OFF,
        "`keep`: keep every accepted raw report in Redis (for export; bounded by "
        "`LDP_RETENTION_DAYS`), besides its count; `off`: keep counts only (about 9 bytes "
        "a report instead of about 80)",
    )
    shards: int = setting(
        Kind("whole number", f"a whole number from 1 to {MAX_SHARDS}", _whole(1, MAX_SHARDS)),
        DEFAULT_SHARDS,
        "shards a new campaign's reports are split into (on a Redis Cluster they spread "
        "over the masters); fixed when the campaign is created",
    )
    ack_replicas: int | None = setting(
        Kind("whole number or unset", "a whole number >= 0 or unset", _whole(0), optional=True),
        None,
        "replicas a report must have reached (`WAIT`) before it is acknowledged; a number is "
        "waited for whatever happens (503 while a master lacks them); unset: 1 on a Redis "
        "Cluster, or as many as the master has while it has fewer, and 0 on one server",
    )
    ack_timeout_ms: int = setting(
        POSITIVE_WHOLE,
        1000,
        "milliseconds to wait for those replicas before answering 503 (the client retries)",
    )
    max_batch: int = setting(POSITIVE_WHOLE, DEFAULT_MAX_BATCH, "most reports in one submission")
    max_content_length: int = setting(
        POSITIVE_WHOLE, 1024 * 1024, "largest request body in bytes; larger is 413"
    )
    ratelimit_reports: str = setting(
        RATE_LIMIT, "600 per minute", "report submissions per client address and campaign"
    )
    report_budget: str = setting(
        RATE_LIMIT,
        DEFAULT_REPORT_BUDGET,
        "new reports (not submissions) per client address and campaign; keep it at least "
        "`LDP_MAX_BATCH`",
    )
    ratelimit_auth_failures: str = setting(
        RATE_LIMIT,
        auth.DEFAULT_AUTH_FAILURE_LIMIT,
        "wrong bearer tokens and failed dashboard sign-ins per client address",
    )
    ratelimit_public: str = setting(
        RATE_LIMIT,
        DEFAULT_PUBLIC_LIMIT,
        "requests per client address to each public endpoint (health, campaign list and "
        "spec, OpenAPI document, metrics)",
    )
    ratelimit_login: str = setting(
        RATE_LIMIT, DEFAULT_LOGIN_LIMIT, "dashboard sign-in form posts per client address"
    )
    ratelimit_enabled: bool = setting(FLAG, True, "rate limiting on or off (every limit above)")
    ratelimit_headers_enabled: bool = setting(
        FLAG, True, "`X-RateLimit-*` headers on the responses of rate-limited endpoints"
    )
    cors_origins: str | tuple[str, ...] = setting(
        Kind("origins", "'*' or a JSON list of origins", _origins),
        cors.DEFAULT_ORIGINS,
        "origins allowed to read specs and post reports from a browser: `*`, a JSON list of "
        "origins, or `[]` for no CORS",
    )
    trusted_proxies: int = setting(
        COUNT,
        0,
        "number of reverse proxies in front whose `X-Forwarded-For` and `X-Forwarded-Proto` "
        "are believed",
    )
    secret_key: str | None = setting(
        TOKEN,
        None,
        "key that signs the dashboard's session cookie (unset: derived from the tokens)",
    )
    session_cookie_secure: bool | None = setting(
        OPTIONAL_FLAG,
        None,
        "force the dashboard cookie's `Secure` flag on or off (unset: on when the request "
        "came over HTTPS)",
    )
    session_cookie_name: str = setting(TEXT, "ldp_session", "name of the dashboard's cookie")
    session_cookie_samesite: str = setting(
        Kind("choice", "one of Lax, Strict", _choice(("Lax", "Strict"))),
        "Lax",
        "`SameSite` attribute of the dashboard's cookie: `Lax` or `Strict`",
    )
    dashboard_session_ttl_s: int = setting(
        POSITIVE_WHOLE, 8 * 3600, "seconds a dashboard sign-in lasts"
    )
    dashboard_refresh_s: int = setting(
        POSITIVE_WHOLE, 5, "seconds between the dashboard campaign page's updates"
    )
    map_tiles_url: str | None = setting(
        Kind(
            "URL template or unset",
            "an http(s) URL template with {z}, {x} and {y}, or unset",
            _tile_url,
            optional=True,
        ),
        None,
        "basemap tiles under the dashboard's maps, e.g. `https://tile.example/{z}/{x}/{y}.png` "
        "(`{s}` may be the host's first label); the browser fetches them from that host, which "
        "the Content-Security-Policy then allows for images (unset: no basemap, no request "
        "leaves the dashboard's server)",
    )
    map_tiles_attribution: str | None = setting(
        OPTIONAL_TEXT,
        None,
        "the tiles' attribution, shown as plain text in the corner of the basemap (e.g. "
        "`© OpenStreetMap contributors`); required by most tile providers",
    )
    estimate_max_work: int | None = setting(
        Kind("whole number or unset", "a whole number >= 1 or null", _whole(1), optional=True),
        DEFAULT_MAX_WORK,
        "work units one estimate may take (cells x iterations x replicates, see Estimates); "
        "more is 422 `estimate_too_costly`; `null` for no cap",
    )
    estimate_timeout_s: float | None = setting(
        Kind(
            "seconds or unset",
            "a finite number of seconds > 0 or null",
            _positive(),
            optional=True,
        ),
        DEFAULT_TIMEOUT_S,
        "seconds one estimate request may take, from reading its counts (its waits for "
        "another request's computation, for a thread and for the channel included); past them "
        "it answers 503 `estimate_timed_out` with `Retry-After`; `null` for no limit",
    )
    estimate_threads: int = setting(
        Kind("whole number", "a whole number from 0 to 64", _whole(0, 64)),
        0,
        "threads one estimate may use for its cross-validation folds and bootstrap refits; "
        "0: the CPUs the process may run on, at most 4",
    )
    host: str = setting(TEXT, "127.0.0.1", "address `serve` listens on (also `--host`)")
    port: int = setting(PORT, 8000, "port `serve` listens on (also `--port`)")
    workers: int = setting(
        Kind("whole number", "a whole number from 1 to 64", _whole(1, 64)),
        2,
        "gunicorn worker processes of `serve` (also `--workers`)",
    )

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            kind: Kind = field.metadata["kind"]
            raw = getattr(self, field.name)
            try:
                value = kind.check(raw)
            except _Bad:
                raise _refusal(field, raw) from None
            object.__setattr__(self, field.name, value)
        for name in auth.TOKEN_SETTINGS:
            try:
                auth.check_token_strength(
                    {"ALLOW_WEAK_TOKENS": self.allow_weak_tokens, name: getattr(self, name.lower())}
                )
            except auth.WeakTokenError as weak:
                raise SettingsError(env_var(name), str(weak)) from None
        self._check_cache_budget()

    def _check_cache_budget(self) -> None:
        """The estimate cache's settings against each other and the reports' mark."""
        mark = self.cache_high_water
        if mark is not None and mark >= self.storage_high_water:
            name = env_var("CACHE_HIGH_WATER")
            raise SettingsError(
                name,
                f"{name} must be below LDP_STORAGE_HIGH_WATER ({self.storage_high_water!r}), "
                f"got {mark!r}",
            )
        total, campaign = self.cache_max_bytes, self.cache_campaign_max_bytes
        if total is not None and campaign is not None and campaign > total:
            name = env_var("CACHE_CAMPAIGN_MAX_BYTES")
            raise SettingsError(
                name, f"{name} must be at most LDP_CACHE_MAX_BYTES ({total!r}), got {campaign!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Settings:
        """Settings from ``{"NAME": value}``; Flask's own keys are passed over, others refused."""
        known = {key_of(field): field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known) - set(flask.Flask.default_config))
        if unknown:
            raise SettingsError(
                env_var(unknown[0]), f"{unknown[0]!r} is not a setting of the aggregator"
            )
        return cls(**{known[key]: value for key, value in values.items() if key in known})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Settings from ``LDP_*`` variables (others, e.g. the client's, are not read)."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            text = environ.get(env_var(key_of(field)))
            if text is not None:
                values[field.name] = cls.value_from_text(field.name, text)
        return cls(**values)

    @classmethod
    def value_from_text(cls, field_name: str, text: str) -> Any:
        """The value of one setting (a field name) from its text, checked as :meth:`from_env`."""
        field = next(field for field in dataclasses.fields(cls) if field.name == field_name)
        try:
            return field.metadata["kind"].from_text(text)
        except _Bad:
            raise _refusal(field, text) from None

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (field names), checked like the original."""
        return dataclasses.replace(self, **changes)

    def to_config(self) -> dict[str, Any]:
        """``{"NAME": value}`` for every setting: what ``app.config`` holds."""
        return {key_of(field): getattr(self, field.name) for field in dataclasses.fields(self)}

    def rate_limit(self, name: str) -> tuple[int, int] | None:
        """(amount, window seconds) of the rate-limit setting ``name``; None with limits off."""
        if not self.ratelimit_enabled:
            return None
        return parse_limit(getattr(self, name))

    @property
    def cache_budget(self) -> CacheBudget:
        """What the estimate cache may take of Redis (its mark and caps)."""
        mark = self.cache_high_water
        return CacheBudget(
            high_water=self.storage_high_water * DEFAULT_MARK_SHARE if mark is None else mark,
            total_bytes=self.cache_max_bytes,
            campaign_bytes=self.cache_campaign_max_bytes,
        )

    @property
    def retention_s(self) -> float | None:
        """Seconds raw reports are kept (None: kept until trimmed by hand)."""
        return None if self.retention_days is None else self.retention_days * DAY_S

    @property
    def period_retention_s(self) -> float | None:
        """Seconds counts per period are kept after their period (None: kept)."""
        days = self.period_retention_days
        return None if days is None else days * DAY_S


def key_of(field: dataclasses.Field) -> str:
    """A field's setting name, as in ``app.config`` and test configs: ``REDIS_URL``."""
    return field.name.upper()


def env_var(key: str) -> str:
    """The environment variable of setting ``key``: ``LDP_REDIS_URL``."""
    return ENV_PREFIX + key


def _refusal(field: dataclasses.Field, raw: Any) -> SettingsError:
    kind: Kind = field.metadata["kind"]
    name = env_var(key_of(field))
    got = "" if kind.secret else f", got {raw!r}"
    return SettingsError(name, f"{name} must be {kind.requirement}{got}")


def setting_rows() -> list[dict[str, str]]:
    """One row per setting: name, env var, type, default and description (for the docs)."""
    rows = []
    for field in dataclasses.fields(Settings):
        kind: Kind = field.metadata["kind"]
        rows.append(
            {
                "name": field.name,
                "env": env_var(key_of(field)),
                "type": kind.type_name,
                "default": _shown_default(field.default),
                "description": field.metadata["description"],
            }
        )
    return rows


def _shown_default(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return json.dumps(list(default))
    return str(default)

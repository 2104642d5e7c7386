"""Estimate responses: counts from the store in, the wire form of an estimate out.

The estimators themselves live in :mod:`aggregator.estimation`; this module
only turns a campaign's counts (all time, or a window's:
:mod:`aggregator.http.windows`) into the vector they take, runs the chosen
method, and shapes the response (labels, intervals, grid, timings).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

import flask
import numpy as np

from aggregator.estimation import (
    METHODS,
    Channel,
    EstimateResult,
    SingularChannelError,
    budget,
    channel_for,
    estimate,
    poisoning,
)
from aggregator.estimation.decision import (
    DEFAULT_METHODS,
    IBU,
    MLE,
    SMOOTHED,
    cell_grid,
    described_defaults,
)
from aggregator.estimation.decision import default_method as table_default
from aggregator.http.errors import APIError
from aggregator.http.parameters import QueryParameter, invalid_parameter
from aggregator.http.windows import WindowRead
from aggregator.storage.locks import Lock
from aggregator.storage.store import Campaign, CampaignStore
from shared.errors import ValidationError
from shared.mechanisms import Geometric, GridMechanism, HadamardResponse, Mechanism
from shared.oracles import OLH
from shared.schema import Number, String, is_positive_finite

# An oracle's estimate lists this many values at most: those with the largest estimates, in
# decreasing order (a million rows would make a 100 MB body).
ORACLE_TOP_ROWS = 1000
# IBU on an OLH campaign hashes every value under every seed twice per iteration, and its
# cross-validation runs hundreds of iterations per fold (2,000 values, 10^5 reports: 796
# iterations, 134 s): above this many hashes a pass (S k; about 250 values at the default
# pool) it would outrun the estimate's time limit, so it is refused.
OLH_IBU_MAX_HASHES = 250_000
DEFAULT_CONFIDENCE = 0.95
# The confidence levels an estimate can be asked for: each level is its own computation
# and cache entry, so a caller must not be able to ask for arbitrarily many.
CONFIDENCE_LEVELS = (0.8, 0.9, 0.95, 0.99)
# Work units of one estimate (cells x iterations x replicates, see
# aggregator.estimation.budget) and its time limit: LDP_ESTIMATE_MAX_WORK and
# LDP_ESTIMATE_TIMEOUT_S. A 64 x 64 planar estimate with intervals is a small fraction
# of the cap; a 512 x 512 one is stopped by the time limit.
DEFAULT_MAX_WORK = 10**9
DEFAULT_TIMEOUT_S = 30.0
# The key of the app's EstimateLimits in ``app.extensions``.
LIMITS_EXTENSION = "ldp_estimate_limits"
# How often a request waiting for another's computation of the same estimate looks for it.
LOCK_POLL_S = 0.1
# A computation's lock outlives its time limit by this much (or lasts this long without one),
# so that a worker that died mid-computation holds up the others only for a while.
LOCK_MARGIN_S = 10.0
LOCK_WITHOUT_LIMIT_S = 3600.0
# Part of every estimate cache key: raised when the body gains or changes a field, so that a
# server never serves a body cached by an older one in the old form.
BODY_FORMAT = 4
# Channel operators kept per process: a planar kernel takes up to a second to build for a
# large grid and a few MB to hold, so a handful of recent campaigns is enough.
CHANNEL_CACHE_SIZE = 16

_Result = TypeVar("_Result")
# Told of each estimate's (method, confidence, outcome, seconds); outcome is one of these.
EstimateObserver = Callable[[str, float, str, float], None]
CACHED, COMPUTED, FAILED = "cached", "computed", "failed"


def off_loop(function: Callable[..., _Result], /, *args: Any, **kwargs: Any) -> _Result:
    """``function(*args, **kwargs)``, in gevent's native thread pool when gevent runs this process.

    Under gunicorn's gevent worker every request of the worker shares one thread,
    so seconds of numpy/scipy work would stop the worker answering anyone else.
    The hub's thread pool (10 native threads per worker) runs it instead while the
    calling greenlet waits; elsewhere (tests, the CLI) it is a plain call.
    ``function`` must be pure computation: no Redis, and no gevent-patched lock.
    """
    if not _gevent_runs():
        return function(*args, **kwargs)
    import gevent

    return gevent.get_hub().threadpool.apply(function, args, kwargs)


def _gevent_runs() -> bool:
    """Whether gevent has patched this process (gunicorn's gevent worker)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def off_loop_until(
    limits: EstimateLimits | None, function: Callable[..., _Result], /, *args: Any, **kwargs: Any
) -> _Result:
    """:func:`off_loop`, waited for until the deadline of ``limits`` at most
    (:meth:`EstimateLimits.from_now`), the wait for a free thread included.

    Past the deadline the request answers 503 ``estimate_timed_out`` at once, and the
    function runs on to its own end: a :func:`bounded` one stops at its next check of
    the budget, or as it starts if it is past the deadline then. Without a deadline, or
    without gevent, it is :func:`off_loop`.
    """
    if limits is None or limits.deadline is None or not _gevent_runs():
        return off_loop(function, *args, **kwargs)
    return _waited(_in_greenlet(off_loop, function, *args, **kwargs), limits)


def _in_greenlet(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A new greenlet that runs ``function(*args, **kwargs)`` and returns ``(True, its
    result)`` or ``(False, the exception it raised)``: nobody need wait for it (gevent
    prints the exception of a greenlet that raised)."""
    import gevent

    def outcome() -> tuple[bool, Any]:
        try:
            return True, function(*args, **kwargs)
        except Exception as exc:
            return False, exc

    return gevent.spawn(outcome)


def _waited(started: Any, limits: EstimateLimits | None) -> Any:
    """The result of a greenlet of :func:`_in_greenlet` (or its exception, raised), waited
    for until the deadline of ``limits`` at most: then 503 ``estimate_timed_out``."""
    import gevent

    left = None
    if limits is not None and limits.deadline is not None:
        left = max(0.0, limits.deadline - time.monotonic())
    try:
        ok, value = started.get(timeout=left)
    except gevent.Timeout:
        assert limits is not None
        raise timed_out(limits) from None
    if not ok:
        raise value
    return value


class ChannelCache:
    """The channel operators of recently estimated campaigns, keyed by spec hash (LRU).

    A spec never changes, so an operator built once serves every later estimate
    of the campaign. Safe to share between the requests of a worker; operators
    are built off the gevent loop (:func:`off_loop`), the bookkeeping stays on it.
    """

    def __init__(self, size: int = CHANNEL_CACHE_SIZE) -> None:
        self.size = int(size)
        self._lock = threading.Lock()
        self._channels: OrderedDict[str, Channel] = OrderedDict()
        # Under gevent, the builds under way (greenlets of _in_greenlet) by spec hash: a
        # request for a channel being built waits for that build instead of starting another.
        self._building: dict[str, Any] = {}
        self.builds = 0

    def get(self, campaign: Campaign, limits: EstimateLimits | None = None) -> Channel:
        """The campaign's channel, built on first use, once however many requests ask for it
        at the same time. Under gevent a request waits for the build until the deadline of
        ``limits`` at most (then 503 ``estimate_timed_out``); the build goes on, for the
        requests that follow."""
        key = campaign.spec_hash
        with self._lock:
            if key in self._channels:
                self._channels.move_to_end(key)
                return self._channels[key]
            building = self._building.get(key)
            if building is None and _gevent_runs():
                building = _in_greenlet(self._build, key, campaign.mechanism)
                self._building[key] = building
        if building is None:
            return self._build(key, campaign.mechanism)
        return _waited(building, limits)

    def _build(self, key: str, mechanism: Mechanism) -> Channel:
        # Built outside the lock: a slow kernel must not hold up other campaigns.
        try:
            channel = off_loop(channel_for, mechanism)
            with self._lock:
                self.builds += 1
                self._channels[key] = channel
                self._channels.move_to_end(key)
                while len(self._channels) > self.size:
                    self._channels.popitem(last=False)
        finally:
            with self._lock:
                self._building.pop(key, None)
        return channel


def cell_label(row: int, col: int) -> str:
    """The label of a report-grid cell (row 0 is the southern edge, col 0 the western)."""
    return f"r{row}c{col}"


def is_oracle(mechanism: Mechanism) -> TypeGuard[OLH | HadamardResponse]:
    """Whether the campaign's mechanism is a large-domain frequency oracle (OLH, Hadamard)."""
    return isinstance(mechanism, (OLH, HadamardResponse))


def default_method(mechanism: Mechanism) -> str:
    """The estimation method used when a request names none (the decision table's)."""
    return table_default(mechanism)


def applicable_methods(mechanism: Mechanism) -> list[str]:
    """The estimation methods a campaign with this mechanism can be asked for (the
    dashboard's menu)."""
    return [m for m in METHODS if not_applicable(mechanism, m) is None]


def not_applicable(mechanism: Mechanism, method: str) -> str | None:
    """Why ``method`` cannot estimate a campaign with this mechanism (None: it can)."""
    if method == SMOOTHED and cell_grid(mechanism) is None:
        return (
            f"{SMOOTHED} estimates k-RR, OLH and Hadamard response campaigns over a region's "
            f"cells; use {default_method(mechanism)}"
        )
    if (
        method in (IBU, MLE)
        and isinstance(mechanism, OLH)
        and mechanism.pool_size * mechanism.k > OLH_IBU_MAX_HASHES
    ):
        return (
            f"{method} cannot be used for this campaign: each IBU iteration hashes all "
            f"{mechanism.k:,} values under each of the {mechanism.pool_size:,} seeds twice, and "
            f"it takes hundreds; use projection (the default for olh) or inversion"
        )
    return None


def value_labels(mechanism: OLH | HadamardResponse) -> list[str]:
    """The labels of an oracle's values: its labels, or the integers as text."""
    return [str(mechanism.values.value(x)) for x in range(mechanism.k)]


def output_labels(mechanism: Mechanism) -> list[str]:
    """One label per output index: the category, the grid cell, or the integer as text
    (an oracle's outputs are integers: seed and bucket, or a Hadamard column)."""
    if is_oracle(mechanism):
        return [str(y) for y in range(mechanism.n_outputs)]
    if isinstance(mechanism, GridMechanism):
        cols = mechanism.grid.cols
        return [cell_label(*divmod(y, cols)) for y in range(mechanism.n_outputs)]
    if isinstance(mechanism, Geometric):
        return [str(value) for value in range(mechanism.lo, mechanism.hi + 1)]
    return [mechanism.report_value(y) for y in range(mechanism.n_outputs)]


METHOD = QueryParameter(
    "method",
    String(enum=METHODS),
    None,
    description=f"the estimator; by default the mechanism's: {described_defaults()}",
    extensions={"x-default-by-mechanism": dict(DEFAULT_METHODS)},
)
CONFIDENCE = QueryParameter(
    "confidence",
    Number(enum=CONFIDENCE_LEVELS),
    DEFAULT_CONFIDENCE,
    description="the intervals' confidence level; 0.950 is 0.95",
)


def parse_method(raw: str | None, mechanism: Mechanism) -> str:
    """The estimation method from a query string; the mechanism's default where none."""
    parsed = METHOD.parse(raw)
    return default_method(mechanism) if parsed is None else str(parsed)


def check_confidence(level: float) -> float:
    """``level`` if it is one of :data:`CONFIDENCE_LEVELS`, else a :class:`ValidationError`."""
    return float(CONFIDENCE.values.check(level, CONFIDENCE.name, invalid_parameter))


def parse_confidence(raw: str | None) -> float:
    """The interval's confidence level from a query string; 0.95 by default.

    Only the levels of :data:`CONFIDENCE_LEVELS` are accepted (``0.950`` is
    0.95; ``0.9500001`` is refused), so that callers cannot multiply the
    estimates computed and cached for a campaign.
    """
    return CONFIDENCE.parse(raw)


@dataclasses.dataclass(frozen=True)
class EstimateLimits:
    """The budget of one estimate: a cap on its work units and a time limit (None: none), and
    the threads it may use (0: as many as the process may run on, at most 4).

    ``deadline`` is the :func:`time.monotonic` instant a request's time limit runs out, set
    when the request starts (:meth:`from_now`) so that the limit covers its reads, its waits
    (for another request's computation, for a thread) and its computation; None: the limit
    runs from when the computation starts."""

    max_work: int | None = DEFAULT_MAX_WORK
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    threads: int = 0
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.max_work is not None and (
            isinstance(self.max_work, bool) or not isinstance(self.max_work, int)
        ):
            raise ValueError(f"ESTIMATE_MAX_WORK must be an integer, got {self.max_work!r}")
        if self.max_work is not None and self.max_work < 1:
            raise ValueError(f"ESTIMATE_MAX_WORK must be at least 1, got {self.max_work!r}")
        if self.timeout_s is not None and not is_positive_finite(self.timeout_s):
            raise ValueError(
                f"ESTIMATE_TIMEOUT_S must be a positive number, got {self.timeout_s!r}"
            )
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"ESTIMATE_THREADS must be a whole number >= 0, got {self.threads!r}")

    @property
    def retry_after_s(self) -> int:
        """Seconds a client should wait before asking again for an estimate that timed out."""
        return max(1, math.ceil(self.timeout_s or DEFAULT_TIMEOUT_S))

    def from_now(self) -> EstimateLimits:
        """These limits for a request that starts now: its time limit runs out ``timeout_s``
        from here (a deadline already set is kept: a trend's periods share the trend's)."""
        if self.timeout_s is None or self.deadline is not None:
            return self
        return dataclasses.replace(self, deadline=time.monotonic() + self.timeout_s)

    def past_deadline(self) -> bool:
        """Whether the request's time limit has run out (never without a deadline)."""
        return self.deadline is not None and time.monotonic() >= self.deadline


def current_limits() -> EstimateLimits:
    """The current app's per-estimate limits (read from its settings by the app factory)."""
    return flask.current_app.extensions[LIMITS_EXTENSION]


class EstimateTooCostly(ValidationError):
    """An estimate needs more work than the server allows one estimate (422)."""

    code = "estimate_too_costly"


def bounded(
    function: Callable[..., _Result], limits: EstimateLimits | None
) -> Callable[..., _Result]:
    """``function`` run under ``limits`` in the thread that calls it, budget errors mapped.

    The budget is per thread, so it must be opened by the thread that computes
    (:func:`off_loop` hands the function to gevent's thread pool); its time limit ends at
    the limits' ``deadline`` where the request set one (:meth:`EstimateLimits.from_now`),
    so the time the function waited for a thread counts. A stopped
    estimate raises out of its loop and its thread goes back to the pool.
    Exceeding the work cap is :class:`EstimateTooCostly` (the same counts never
    fit); the time limit is a 503 with ``Retry-After``.
    """
    if limits is None:
        return function

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> _Result:
        try:
            with budget.limited(
                max_work=limits.max_work,
                timeout_s=limits.timeout_s,
                threads=limits.threads,
                deadline=limits.deadline,
            ):
                return function(*args, **kwargs)
        except budget.WorkLimitExceeded as exc:
            raise EstimateTooCostly(
                f"{exc}, the most one estimate may take (the server's "
                "LDP_ESTIMATE_MAX_WORK; work is cells x iterations x replicates); "
                "a cheaper method or a larger limit is needed",
                field="method",
            ) from None
        except budget.EstimateTimedOut:
            raise timed_out(limits) from None

    return run


def timed_out(limits: EstimateLimits) -> APIError:
    """503 ``estimate_timed_out``: the estimate ran past the time limit of ``limits``."""
    return APIError(
        503,
        "estimate_timed_out",
        f"{budget.EstimateTimedOut(limits.timeout_s or DEFAULT_TIMEOUT_S)} (the server's "
        "LDP_ESTIMATE_TIMEOUT_S) and was stopped; retry later, or use a cheaper method",
        retry_after_s=limits.retry_after_s,
    )


def count_vector(counts: dict[int, int], n_outputs: int) -> np.ndarray:
    vector = np.zeros(n_outputs, dtype=np.int64)
    for output, count in counts.items():
        vector[output] = count
    return vector


def estimate_response(
    campaign: Campaign,
    counts: dict[int, int],
    method: str,
    confidence: float,
    *,
    channel: Channel | None = None,
    window: WindowRead | None = None,
    poisoning_check: bool = True,
) -> dict[str, Any]:
    """The estimate of a campaign's distribution, as it goes on the wire.

    ``method`` and ``confidence`` are already parsed. With no reports yet the
    response has ``n = 0`` and an empty ``estimates`` list. ``counts`` are those
    of ``window`` when there is one: the body then says which (``window``) and adds
    its notes to the ``warnings``. ``poisoning_check`` False leaves out the poisoning check
    (whose simulation takes about 0.3 s for a k-RR campaign of 1,000 labels and a new ``n``),
    for a trend, which does not show it. ``channel`` reuses
    an operator already built for this campaign (see :class:`ChannelCache`).
    For categorical and geometric campaigns each row also has ``raw_frequency``,
    the share of the noisy reports that carry that category or value; a
    geometric estimate also gives its ``range``, a grid estimate its ``grid``
    with the estimate and the report shares per cell. The work is charged to the
    calling thread's budget (:mod:`aggregator.estimation.budget`), if it has one.
    """
    mechanism = campaign.mechanism
    # The shaping below passes over every output a few times (counts, labels, rows).
    budget.charge(mechanism.n_outputs)
    vector = count_vector(counts, mechanism.n_outputs)
    head: dict[str, Any] = {"campaign": campaign.spec.id, "spec_hash": campaign.spec_hash}
    if window is not None:
        head["window"] = window.to_dict()
    # Refused with or without reports, so a query that works today works tomorrow.
    refusal = not_applicable(mechanism, method)
    if refusal is not None:
        raise ValidationError(refusal, field="method", code="method_not_applicable")
    if not vector.any():
        empty = {**head, "method": method, "n": 0, "confidence": confidence, "estimates": []}
        if window is not None:
            empty["warnings"] = list(window.notes)
        return empty
    try:
        result = estimate(mechanism, vector, method=method, confidence=confidence, channel=channel)
    except SingularChannelError as exc:
        raise ValidationError(
            f"{method} cannot be used for this campaign: {exc}; use {default_method(mechanism)}",
            field="method",
            code="method_not_applicable",
        ) from exc
    if is_oracle(mechanism):
        response = {**head, **oracle_body(mechanism, result)}
    else:
        response = {**head, **result.to_dict(output_labels(mechanism))}
        if not isinstance(mechanism, GridMechanism):
            # The share of reports per category, before any correction for the noise: what
            # an estimate has to beat, shown beside it.
            raw = vector / vector.sum()
            for row, share in zip(response["estimates"], raw, strict=True):
                row["raw_frequency"] = float(share)
    if poisoning_check:
        response["poisoning"] = poisoning.check(mechanism, vector).to_dict()
    if window is not None and window.notes:
        response["warnings"] = [*window.notes, *response.get("warnings", ())]
    if isinstance(mechanism, Geometric):
        response["range"] = {"lo": mechanism.lo, "hi": mechanism.hi}
    grid = mechanism.grid
    if grid is not None:
        shape = (grid.rows, grid.cols)
        response["grid"] = {
            "rows": grid.rows,
            "cols": grid.cols,
            "cell_size_m": grid.cell_size_m,
            "region": grid.region.to_dict(),
            # The cells' centres: one latitude per row, one longitude per column.
            "lat": [grid.centre(row * grid.cols)[0] for row in range(grid.rows)],
            "lon": [grid.centre(col)[1] for col in range(grid.cols)],
            "cells": np.asarray(result.frequencies).reshape(shape).tolist(),
        }
        if mechanism.n_outputs == grid.n_cells:
            # The share of the noisy reports per cell, from the same counts (the dashboard's
            # raw layer); an oracle's reports are hashed or coded, not cells.
            response["grid"]["raw_cells"] = (vector / vector.sum()).reshape(shape).tolist()
    return response


def oracle_body(mechanism: OLH | HadamardResponse, result: EstimateResult) -> dict[str, Any]:
    """An oracle's estimate: the :data:`ORACLE_TOP_ROWS` values with the largest estimates.

    Rows are in decreasing order of estimate (ties by value), each with its
    ``value`` (the label, or the integer) beside the ``label`` text; ``rows``
    says how many of the domain's values are listed and what share the
    estimate gives the others (``rest_frequency``).
    """
    frequencies = np.asarray(result.frequencies)
    k = frequencies.size
    shown = min(k, ORACLE_TOP_ROWS)
    top = np.lexsort((np.arange(k), -frequencies))[:shown]
    values = [mechanism.values.value(x) for x in top.tolist()]
    listed = dataclasses.replace(
        result, frequencies=frequencies[top], ci_low=result.ci_low[top], ci_high=result.ci_high[top]
    )
    body = listed.to_dict([str(value) for value in values])
    for row, value in zip(body["estimates"], values, strict=True):
        row["value"] = value
    body["domain_size"] = k
    body["rows"] = {
        "shown": shown,
        "of": k,
        "order": "estimate, decreasing",
        "rest_frequency": float(np.delete(frequencies, top).sum()),
    }
    return body


def counts_digest(campaign: Campaign, counts: dict[int, int]) -> str:
    """A digest of a campaign's spec and counts: equal digests, equal estimates."""
    canonical = json.dumps([campaign.spec_hash, sorted(counts.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def window_counts(
    store: CampaignStore, campaign: Campaign, window: WindowRead | None
) -> dict[int, int]:
    """The campaign's counts over ``window`` (the periods it reads), or all time (None)."""
    if window is None:
        return store.counts(campaign.spec.id)
    return store.window_counts(campaign.spec.id, window.period_keys())


def cached_estimate(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    *,
    window: WindowRead | None = None,
    channels: ChannelCache | None = None,
    limits: EstimateLimits | None = None,
    observe: EstimateObserver | None = None,
) -> tuple[dict[str, Any], bool]:
    """:func:`estimate_response` on the stored counts, cached in Redis until they change.

    Returns the body and whether it came from the cache. The cache entry is keyed
    by campaign, method, confidence and ``window`` (None: all time), and holds the
    digest of the counts it was computed from: a new report changes the counts, so
    the next request recomputes. It is kept only within the cache's budget
    (:mod:`aggregator.storage.estimate_cache`); otherwise the next request recomputes too.
    A cached body is the computed one unchanged (its ``seconds`` is the time the estimate
    took to compute). ``confidence`` must be one of
    :data:`CONFIDENCE_LEVELS`. With ``limits`` a computation that needs more
    work than allowed raises :class:`EstimateTooCostly`, one that runs past the
    time limit a 503 :class:`~aggregator.http.errors.APIError`; nothing is cached then.
    ``observe`` is told how long the estimate took and whether it was cached, computed
    or failed.
    """
    text, body, cached = _cached_estimate(
        store,
        campaign,
        method,
        confidence,
        window=window,
        channels=channels,
        limits=limits,
        observe=observe,
    )
    return (json.loads(text) if body is None else body), cached


def cached_estimate_json(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    *,
    window: WindowRead | None = None,
    channels: ChannelCache | None = None,
    limits: EstimateLimits | None = None,
    observe: EstimateObserver | None = None,
) -> tuple[str, bool]:
    """:func:`cached_estimate` as JSON text: a cache hit is served without parsing the body."""
    text, _, cached = _cached_estimate(
        store,
        campaign,
        method,
        confidence,
        window=window,
        channels=channels,
        limits=limits,
        observe=observe,
    )
    return text, cached


def _cached_estimate(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    *,
    window: WindowRead | None,
    channels: ChannelCache | None,
    limits: EstimateLimits | None,
    observe: EstimateObserver | None,
) -> tuple[str, dict[str, Any] | None, bool]:
    """The body's JSON text, the body itself when it was just computed, whether cached."""
    check_confidence(confidence)

    def compute(
        counts: dict[int, int], channel: Channel | None, allowed: EstimateLimits | None
    ) -> dict[str, Any]:
        return off_loop_until(
            allowed,
            bounded(estimate_response, allowed),
            campaign,
            counts,
            method,
            confidence,
            channel=channel,
            window=window,
        )

    return cached_body(
        store,
        campaign,
        cache_variant(method, confidence, window),
        read=lambda: window_counts(store, campaign, window),
        digest=lambda counts: counts_digest(campaign, counts),
        compute=compute,
        channels=channels,
        limits=limits,
        observe=None if observe is None else functools.partial(observe, method, confidence),
    )


# Reads the counts a body is made from; makes their digest; computes the body from them with
# the campaign's channel (None: not needed) within the limits it is given.
CountsReader = Callable[[], Any]
CountsDigest = Callable[[Any], str]
BodyMaker = Callable[[Any, Channel | None, EstimateLimits | None], dict[str, Any]]


def cached_body(
    store: CampaignStore,
    campaign: Campaign,
    variant: str,
    *,
    read: CountsReader,
    digest: CountsDigest,
    compute: BodyMaker,
    channels: ChannelCache | None,
    limits: EstimateLimits | None,
    observe: Callable[[str, float], None] | None,
) -> tuple[str, dict[str, Any] | None, bool]:
    """A body made from a campaign's counts, cached in Redis under ``variant`` until they change
    (an estimate, a window's, a comparison's): its JSON text, the body itself when it was just
    computed, and whether it came from the cache. ``observe`` is told the outcome and its time.
    The time limit runs from here (:meth:`EstimateLimits.from_now`).
    """
    began, outcome = time.perf_counter(), FAILED
    limits = None if limits is None else limits.from_now()
    try:
        campaign_id = campaign.spec.id
        # Without reading the counts (every shard's, up to 16 x outputs fields): a body made
        # from counts read after the campaign had accepted as many reports as now.
        seen = campaign.reports_seen
        hit = store.estimates.get(campaign_id, variant, reports=seen)
        if hit is None:
            counts = read()
            counts_hash = digest(counts)
            hit = store.estimates.get(campaign_id, variant, counts_digest=counts_hash, reports=seen)
        if hit is not None:
            outcome = CACHED
            return hit.decode(), None, True
        lock = compute_lock(store, campaign_id, variant, counts_hash, limits)
        while not lock.acquire():
            # Another request (in this worker or another) computes this very body: wait for
            # it rather than compute it twice, within this request's own time limit.
            time.sleep(LOCK_POLL_S)
            _still_in_time(limits)
        try:
            # Under the lock, the cache once more: whoever held it may have cached the body,
            # while this request waited or between its cache miss and the lock.
            hit = store.estimates.get(campaign_id, variant, counts_digest=counts_hash)
            if hit is not None:
                outcome = CACHED
                return hit.decode(), None, True
            if limits is not None and limits.past_deadline():
                raise timed_out(limits)
            channel = (
                channels.get(campaign, limits)
                if channels is not None and any_reports(counts)
                else None
            )
            response = compute(counts, channel, limits)
            body = json.dumps(response, separators=(",", ":"), default=_plain)
            store.estimates.put(campaign_id, variant, counts_hash, body, reports=seen)
        finally:
            lock.release()
        outcome = COMPUTED
        return body, response, False
    finally:
        if observe is not None:
            observe(outcome, time.perf_counter() - began)


def any_reports(counts: Any) -> bool:
    """Whether counts (a dict, or a tuple of dicts) hold any report."""
    if isinstance(counts, tuple):
        return any(map(any_reports, counts))
    return bool(counts)


def cache_variant(method: str, confidence: float, window: WindowRead | None = None) -> str:
    """An estimate's part of its cache and lock keys: method, confidence level, the body's
    format (:data:`BODY_FORMAT`) and the window, if any (:attr:`WindowRead.variant`)."""
    variant = f"{method}:{confidence!r}:{BODY_FORMAT}"
    return variant if window is None else f"{variant}:{window.variant}"


def _still_in_time(limits: EstimateLimits | None) -> None:
    """Raise 503 ``estimate_pending`` if a request waiting for another's computation is past
    its deadline.

    The time limit covers the wait: a request whose time is up answers at once rather than
    computing for a whole time limit more.
    """
    if limits is not None and limits.past_deadline():
        raise APIError(
            503,
            "estimate_pending",
            "this estimate is being computed for another request and was not ready "
            f"within {limits.timeout_s:g} s (the server's LDP_ESTIMATE_TIMEOUT_S); retry later",
            retry_after_s=limits.retry_after_s,
        )


def compute_lock(
    store: CampaignStore,
    campaign_id: str,
    variant: str,
    digest: str,
    limits: EstimateLimits | None,
) -> Lock:
    """The lock on computing one estimate (campaign, variant, counts digest).

    Whoever holds it computes; other requests for the same estimate, in any
    worker, wait for the cached result instead of computing it again. The lock
    expires on its own shortly after the computation's time limit; at Redis's
    memory limit (no room for the lock, nor for the cache) the request computes
    without one rather than fail.
    """
    timeout_s = None if limits is None else limits.timeout_s
    ttl_s = LOCK_WITHOUT_LIMIT_S if timeout_s is None else timeout_s + LOCK_MARGIN_S
    return store.estimates.lock(campaign_id, variant, digest, int(1000 * ttl_s))

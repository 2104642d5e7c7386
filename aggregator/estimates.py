"""Estimate responses: counts from the store in, the wire form of an estimate out.

The estimators themselves live in :mod:`aggregator.estimation`; this module
only turns a campaign's counts into the vector they take, runs the chosen
method, and shapes the response (labels, intervals, grid, timings).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from aggregator.estimation import (
    METHODS,
    Channel,
    SingularChannelError,
    channel_for,
    estimate,
    poisoning,
)
from aggregator.store import Campaign, CampaignStore
from shared.errors import ValidationError
from shared.mechanisms import Mechanism, PlanarLaplace

DEFAULT_METHOD = "ibu"
DEFAULT_CONFIDENCE = 0.95
# Channel operators kept per process: a planar kernel takes up to a second to build for a
# large grid and a few MB to hold, so a handful of recent campaigns is enough.
CHANNEL_CACHE_SIZE = 16

_Result = TypeVar("_Result")


def off_loop(function: Callable[..., _Result], /, *args: Any, **kwargs: Any) -> _Result:
    """``function(*args, **kwargs)``, in gevent's native thread pool when gevent runs this process.

    Under gunicorn's gevent worker every request of the worker shares one thread,
    so seconds of numpy/scipy work would stop the worker answering anyone else.
    The hub's thread pool (10 native threads per worker) runs it instead while the
    calling greenlet waits; elsewhere (tests, the CLI) it is a plain call.
    ``function`` must be pure computation: no Redis, and no gevent-patched lock.
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return function(*args, **kwargs)
    import gevent

    return gevent.get_hub().threadpool.apply(function, args, kwargs)


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
        self.builds = 0

    def get(self, campaign: Campaign) -> Channel:
        """The campaign's channel, built on first use."""
        key = campaign.spec_hash
        with self._lock:
            if key in self._channels:
                self._channels.move_to_end(key)
                return self._channels[key]
        # Built outside the lock: a slow kernel must not hold up other campaigns.
        channel = off_loop(channel_for, campaign.mechanism)
        with self._lock:
            self.builds += 1
            self._channels[key] = channel
            self._channels.move_to_end(key)
            while len(self._channels) > self.size:
                self._channels.popitem(last=False)
        return channel


def cell_label(row: int, col: int) -> str:
    """The label of a report-grid cell (row 0 is the southern edge, col 0 the western)."""
    return f"r{row}c{col}"


def output_labels(mechanism: Mechanism) -> list[str]:
    """One label per output index: the category, or the grid cell."""
    if isinstance(mechanism, PlanarLaplace):
        cols = mechanism.grid.cols
        return [cell_label(*divmod(y, cols)) for y in range(mechanism.n_outputs)]
    return [mechanism.report_value(y) for y in range(mechanism.n_outputs)]


def parse_method(raw: str) -> str:
    if raw not in METHODS:
        raise ValidationError(
            f"method must be one of {', '.join(METHODS)}, got {raw!r}",
            field="method",
            code="invalid_parameter",
        )
    return raw


def parse_confidence(raw: str | None) -> float:
    """The interval's confidence level from a query string, in (0, 1); 0.95 by default."""
    if raw is None:
        return DEFAULT_CONFIDENCE
    try:
        level = float(raw)
    except ValueError:
        level = math.nan
    if not (math.isfinite(level) and 0 < level < 1):
        raise ValidationError(
            "confidence must be a number strictly between 0 and 1",
            field="confidence",
            code="invalid_parameter",
        )
    return level


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
) -> dict[str, Any]:
    """The estimate of a campaign's distribution, as it goes on the wire.

    ``method`` and ``confidence`` are already parsed. With no reports yet the
    response has ``n = 0`` and an empty ``estimates`` list. ``channel`` reuses
    an operator already built for this campaign (see :class:`ChannelCache`).
    """
    mechanism = campaign.mechanism
    vector = count_vector(counts, mechanism.n_outputs)
    head = {"campaign": campaign.spec.id, "spec_hash": campaign.spec_hash}
    if not vector.any():
        return {**head, "method": method, "n": 0, "confidence": confidence, "estimates": []}
    try:
        result = estimate(mechanism, vector, method=method, confidence=confidence, channel=channel)
    except SingularChannelError as exc:
        raise ValidationError(
            f"{method} cannot be used for this campaign: {exc}; use ibu",
            field="method",
            code="method_not_applicable",
        ) from exc
    response = {**head, **result.to_dict(output_labels(mechanism))}
    response["poisoning"] = poisoning.check(mechanism, vector).to_dict()
    if isinstance(mechanism, PlanarLaplace):
        grid = mechanism.grid
        response["grid"] = {
            "rows": grid.rows,
            "cols": grid.cols,
            "cell_size_m": grid.cell_size_m,
            "region": grid.region.to_dict(),
            "cells": np.asarray(result.frequencies).reshape(grid.rows, grid.cols).tolist(),
        }
    return response


def counts_digest(campaign: Campaign, counts: dict[int, int]) -> str:
    """A digest of a campaign's spec and counts: equal digests, equal estimates."""
    canonical = json.dumps([campaign.spec_hash, sorted(counts.items())], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def cached_estimate(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    *,
    channels: ChannelCache | None = None,
) -> tuple[dict[str, Any], bool]:
    """:func:`estimate_response` on the stored counts, cached in Redis until they change.

    Returns the body and whether it came from the cache. The cache entry is keyed
    by campaign, method and confidence, and holds the digest of the counts it was
    computed from: a new report changes the counts, so the next request
    recomputes. A cached body is the computed one unchanged (its ``seconds`` is
    the time the estimate took to compute).
    """
    campaign_id = campaign.spec.id
    counts = store.counts(campaign_id)
    digest = counts_digest(campaign, counts)
    variant = f"{method}:{confidence!r}"
    hit = store.cached_estimate(campaign_id, variant, digest)
    if hit is not None:
        return json.loads(hit), True
    channel = channels.get(campaign) if channels is not None and counts else None
    response = off_loop(estimate_response, campaign, counts, method, confidence, channel=channel)
    body = json.dumps(response, separators=(",", ":"), default=_plain)
    store.cache_estimate(campaign_id, variant, digest, body)
    return response, False

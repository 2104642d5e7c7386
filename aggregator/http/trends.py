"""Estimates over time: a trend (one estimate per period) and the comparison of two windows.

**Trend.** The estimate of each of the last periods, for the categories (or cells)
with the largest estimated shares over the trend's whole window. Each period's
estimate is the one the estimate endpoint gives for that period as a window
(``since = until = period``), from the same cache, so a trend asked for again
computes only the periods that received reports since.

**Comparison.** For two windows ``a`` and ``b`` of the same campaign, each
category's difference ``b - a`` between the two windows' estimates, with an
interval. The two windows' reports are different reports, independent given the
population, so the variance of the difference is the sum of the two estimates'
variances:

* where the estimates' intervals are those of the unbiased inversion (the
  inversion and its projection, every estimate of k-RR and of the large-domain
  oracles), the interval is ``(u_b - u_a) +- z sqrt(V_a + V_b)``, ``u`` each
  window's unbiased inversion and ``V`` its variance from the multinomial
  covariance of its counts (:func:`aggregator.estimation.intervals.inversion_variance`),
  widened where needed to hold the difference of the estimates themselves;
* otherwise (IBU, maximum likelihood, the clipped inversion: intervals from a
  bootstrap of the estimator's error) each window's standard error is taken back
  from its interval's width, ``(ci_high - ci_low) / 2z``, and the interval is
  ``(f_b - f_a) +- z sqrt(se_a^2 + se_b^2)``.

A difference is marked ``excludes_zero`` when its interval does not hold 0.
Each interval is at the confidence level on its own: over many categories that
did not change, about ``1 - confidence`` of them are marked by chance.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aggregator.estimation import Channel, KRRChannel, SingularChannelError, channel_for
from aggregator.estimation.decision import INVERSION, PROJECTION
from aggregator.estimation.intervals import inversion_variance, z_value
from aggregator.http import estimates
from aggregator.http.errors import APIError
from aggregator.http.estimates import (
    ORACLE_TOP_ROWS,
    ChannelCache,
    EstimateLimits,
    EstimateObserver,
    counts_digest,
    is_oracle,
    output_labels,
    value_labels,
)
from aggregator.http.windows import WindowRead, resolve
from aggregator.storage.periods import Window
from aggregator.storage.store import Campaign, CampaignStore
from shared.errors import ValidationError


def _timed_out(limits: EstimateLimits) -> APIError:
    return APIError(
        503,
        "estimate_timed_out",
        f"the trend's estimates took longer than {limits.timeout_s:g} s (the server's "
        "LDP_ESTIMATE_TIMEOUT_S) and were stopped; those computed are cached, so asking again "
        "goes on from there",
        retry_after_s=limits.retry_after_s,
    )


def _in_time(limits: EstimateLimits | None) -> EstimateLimits | None:
    """``limits``, for the trend's next estimate, if the trend's deadline has not passed."""
    if limits is not None and limits.past_deadline():
        raise _timed_out(limits)
    return limits


def trend_variant(method: str, confidence: float, window: WindowRead) -> str:
    """The cache key part of a trend's estimate of one window (without the poisoning check)."""
    return f"trend:{estimates.cache_variant(method, confidence, window)}"


def _lean_estimate(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    window: WindowRead,
    *,
    read: Callable[[], dict[int, int]],
    channels: ChannelCache | None,
    limits: EstimateLimits | None,
    observe: EstimateObserver | None,
) -> dict[str, Any]:
    """The window's estimate without the poisoning check, cached like an estimate."""

    def compute(
        counts: dict[int, int], channel: Channel | None, allowed: EstimateLimits | None
    ) -> dict[str, Any]:
        return estimates.off_loop_until(
            allowed,
            estimates.bounded(estimates.estimate_response, allowed),
            campaign,
            counts,
            method,
            confidence,
            channel=channel,
            window=window,
            poisoning_check=False,
        )

    text, body, _ = estimates.cached_body(
        store,
        campaign,
        trend_variant(method, confidence, window),
        read=read,
        digest=lambda counts: counts_digest(campaign, counts),
        compute=compute,
        channels=channels,
        limits=limits,
        observe=None
        if observe is None
        else lambda outcome, seconds: observe(method, confidence, outcome, seconds),
    )
    return json.loads(text) if body is None else body


def trend_response(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    window: Window,
    top: int,
    *,
    now: float,
    channels: ChannelCache | None = None,
    limits: EstimateLimits | None = None,
    observe: EstimateObserver | None = None,
) -> dict[str, Any]:
    """The estimate of each period of ``window`` for its ``top`` categories, with intervals.

    The categories are those with the largest estimated shares over the whole window. The
    whole trend shares the estimate's time limit: past it, 503 ``estimate_timed_out`` (the
    periods computed so far are cached), from when it starts.
    """
    limits = None if limits is None else limits.from_now()
    retention_s = store.period_retention_s
    whole = resolve(campaign, window, now=now, retention_s=retention_s)
    each = [
        resolve(campaign, Window(window.unit, key, key), now=now, retention_s=retention_s)
        for key in window.period_keys()
    ]
    # Every estimate cached since the campaign's last report, in one round trip; the others'
    # counts, every period's, in one more, read once for all of them.
    asked = [whole, *(period for period in each if period.read is not None)]
    hits = store.estimates.get_many(
        campaign.spec.id,
        [trend_variant(method, confidence, part) for part in asked],
        reports=campaign.reports_seen,
    )
    bodies: dict[str, dict[str, Any]] = {
        part.variant: json.loads(hit) for part, hit in zip(asked, hits, strict=True) if hit
    }
    read: dict[str, dict[int, int]] = {}

    def counts_of(part: WindowRead) -> dict[int, int]:
        if not read:
            keys = whole.period_keys()
            read.update(zip(keys, store.period_counts(campaign.spec.id, keys), strict=True))
        total: dict[int, int] = {}
        for key in part.period_keys():
            for index, count in read[key].items():
                total[index] = total.get(index, 0) + count
        return total

    def body_of(part: WindowRead) -> dict[str, Any]:
        if part.read is None:
            return {"n": 0, "estimates": [], "warnings": list(part.notes)}
        if part.variant not in bodies:
            bodies[part.variant] = _lean_estimate(
                store,
                campaign,
                method,
                confidence,
                part,
                read=functools.partial(counts_of, part),
                channels=channels,
                limits=_in_time(limits),
                observe=observe,
            )
        return bodies[part.variant]

    overall = body_of(whole)
    rows = overall["estimates"]
    # Largest share first; the output order among equals (sorted is stable).
    chosen = sorted(rows, key=lambda row: -row["frequency"])[:top]
    labels = [row["label"] for row in chosen]
    series = [
        {
            **({"value": row["value"]} if "value" in row else {}),
            "label": row["label"],
            "frequency": [],
            "ci_low": [],
            "ci_high": [],
        }
        for row in chosen
    ]
    listed_periods = []
    missing = 0
    for key, period in zip(window.period_keys(), each, strict=True):
        body = body_of(period)
        by_label = {row["label"]: row for row in body["estimates"]}
        for label, line in zip(labels, series, strict=True):
            row = by_label.get(label)
            missing += row is None and body["n"] > 0
            for name in ("frequency", "ci_low", "ci_high"):
                line[name].append(None if row is None else row[name])
        listed_periods.append(
            {"period": key, "n": body["n"], "warnings": list(body.get("warnings", ()))}
        )
    warnings = list(whole.notes)
    if missing:
        warnings.append(
            f"{missing} of the followed values were not among a period's "
            f"{ORACLE_TOP_ROWS:,} largest estimates, which is all a period's estimate lists; "
            "their share there is null"
        )
    return {
        "campaign": campaign.spec.id,
        "spec_hash": campaign.spec_hash,
        "window": window.to_dict(),
        "method": overall.get("method", method),
        "confidence": confidence,
        "n": overall["n"],
        "periods": listed_periods,
        "series": series,
        "interval_method": overall.get("interval_method"),
        "warnings": warnings,
    }


def difference_interval(
    channel: Channel,
    method: str,
    counts: tuple[np.ndarray, np.ndarray],
    frequencies: tuple[np.ndarray, np.ndarray],
    intervals: Sequence[tuple[np.ndarray, np.ndarray]],
    confidence: float,
) -> tuple[np.ndarray, np.ndarray, str]:
    """(low, high, how) of the interval of ``frequencies[1] - frequencies[0]`` (module doc)."""
    z = z_value(confidence)
    difference = frequencies[1] - frequencies[0]
    if (
        method in (PROJECTION, INVERSION)
        or isinstance(channel, KRRChannel)
        or channel.intervals_around_unbiased
    ):
        try:
            unbiased = [channel.solve_counts(part)[0] for part in counts]
        except SingularChannelError:
            unbiased = []
        if unbiased:
            variance = sum(
                inversion_variance(part, channel, u)
                for part, u in zip(counts, unbiased, strict=True)
            )
            centre = unbiased[1] - unbiased[0]
            half = z * np.sqrt(variance)
            how = (
                "normal interval of the difference of the two windows' unbiased inversions, "
                "their variances (multinomial covariance through the inverse) added"
            )
            if not np.array_equal(difference, centre):
                how += ", widened where needed to hold the difference of the estimates"
            low = np.minimum(centre - half, difference)
            high = np.maximum(centre + half, difference)
            return low, high, how
    errors = [(high - low) / (2 * z) for low, high in intervals]
    half = z * np.sqrt(errors[0] ** 2 + errors[1] ** 2)
    how = (
        "the difference +- z times the root of the sum of the two windows' squared standard "
        "errors, each taken from its interval's width (width / 2z)"
    )
    return difference - half, difference + half, how


def comparison_body(
    campaign: Campaign,
    counts: tuple[dict[int, int], dict[int, int]],
    method: str,
    confidence: float,
    windows: tuple[WindowRead, WindowRead],
    *,
    channel: Channel | None = None,
) -> dict[str, Any]:
    """The comparison of two windows' estimates, as it goes on the wire (module doc)."""
    mechanism = campaign.mechanism
    refusal = estimates.not_applicable(mechanism, method)
    if refusal is not None:
        raise ValidationError(refusal, field="method", code="method_not_applicable")
    vectors = tuple(estimates.count_vector(part, mechanism.n_outputs) for part in counts)
    sides = {
        name: {"window": window.to_dict(), "n": int(vector.sum())}
        for name, window, vector in zip("ab", windows, vectors, strict=True)
    }
    head = {
        "campaign": campaign.spec.id,
        "spec_hash": campaign.spec_hash,
        "method": method,
        "confidence": confidence,
        **sides,
    }
    warnings = [
        f"window {name}: {note}" for name, w in zip("ab", windows, strict=True) for note in w.notes
    ]
    a, b = (side.window for side in windows)
    if a.clipped(b.since, b.until) is not None:
        warnings.append(
            "windows a and b overlap: they share the reports of their common periods, which "
            "the intervals (made for windows of different reports) do not take into account, "
            "so they are wider than they need be"
        )
    empty = [name for name, vector in zip("ab", vectors, strict=True) if not vector.any()]
    if empty:
        warnings.append(
            f"window {' and '.join(empty)} {'has' if len(empty) == 1 else 'have'} no reports: "
            "there is nothing to compare"
        )
        return {**head, "differences": [], "excluding_zero": 0, "warnings": warnings}
    channel = channel if channel is not None else channel_for(mechanism)
    results = []
    for vector in vectors:
        try:
            results.append(
                estimates.estimate(
                    mechanism, vector, method=method, confidence=confidence, channel=channel
                )
            )
        except SingularChannelError as exc:
            raise ValidationError(
                f"{method} cannot be used for this campaign: {exc}; use ibu",
                field="method",
                code="method_not_applicable",
            ) from exc
    for name, result in zip("ab", results, strict=True):
        warnings.extend(f"window {name}: {text}" for text in result.warnings)
    frequencies = (np.asarray(results[0].frequencies), np.asarray(results[1].frequencies))
    low, high, how = difference_interval(
        channel,
        method,
        (vectors[0].astype(float), vectors[1].astype(float)),
        frequencies,
        [(np.asarray(r.ci_low), np.asarray(r.ci_high)) for r in results],
        confidence,
    )
    difference = frequencies[1] - frequencies[0]
    low, high = np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0)
    excludes = (low > 0) | (high < 0)
    order = np.arange(difference.size)
    body_extra: dict[str, Any] = {}
    if is_oracle(mechanism):
        labels = value_labels(mechanism)
        shown = min(difference.size, ORACLE_TOP_ROWS)
        order = np.lexsort((order, -np.abs(difference)))[:shown]
        body_extra["rows"] = {
            "shown": int(shown),
            "of": int(difference.size),
            "order": "absolute difference, decreasing",
        }
    else:
        labels = output_labels(mechanism)
    rows = []
    for y in order.tolist():
        row: dict[str, Any] = {"label": labels[y]}
        if is_oracle(mechanism):
            row["value"] = mechanism.values.value(y)
        row.update(
            {
                "a": float(frequencies[0][y]),
                "b": float(frequencies[1][y]),
                "difference": float(difference[y]),
                "ci_low": float(low[y]),
                "ci_high": float(high[y]),
                "excludes_zero": bool(excludes[y]),
            }
        )
        rows.append(row)
    return {
        **head,
        "differences": rows,
        "excluding_zero": int(excludes.sum()),
        **body_extra,
        "interval_method": how
        + "; each interval holds at the confidence level on its own, so over many categories "
        "that did not change about 1 - confidence of them are marked by chance",
        "warnings": warnings,
    }


def comparison_json(
    store: CampaignStore,
    campaign: Campaign,
    method: str,
    confidence: float,
    windows: tuple[WindowRead, WindowRead],
    *,
    channels: ChannelCache | None = None,
    limits: EstimateLimits | None = None,
    observe: EstimateObserver | None = None,
) -> tuple[str, bool]:
    """:func:`comparison_body` on the stored counts of both windows, as JSON text, cached like
    an estimate (keyed by both windows); and whether it came from the cache."""
    estimates.check_confidence(confidence)
    a, b = windows

    def read() -> tuple[dict[int, int], dict[int, int]]:
        return (
            estimates.window_counts(store, campaign, a),
            estimates.window_counts(store, campaign, b),
        )

    def digest(pair: tuple[dict[int, int], dict[int, int]]) -> str:
        both = "".join(counts_digest(campaign, part) for part in pair)
        return hashlib.sha256(both.encode()).hexdigest()

    def compute(
        pair: tuple[dict[int, int], dict[int, int]],
        channel: Channel | None,
        allowed: EstimateLimits | None,
    ) -> dict[str, Any]:
        return estimates.off_loop_until(
            allowed,
            estimates.bounded(comparison_body, allowed),
            campaign,
            pair,
            method,
            confidence,
            windows,
            channel=channel,
        )

    variant = f"compare:{estimates.cache_variant(method, confidence, a)}:{b.variant}"
    text, _, cached = estimates.cached_body(
        store,
        campaign,
        variant,
        read=read,
        digest=digest,
        compute=compute,
        channels=channels,
        limits=limits,
        observe=None
        if observe is None
        else lambda outcome, s: observe(method, confidence, outcome, s),
    )
    return text, cached

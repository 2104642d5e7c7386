"""Property-based fuzzing of the estimate: any mechanism, any counts, every method.

Hypothesis draws a mechanism (k-RR, randomized response, geometric, planar Laplace, the
exponential mechanism on a grid, Hadamard response, OLH) at a privacy level from very strong
to very weak, and report counts of awkward shapes: every report on one output, a few reports,
reports piled on a few outputs, the same count on every output, counts up to 10^12.
Many are counts no honest population produces. Under a work cap and a time limit, every
estimate must come back or stop with the budget's own exceptions; one that comes back has
finite frequencies summing to 1 (the raw inversion excepted), and intervals inside [0, 1]
that hold the point and have positive width. A method that does not apply to the mechanism
must say so with a ValueError. The run is derandomised (fixed seed) so a failure reproduces.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from aggregator.estimation import METHODS, budget, estimate
from scripts.bench_awkward_counts import SHAPES, awkward_counts
from scripts.benchlib import equator_grid
from shared.mechanisms import (
    KRR,
    ExponentialGrid,
    Geometric,
    HadamardResponse,
    Mechanism,
    PlanarLaplace,
    RandomizedResponse,
)
from shared.oracles import OLH

EPSILONS = (0.01, 0.3, 1.0, 3.0, 8.0, 20.0)


@st.composite
def mechanisms(draw) -> Mechanism:
    epsilon = draw(st.sampled_from(EPSILONS))
    kind = draw(st.sampled_from(("krr", "rr", "geometric", "planar", "exponential", "hr", "olh")))
    if kind == "krr":
        k = draw(st.sampled_from((3, 7, 50, 1000)))
        return KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)])
    if kind == "rr":
        return RandomizedResponse(epsilon=epsilon)
    if kind == "geometric":
        return Geometric(epsilon=epsilon, lo=-3, hi=-3 + draw(st.sampled_from((1, 10, 60))))
    shape = draw(st.sampled_from(((1, 3), (2, 3), (5, 5), (12, 9))))
    if kind == "planar":
        return PlanarLaplace(epsilon=epsilon / 100, grid=equator_grid(*shape, 100.0))
    if kind == "exponential":
        metric = draw(st.sampled_from(("manhattan", "euclidean")))
        return ExponentialGrid(
            epsilon=epsilon / 100, grid=equator_grid(*shape, 100.0), metric=metric
        )
    size = draw(st.sampled_from((3, 100)))
    if kind == "hr":
        return HadamardResponse(epsilon=epsilon, domain_size=size)
    return OLH(epsilon=epsilon, domain_size=size, pool_size=draw(st.sampled_from((1, 4))))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    mechanism=mechanisms(),
    shape=st.sampled_from(SHAPES),
    size=st.sampled_from((1, 3, 100, 3000, 10**7)),
    seed=st.integers(0, 2**16),
    method=st.sampled_from((None, *METHODS)),
    confidence=st.sampled_from((0.5, 0.9, 0.95, 0.99)),
)
# Found by this fuzz: k-RR's small counts had probabilities below the smallest float, and
# the estimate failed on NaN (a 500).
@example(KRR(epsilon=0.01, domain=["a", "b", "c"]), "one", 3000, 0, None, 0.95)
def test_every_estimate_of_any_counts_comes_back_whole_or_stops_within_its_budget(
    mechanism, shape, size, seed, method, confidence
):
    counts = awkward_counts(mechanism.n_outputs, shape, size, seed)
    try:
        with budget.limited(max_work=10**9, timeout_s=2.0):
            result = estimate(mechanism, counts, method=method, confidence=confidence)
    except budget.EstimateAborted as exc:
        assert not isinstance(exc, budget.ShareExhausted)  # a share's end is its part's
        event(f"stopped: {type(exc).__name__}")
        return
    except ValueError as exc:
        # Only a method that does not apply may be refused.
        assert (method is not None and "estimates" in str(exc)) or "invert" in str(exc), exc
        event("refused: the method does not apply")
        return
    event(f"estimated: {type(mechanism).__name__}")
    frequencies, low, high = result.frequencies, result.ci_low, result.ci_high
    assert np.all(np.isfinite(frequencies)) and np.all(np.isfinite(low))
    assert np.all(np.isfinite(high))
    if result.method != "inversion":
        assert frequencies.sum() == pytest.approx(1.0, abs=1e-6)
    point = np.clip(frequencies, 0.0, 1.0)
    assert np.all(low <= point + 1e-12) and np.all(point <= high + 1e-12)
    assert np.all(low >= 0.0) and np.all(high <= 1.0) and np.all(high > low)


@pytest.mark.parametrize(
    "mechanism",
    [
        KRR(epsilon=1.0, domain=list("abcdef")),
        RandomizedResponse(epsilon=1.0),
        Geometric(epsilon=1.0, lo=0, hi=9),
    ],
    ids=["krr", "rr", "geometric"],
)
@pytest.mark.parametrize("method", [None, *METHODS])
def test_fractional_counts_below_one_report_get_finite_intervals(mechanism, method):
    """Counts of weighted reports summing to less than one report: the error bootstrap redrew
    no report at all (the refits failed or divided by the empty total: NaN intervals for the
    geometric mechanism's ``ibu``, ``clip`` and ``projection``); it now redraws one."""
    counts = np.random.default_rng(1).random(mechanism.n_outputs) * 1e-3
    try:
        result = estimate(mechanism, counts, method=method)
    except ValueError as exc:
        assert method is not None and "estimates" in str(exc), exc
        return
    assert np.all(np.isfinite(result.ci_low)) and np.all(np.isfinite(result.ci_high))
    point = np.clip(result.frequencies, 0.0, 1.0)  # the raw inversion can be negative
    assert np.all(result.ci_low <= point + 1e-12) and np.all(point <= result.ci_high + 1e-12)

"""Which mechanism for a domain: the expected error of each, in closed form, ranked.

The error of a mechanism here is the expected squared error of the unbiased
estimate of the frequency vector, summed over the values of the domain,
``E ||f_hat - f||^2``, for ``n`` users whose values are fixed (the estimate
recovers the users' own distribution). For the *pure* frequency oracles
(Wang, Blocki, Li and Jha, "Locally differentially private protocols for
frequency estimation", USENIX Security 2017) a report supports its value
with probability ``p*`` and any other given value with ``q*``, and the
estimate of ``f_v`` is ``(share of reports supporting v - q*) / (p* - q*)``.
Its variance is ``(q*(1 - q*) + f_v (p* - q*)(1 - p* - q*)) / (n (p* - q*)^2)``,
so the sum over ``k`` values, with ``sum f_v = 1``, depends on no distribution:

    E ||f_hat - f||^2 = (k q*(1 - q*) / (p* - q*)^2 + (1 - p* - q*) / (p* - q*)) / n

With ``e = e^epsilon``:

* k-RR and binary RR: ``p* = e / (e + k - 1)``, ``q* = 1 / (e + k - 1)``;
* OUE: ``p* = 1/2``, ``q* = 1 / (e + 1)``;
* OLH with ``g = round(e) + 1`` buckets: ``p* = e / (e + g - 1)``, ``q* = 1 / g``;
* Hadamard response (:mod:`aggregator.estimation.oracles`): a report supports
  ``v`` when it lies in ``v``'s half of the outputs, so ``p* = e / (e + 1)`` and,
  since two rows' halves meet in a quarter of the outputs, ``q* = 1/2``.

For small ``k`` and the ``f_v -> 0`` term alone k-RR beats OUE and OLH
below ``k = 3 e + 2`` (the crossover of the paper; the exact sums move it by
less than one value).

The geometric mechanism is not pure; its inverse is banded
(:class:`aggregator.estimation.ordinal.GeometricChannel`) and the variance of
the inversion is exact: ``(sum_x sum_y (C^-1)[y, x]^2 q_y - 1) / n`` with
``q = f C``, which depends on ``f`` (uniform unless given).

Privacy is compared so that no pair of values is less protected than the
campaign's ``epsilon`` protects it: on a range, ``epsilon`` is per unit
(geometric) and the categorical oracles run at that same ``epsilon``, which
is what the geometric mechanism gives two neighbouring values and more than it
gives any other pair. A region's mechanisms are compared by simulation
(:mod:`aggregator.estimation.region_advice`); a campaign's dashboard gets a proxy for
its mechanism here, each report's mean displacement (:func:`expected_error`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggregator.estimation.grid_kernel import mean_displacement_cells
from shared.errors import SpecError
from shared.mechanisms import Geometric
from shared.oracles import hash_range
from shared.spec import (
    EXPONENTIAL_GRID,
    GEOMETRIC,
    HADAMARD_RESPONSE,
    KRR,
    MAX_EPSILON,
    MAX_GEOMETRIC_EPSILON,
    MECHANISMS,
    OLH_NAME,
    OUE_NAME,
    PLANAR_LAPLACE,
    RR,
    CampaignSpec,
    check_krr_epsilon,
)

OLH = OLH_NAME
OUE = OUE_NAME
CATEGORICAL_MECHANISMS = (RR, KRR, OLH, OUE, HADAMARD_RESPONSE)
# The geometric closed form holds a few arrays of the range's size.
MAX_ADVISED_RANGE = 10_000_000
CLOSED_FORM = "closed form"
PROXY = "closed-form proxy: mean displacement of one report"


@dataclass(frozen=True)
class Option:
    """One mechanism's expected error for a domain, epsilon and number of users.

    ``expected_mse`` is ``E ||f_hat - f||^2`` summed over the domain (``None``
    where only an EMD was simulated); ``expected_emd_m`` the earth mover's
    distance in metres of the default estimate (grids, simulated);
    ``epsilon`` the parameter the mechanism runs at (see the module
    docstring); ``hosted`` whether the service can run a campaign with it.
    """

    mechanism: str
    expected_mse: float | None
    epsilon: float
    basis: str
    why: str
    hosted: bool
    expected_emd_m: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "expected_mse": self.expected_mse,
            "epsilon": self.epsilon,
            "basis": self.basis,
            "why": self.why,
            "hosted": self.hosted,
        }
        if self.expected_emd_m is not None:
            out["expected_emd_m"] = self.expected_emd_m
        out.update(self.details)
        return out


def hosted(mechanism: str) -> bool:
    """Whether this service's campaign specs accept ``mechanism``."""
    return mechanism in MECHANISMS


def _check(k: int, epsilon: float, n: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"the domain needs at least 2 values, got {k!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of users must be a positive integer, got {n!r}")


def pure_oracle_mse(
    k: int, p_star: float, q_star: float, n: int, gap: float | None = None
) -> float:
    """``E ||f_hat - f||^2`` of a pure frequency oracle over ``k`` values and ``n`` users.

    ``gap`` is ``p* - q*`` where the caller knows it more exactly than the
    difference: at a small epsilon ``p*`` and ``q*`` round to the same float.
    """
    if gap is None:
        gap = p_star - q_star
    return (k * q_star * (1 - q_star) / gap**2 + (1 - p_star - q_star) / gap) / n


def oracle_mse(mechanism: str, k: int, epsilon: float, n: int) -> float:
    """The closed form of a categorical oracle (see the module docstring).

    Each ``p* - q*`` is written with ``e^epsilon - 1`` (``expm1``), exact where
    ``e^epsilon`` rounds to 1: finite for every epsilon a categorical spec takes
    (at least ``2**-63``, :func:`shared.spec.check_krr_epsilon`).
    """
    _check(k, epsilon, n)
    e = math.exp(epsilon)
    e_minus_1 = math.expm1(epsilon)
    if mechanism in (RR, KRR):
        if mechanism == RR and k != 2:
            raise ValueError(f"rr takes exactly two values, got {k}")
        return pure_oracle_mse(k, e / (e + k - 1), 1 / (e + k - 1), n, e_minus_1 / (e + k - 1))
    if mechanism == OUE:
        return pure_oracle_mse(k, 0.5, 1 / (e + 1), n, e_minus_1 / (2 * (e + 1)))
    if mechanism == OLH:
        g = hash_range(epsilon)
        gap = e_minus_1 * (g - 1) / (g * (e + g - 1))
        return pure_oracle_mse(k, e / (e + g - 1), 1 / g, n, gap)
    if mechanism == HADAMARD_RESPONSE:
        return pure_oracle_mse(k, e / (e + 1), 0.5, n, e_minus_1 / (2 * (e + 1)))
    raise ValueError(f"no closed form for {mechanism!r}")


def geometric_mse(m: int, epsilon: float, n: int, distribution: np.ndarray | None = None) -> float:
    """``E ||f_hat - f||^2`` of the geometric mechanism's inversion on ``m`` values.

    ``distribution`` is the users' distribution over the range (uniform if ``None``).
    """
    from aggregator.estimation.ordinal import GeometricChannel

    _check(m, epsilon, n)
    channel = GeometricChannel(Geometric(epsilon=epsilon, lo=0, hi=m - 1))
    f = np.full(m, 1.0 / m) if distribution is None else np.asarray(distribution, dtype=float)
    if f.shape != (m,):
        raise ValueError(f"the distribution must have {m} entries, got shape {f.shape}")
    q = channel.forward(f)
    return float(channel.inversion_second_moment(q).sum() - f @ f) / n


def crossover_k(epsilon: float, other: str = OUE, *, limit: int = 100_000) -> int:
    """The smallest ``k`` at which ``other`` has a lower expected error than k-RR.

    k-RR's error grows as ``k^2`` and the others' as ``k``, so they cross once: bisection.
    """

    def other_wins(k: int) -> bool:
        return oracle_mse(other, k, epsilon, 1) < oracle_mse(KRR, k, epsilon, 1)

    if not other_wins(limit):
        raise ValueError(f"k-RR stays ahead of {other} up to k = {limit}")
    low, high = 1, limit  # other_wins(high); low is below the crossover
    while high - low > 1:
        middle = (low + high) // 2
        if middle >= 2 and other_wins(middle):
            high = middle
        else:
            low = middle
    return high


def _why(mechanism: str, k: int, epsilon: float) -> str:
    e = math.exp(epsilon)
    if mechanism in (RR, KRR):
        try:
            exact = f"{crossover_k(epsilon, OUE)} values"
        except ValueError:
            exact = "more values than a campaign takes"
        return (
            f"k-RR's error grows with k (e^eps + k - 2 per value); it beats OUE and OLH below "
            f"{exact} at this epsilon (3e^eps + 2 = {3 * e + 2:.1f} without the f terms)"
        )
    if mechanism == OUE:
        return "unary encoding: 4e^eps / (e^eps - 1)^2 per value, whatever k; reports are k bits"
    if mechanism == OLH:
        return (
            f"local hashing into g = {hash_range(epsilon)} buckets: about OUE's error with "
            "reports of a few bytes"
        )
    if mechanism == HADAMARD_RESPONSE:
        return "one of 2^ceil(log2(k+1)) outputs: (e^eps + 1)^2 / (e^eps - 1)^2 per value"
    return ""


def _sorted(options: list[Option]) -> list[Option]:
    """Best first: the lower error, then a hosted mechanism, then the listing order."""

    def key(item: tuple[int, Option]) -> tuple[float, bool, int]:
        index, option = item
        error = option.expected_emd_m if option.expected_emd_m is not None else option.expected_mse
        return (math.inf if error is None else error, not option.hosted, index)

    return [option for _, option in sorted(enumerate(options), key=key)]


def rank_categorical(k: int, epsilon: float, n: int) -> list[Option]:
    """The categorical oracles over ``k`` labels at ``epsilon``, best first."""
    _check(k, epsilon, n)
    names = [RR] if k == 2 else []
    names += [KRR, OLH, OUE, HADAMARD_RESPONSE]
    options = [
        Option(
            mechanism=name,
            expected_mse=oracle_mse(name, k, epsilon, n),
            epsilon=epsilon,
            basis=CLOSED_FORM,
            why=_why(name, k, epsilon),
            hosted=hosted(name),
        )
        for name in names
    ]
    return _sorted(options)


def oracles_take(epsilon: float, k: int) -> bool:
    """Whether the categorical specs take ``epsilon`` over ``k`` values (k-RR's weights exist)."""
    try:
        check_krr_epsilon(epsilon, k)
    except SpecError:
        return False
    return epsilon <= MAX_EPSILON


def rank_range(lo: int, hi: int, epsilon: float, n: int) -> list[Option]:
    """The integers ``lo..hi``: geometric at ``epsilon`` per unit against the oracles over them.

    Only the mechanisms whose spec takes ``epsilon`` are ranked: geometric up to its limit per unit, the oracles over the
    values within theirs. Where geometric's closed form has no finite value
    (``e^-epsilon`` rounds to 1 below about 1e-16) its ``expected_mse`` is None.
    """
    if not lo < hi:
        raise ValueError(f"the range needs lo < hi, got [{lo}, {hi}]")
    m = hi - lo + 1
    if m > MAX_ADVISED_RANGE:
        raise ValueError(
            f"the range holds {m:,} values; the advisor takes at most {MAX_ADVISED_RANGE:,} "
            "(its geometric closed form is O(m) in memory)"
        )
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    options = []
    if epsilon <= MAX_GEOMETRIC_EPSILON:
        with np.errstate(all="ignore"):
            computed = geometric_mse(m, epsilon, n)
        mse = computed if math.isfinite(computed) else None
        why = (
            "each value's estimate reads three neighbouring report counts, so the summed "
            "error hardly grows with the range; neighbouring values are protected by epsilon, "
            "values u apart by epsilon * u"
        )
        if mse is None:
            why += "; no finite closed form at this epsilon (e^-epsilon rounds to 1)"
        options.append(
            Option(
                mechanism=GEOMETRIC,
                expected_mse=mse,
                epsilon=epsilon,
                basis=CLOSED_FORM + " (uniform users)",
                why=why,
                hosted=hosted(GEOMETRIC),
            )
        )
    if not oracles_take(epsilon, m):
        return _sorted(options)
    oracles = [
        Option(
            mechanism=option.mechanism,
            expected_mse=option.expected_mse,
            epsilon=option.epsilon,
            basis=option.basis,
            why=option.why + "; every pair of values protected by epsilon",
            hosted=option.hosted,
            details={"as_labels": True},
        )
        for option in rank_categorical(m, epsilon, n)
        if option.mechanism != RR
    ]
    return _sorted([*options, *oracles])


def expected_error(spec: CampaignSpec, n: int) -> dict[str, Any] | None:
    """The advisor's expected error of a campaign's estimate at ``n`` reports (``None`` at 0).

    ``{"expected_mse", "basis"}`` for the categorical and range mechanisms, and
    for a region the proxy ``{"mean_displacement_m", "basis"}``.
    """
    if n < 1:
        return None
    if spec.mechanism == PLANAR_LAPLACE:
        return {"mean_displacement_m": 2.0 / spec.epsilon, "basis": PROXY}
    if spec.mechanism == EXPONENTIAL_GRID and spec.cell_size_m is not None:
        cell = spec.cell_size_m
        cells = mean_displacement_cells(spec.epsilon * cell, spec.metric or "manhattan")
        return {"mean_displacement_m": cells * cell, "basis": PROXY}
    if spec.mechanism == GEOMETRIC and spec.lo is not None and spec.hi is not None:
        mse = geometric_mse(spec.hi - spec.lo + 1, spec.epsilon, n)
        return {"expected_mse": mse, "basis": CLOSED_FORM + " (uniform users)"}
    if spec.mechanism not in CATEGORICAL_MECHANISMS:
        return None
    if spec.region is not None:  # over the region's cells: the oracle's form over as many
        mse = oracle_mse(spec.mechanism, spec.grid.n_cells, spec.epsilon, n)
        return {"expected_mse": mse, "basis": f"{CLOSED_FORM}, over the region's cells"}
    k = spec.domain_size if spec.domain is None else len(spec.domain)
    if k is not None:
        mse = oracle_mse(spec.mechanism, k, spec.epsilon, n)
        return {"expected_mse": mse, "basis": CLOSED_FORM}
    return None

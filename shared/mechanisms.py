"""The mechanisms, behind one interface.

Each mechanism maps a user's true value to an *input index* ``x`` and a
report to an *output index* ``y``; its channel is ``C[x, y] = P(report y |
true x)`` (rows sum to 1). Every mechanism offers:

* ``perturb(value, rng)``: one user's report, sampled on the device from a
  CSPRNG (``secrets.SystemRandom`` unless a source is injected) with exact
  integer arithmetic for discrete choices. Standard library only.
* ``report_value(y)`` / ``parse_report_value(raw)``: the wire form of a report
  and its validation on the server.

The aggregator builds the channel operator from a mechanism with
``aggregator.estimation.channels.channel_for``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

from shared.domain import Domain, OverDomain
from shared.errors import ReportError
from shared.exactness import WEIGHT_UNIT, check_planar_epsilon, krr_weights, realized_epsilon
from shared.geo import Grid, parse_location
from shared.rng import (
    RandomSource,
    bernoulli_exp_minus,
    default_rng,
    discrete_laplace,
    randbelow,
    standard_exponential,
    uniform_angle,
)
from shared.schema import positive_finite
from shared.spec import EXPONENTIAL_GRID as EXPONENTIAL_GRID  # re-exported: the wire name
from shared.spec import (
    GEOMETRIC,
    GRID_METRICS,
    HADAMARD_RESPONSE,
    MANHATTAN,
    OLH_NAME,
    PLANAR_LAPLACE,
    RR,
    RR_DEFAULT_DOMAIN,
    CampaignSpec,
)
from shared.spec import KRR as KRR_NAME


class Mechanism(ABC):
    """One LDP mechanism: parameters, on-device sampler, wire form.

    The vectorised samplers for simulation are in :mod:`simulate.sampling`.
    """

    name: ClassVar[str]
    epsilon: float
    # The report grid a location is snapped to on the device: the grid mechanisms', and that of
    # a k-RR, OLH or Hadamard response campaign over a region's cells (None for the others).
    grid: Grid | None = None

    @property
    @abstractmethod
    def n_inputs(self) -> int: ...

    @property
    @abstractmethod
    def n_outputs(self) -> int: ...

    @abstractmethod
    def encode(self, value: Any) -> int:
        """The input index of a true value; :class:`ReportError` if it is not in the domain."""

    @abstractmethod
    def perturb_index(self, x: int, rng: RandomSource) -> int:
        """Sample an output index for input ``x`` (exact, secure, standard library only)."""

    @abstractmethod
    def report_value(self, y: int) -> Any:
        """The wire value of output ``y``."""

    @abstractmethod
    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        """The output index of a wire value; :class:`ReportError` if it is not a valid report."""

    def perturb(self, value: Any, rng: RandomSource | None = None) -> Any:
        """One user's noisy report, as it goes on the wire."""
        x = self.encode(value)
        return self.report_value(self.perturb_index(x, rng if rng is not None else default_rng()))

    @staticmethod
    def from_spec(spec: CampaignSpec) -> Mechanism:
        if spec.mechanism == PLANAR_LAPLACE:
            return PlanarLaplace(epsilon=spec.epsilon, grid=spec.grid)
        if spec.mechanism == EXPONENTIAL_GRID:
            return ExponentialGrid(
                epsilon=spec.epsilon, grid=spec.grid, metric=spec.metric or MANHATTAN
            )
        if spec.mechanism == GEOMETRIC:
            if spec.lo is None or spec.hi is None:
                raise ValueError(f"campaign {spec.id!r} (geometric) has no range")
            return Geometric(epsilon=spec.epsilon, lo=spec.lo, hi=spec.hi)
        # A categorical campaign over a region: its values are the grid's cells.
        cells = spec.grid if spec.region is not None else None
        if spec.mechanism in (HADAMARD_RESPONSE, OLH_NAME):
            # The large-domain oracles build on this module's base class.
            from shared.oracles import OLH

            oracle = HadamardResponse if spec.mechanism == HADAMARD_RESPONSE else OLH
            return oracle(
                epsilon=spec.epsilon, domain=spec.domain, domain_size=spec.domain_size, grid=cells
            )
        if spec.mechanism == KRR_NAME and cells is not None:
            return KRR(epsilon=spec.epsilon, grid=cells)
        if spec.domain is None:
            raise ValueError(f"campaign {spec.id!r} ({spec.mechanism}) has no domain")
        if spec.mechanism == RR:
            return RandomizedResponse(epsilon=spec.epsilon, domain=spec.domain)
        return KRR(epsilon=spec.epsilon, domain=spec.domain)


def cell_domain(domain: Sequence[str] | None, grid: Grid | None) -> Sequence[str] | None:
    """The labels of a categorical mechanism: ``domain``, or the cells of ``grid`` (one of the
    two, or neither for a domain given by its size)."""
    if grid is None:
        return domain
    if not isinstance(grid, Grid):
        raise TypeError("grid must be a shared.geo.Grid")
    if domain is not None:
        raise TypeError("give domain or grid, not both: a grid's values are its cells")
    return grid.cell_labels()


class IntegerWeights:
    """Randomized response over ``outcomes`` outcomes with integer weights: ``keep`` for the
    kept one, ``unit`` for each other, ``keep / unit <= e^epsilon``
    (:func:`shared.exactness.krr_weights`). k-RR, OLH's buckets, and the binary choices of
    OUE and Hadamard response draw from it."""

    epsilon: float
    unit_weight: int
    keep_weight: int
    total_weight: int

    def _set_weights(self, outcomes: int) -> None:
        self.unit_weight = WEIGHT_UNIT
        self.keep_weight = krr_weights(self.epsilon, outcomes)
        self.total_weight = self.keep_weight + (outcomes - 1) * self.unit_weight

    @property
    def p_keep(self) -> float:
        """P(the kept outcome), as the on-device sampler realises it."""
        return self.keep_weight / self.total_weight

    @property
    def p_other(self) -> float:
        """P(one given other outcome)."""
        return self.unit_weight / self.total_weight

    @property
    def realized_epsilon(self) -> float:
        return realized_epsilon(self.epsilon, self.keep_weight, self.unit_weight)

    def _pick(self, kept: int, rng: RandomSource) -> int:
        """``kept`` with probability ``p_keep``, else one of the other outcomes, uniformly:
        one ``randbelow`` over the weights."""
        draw = randbelow(rng, self.total_weight)
        # The same arithmetic runs whatever ``kept`` is; only the final pick uses it.
        other = (draw - self.keep_weight) // self.unit_weight
        shifted = other + (other >= kept)
        return kept if draw < self.keep_weight else shifted


class KRR(IntegerWeights, OverDomain, Mechanism):
    r"""k-ary randomized response over a finite list of labels.

    Reports the true label with probability :math:`p = e^\varepsilon / (e^\varepsilon + k - 1)`
    and each other label with :math:`q = 1 / (e^\varepsilon + k - 1)`; the channel is
    :math:`C = (p - q) I + q \mathbf{1}\mathbf{1}^T`. (Warner 1965; Kairouz, Oh and
    Viswanath, "Extremal mechanisms for local differential privacy", 2014.)

    On the device the choice is one ``randbelow(M)`` over integer weights:
    ``keep`` for the true label and ``unit`` for each other label,
    ``M = keep + (k - 1) unit``, with ``keep / unit <= e^epsilon`` guaranteed
    by :func:`shared.exactness.keep_weight`. ``realized_epsilon = ln(keep / unit)``
    is the privacy actually given, never above ``epsilon``.

    Over a region's cells (``grid``) the labels are the cells' (``r{row}c{col}``,
    :meth:`shared.geo.Grid.cell_labels`) and a true value is a location
    ``{"lat", "lon"}``, snapped on the device to its cell (:meth:`shared.geo.Grid.locate`)
    before the cell is perturbed; two locations in one cell are then reported alike,
    and any two cells are told apart by at most ``e^epsilon``, near or far.

    Parameters
    ----------
    epsilon : float
        The local-DP parameter, finite and > 0, within the limits of the integer
        weights (:func:`shared.exactness.krr_weights`: 2**-63 to about 708).
    domain : sequence of str
        At least two distinct labels; or
    grid : shared.geo.Grid
        The grid whose cells are the values (at least two).
    """

    name = KRR_NAME

    def __init__(
        self, *, epsilon: float, domain: Sequence[str] | None = None, grid: Grid | None = None
    ):
        self.epsilon = positive_finite(epsilon, "epsilon")
        domain = cell_domain(domain, grid)
        if domain is None:
            raise TypeError("domain must be a sequence of labels")
        self.grid = grid
        self.values = Domain(labels=domain)
        assert self.values.positions is not None
        self._index = self.values.positions
        self._set_weights(self.k)

    @property
    def domain(self) -> tuple[str, ...]:
        assert self.values.labels is not None
        return self.values.labels

    @property
    def n_outputs(self) -> int:
        return self.k

    def encode(self, value: Any) -> int:
        if self.grid is not None:
            return self.grid.locate(value)
        if not isinstance(value, str):
            raise ReportError("the value must be one of the campaign's labels", field="value")
        try:
            return self._index[value]
        except KeyError:
            raise ReportError(
                "the value is not one of the campaign's labels", field="value"
            ) from None

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        return self._pick(x, rng)

    def report_value(self, y: int) -> str:
        return self.domain[y]

    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        if not isinstance(raw, str):
            raise ReportError(
                f"{field} must be a label string, got {type(raw).__name__}", field=field
            )
        try:
            return self._index[raw]
        except KeyError:
            raise ReportError(f"{field} is not one of the campaign's labels", field=field) from None


class RandomizedResponse(KRR):
    r"""Binary randomized response (Warner 1965): k-RR with two labels.

    Reports the true answer with probability :math:`e^\varepsilon / (1 + e^\varepsilon)`.
    The labels default to ``("no", "yes")``.
    """

    name = RR

    def __init__(self, *, epsilon: float, domain: Sequence[str] = RR_DEFAULT_DOMAIN):
        super().__init__(epsilon=epsilon, domain=domain)
        if self.k != 2:
            raise ValueError(f"randomized response takes exactly two labels, got {self.k}")


class GridMechanism(Mechanism):
    """A mechanism whose values and reports are the cells of a report grid.

    A location goes on the wire as its cell's centre ``{"lat", "lon"}``; the
    subclasses differ only in how a noisy cell is drawn.
    """

    grid: Grid

    @property
    def n_inputs(self) -> int:
        return self.grid.n_cells

    @property
    def n_outputs(self) -> int:
        return self.grid.n_cells

    def encode(self, value: Any) -> int:
        return self.grid.locate(value)

    def report_value(self, y: int) -> dict[str, float]:
        lat, lon = self.grid.centre(y)
        return {"lat": lat, "lon": lon}

    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        if not isinstance(raw, dict):
            raise ReportError(f"{field} must be an object {{lat, lon}}", field=field)
        lat, lon = parse_location(raw, field, ReportError)
        index = self.grid.centre_index(lat, lon)
        if index is None:
            raise ReportError(
                f"{field} is not the centre of a cell of the campaign's report grid", field=field
            )
        return index


class PlanarLaplace(GridMechanism):
    r"""The planar Laplace mechanism for geo-indistinguishability, on a report grid.

    Andrés, Bordenabe, Chatzikokolakis and Palamidessi, "Geo-indistinguishability:
    differential privacy for location-based systems", CCS 2013. Noise has density
    :math:`\frac{\varepsilon^2}{2\pi} e^{-\varepsilon d(x, z)}` (``epsilon`` per metre):
    the angle is uniform and the radius is Gamma(2, 1/epsilon), drawn as the sum of
    two full-resolution exponentials.

    The pipeline on the device:

    1. the true location is mapped to the centre of its grid cell (``encode``);
    2. planar Laplace noise is added to that centre;
    3. the noisy point is remapped to the nearest point of the grid rectangle and
       snapped to its cell (the "truncation" and "discretisation" steps of the
       paper, Section 4).

    Steps 2-3 are exact planar Laplace followed by post-processing, so between
    cell centres the report satisfies ``epsilon * d``-geo-indistinguishability
    with ``d`` the grid's projected distance; snapping removes the
    floating-point artefacts of the raw sample from what is sent. For raw
    locations ``u, v`` at ground (WGS84 geodesic) distance ``g`` the guarantee is
    ``epsilon * d(centre(u), centre(v)) <= epsilon * (D * g + cell * sqrt(2))``
    with ``D`` the region's :meth:`~shared.geo.Region.ground_distortion`,
    and two locations in one cell cannot be told apart at all.
    docs/privacy.md states what each campaign setting gives a user.

    Parameters
    ----------
    epsilon : float
        Per metre, finite and > 0, within the limits of the sampler's arithmetic on
        this grid (:func:`shared.exactness.check_planar_epsilon`).
    grid : shared.geo.Grid
        The report grid.
    """

    name = PLANAR_LAPLACE

    def __init__(self, *, epsilon: float, grid: Grid):
        self.epsilon = positive_finite(epsilon, "epsilon")
        if not isinstance(grid, Grid):
            raise TypeError("grid must be a shared.geo.Grid")
        check_planar_epsilon(self.epsilon, grid)
        self.grid = grid

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        cx, cy = self.grid.centre_xy(x)
        radius = (standard_exponential(rng) + standard_exponential(rng)) / self.epsilon
        theta = uniform_angle(rng)
        return self.grid.cell_of_xy(cx + radius * math.cos(theta), cy + radius * math.sin(theta))


class Geometric(Mechanism):
    r"""The geometric mechanism (a discrete Laplace) on an integer range, clamped at its ends.

    For ordinal values (age, a rating, an hour of the day) where nearby values
    should be hard to tell apart and far ones may not. The device adds
    two-sided geometric noise :math:`P(Z = z) = \frac{1 - \alpha}{1 + \alpha}
    \alpha^{|z|}`, :math:`\alpha = e^{-\varepsilon}`, to its value and clamps
    the sum into ``[lo, hi]`` (Ghosh, Roughgarden and Sundararajan, "Universally
    utility-maximizing privacy mechanisms", STOC 2009). So for true ``x``:

    * an inner report ``y`` has probability :math:`\frac{1 - \alpha}{1 + \alpha}
      \alpha^{|y - x|}`;
    * the end ``lo`` gathers all noise that would fall at or below it,
      :math:`\alpha^{x - lo} / (1 + \alpha)`, and ``hi`` likewise
      :math:`\alpha^{hi - x} / (1 + \alpha)`.

    Clamping is post-processing of the unbounded mechanism, which is
    ``epsilon``-d-private for ``d(x, x') = |x - x'|``: two values ``u`` apart are
    told apart by at most a factor :math:`e^{\varepsilon u}`, at the ends as
    inside. (Renormalising :math:`\alpha^{|y - x|}` over the range instead would
    make the normaliser depend on ``x`` and could double the loss near the
    ends.) The noise is drawn exactly for the float ``epsilon``
    (:func:`shared.rng.discrete_laplace`), so ``epsilon`` is what is delivered.

    Parameters
    ----------
    epsilon : float
        Per unit of the range, finite and > 0.
    lo, hi : int
        The range of values, ``lo < hi``; reports lie in it too.
    """

    name = GEOMETRIC

    def __init__(self, *, epsilon: float, lo: int, hi: int):
        self.epsilon = positive_finite(epsilon, "epsilon")
        for name, bound in (("lo", lo), ("hi", hi)):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise TypeError(f"{name} must be an integer, got {type(bound).__name__}")
        if not lo < hi:
            raise ValueError(f"the range needs lo < hi, got [{lo}, {hi}]")
        self.lo = lo
        self.hi = hi

    @property
    def n_inputs(self) -> int:
        return self.hi - self.lo + 1

    @property
    def n_outputs(self) -> int:
        return self.n_inputs

    @property
    def alpha(self) -> float:
        """``exp(-epsilon)``: the ratio of the probabilities of two neighbouring reports."""
        return math.exp(-self.epsilon)

    def encode(self, value: Any) -> int:
        return self._index(value, "value", "the value")

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        return min(max(x + discrete_laplace(rng, self.epsilon), 0), self.n_outputs - 1)

    def report_value(self, y: int) -> int:
        return self.lo + y

    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        return self._index(raw, field, field)

    def _index(self, value: Any, field: str, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ReportError(f"{what} must be an integer", field=field)
        if not self.lo <= value <= self.hi:
            raise ReportError(f"{what} is outside the range [{self.lo}, {self.hi}]", field=field)
        return value - self.lo


# Bits of the rational upper bound of sqrt(di^2 + dj^2) that the Euclidean sampler uses.
ROOT_BITS = 64


def ceil_root(square: int, bits: int = ROOT_BITS) -> Fraction:
    """The least multiple of ``2**-bits`` at or above ``sqrt(square)``, exactly (integer roots)."""
    scaled = square << (2 * bits)
    root = math.isqrt(scaled)
    return Fraction(root + (root * root != scaled), 1 << bits)


# A rational at or below 1/sqrt(2): floor(sqrt(2**(2b - 1))) / 2**b.
INV_SQRT2_BELOW = Fraction(math.isqrt(1 << (2 * ROOT_BITS - 1)), 1 << ROOT_BITS)


class ExponentialGrid(GridMechanism):
    r"""The exponential mechanism over a report grid's cells, score minus the distance, clamped.

    The discrete counterpart of snapped planar Laplace: a report cell ``z`` for
    the true cell ``x`` (rows and columns ``i, j``) has probability proportional
    to :math:`e^{-\varepsilon\, d(z, x)}` on the unbounded lattice of cells,
    with ``d`` the distance between centres in metres:

    * ``metric="manhattan"``: ``d = cell * (|Delta i| + |Delta j|)``;
    * ``metric="euclidean"``: ``d = cell * sqrt(Delta i^2 + Delta j^2)``.

    A cell beyond the grid is then moved to the nearest grid cell (row and
    column clamped). On the lattice the normaliser is the same for every ``x``
    (the law is a function of ``z - x``), so the law is ``epsilon`` per metre
    of ``d`` between any two cells, and clamping is post-processing: the
    grid's borders cost nothing extra. (Normalising over the bounded grid
    instead would let the normaliser differ between cells near the edge and
    inside, and can double the loss.)

    **Manhattan** is the product of two discrete Laplaces with
    ``a = epsilon * cell`` per step, one per axis, each drawn exactly
    (:func:`shared.rng.discrete_laplace`, with ``a`` taken as the exact
    product of the two floats, a fraction, so that it is not rounded up).
    Against straight-line distance it is ``epsilon * sqrt(2)`` per metre at
    worst (diagonal neighbours), since ``d_M <= sqrt(2) d_E``.

    **Euclidean** is drawn by rejection from uniform integers only, with a
    conservative rational rounding of the square root that is paid for in
    advance, so that ``epsilon`` per metre of Euclidean distance is delivered
    as an upper bound. With ``K = 2**64``:

    * ``r(s)`` is the least multiple of ``1/K`` at or above ``sqrt(s)`` for
      ``s = Delta i^2 + Delta j^2`` (integer square root; exact when ``s`` is
      a square), so ``sqrt(s) <= r(s) < sqrt(s) + 1/K``;
    * ``a_s = a K / (K + 1)``, the step the sampler uses;
    * ``b = a_s L`` with ``L = floor(sqrt(K^2 / 2)) / K <= 1/sqrt(2)``.

    Propose ``(Delta i, Delta j)`` from two independent discrete Laplaces of
    step ``b`` (probability proportional to ``e^{-b m}``, ``m = |Delta i| +
    |Delta j|``) and accept with probability ``exp(-(a_s r(s) - b m))``
    (:func:`shared.rng.bernoulli_exp_minus` on that exact fraction), else
    propose again. The exponent is not negative: ``b m = a_s L m <= a_s m /
    sqrt(2) <= a_s sqrt(s) <= a_s r(s)``, since ``m <= sqrt(2 s)``. An accepted
    offset therefore has probability proportional to ``e^{-b m} e^{-(a_s r(s) - b
    m)} = e^{-a_s r(s)}``: the law realised exactly is ``e^{-a_s r(s)} / Z``
    with ``Z`` a constant. For two true cells ``x != x'`` at Euclidean distance
    ``D >= 1`` cell and any lattice report ``z``,
    ``ln p(z|x) - ln p(z|x') = a_s (r(z - x') - r(z - x)) < a_s (D + 1/K)
    <= a_s D (1 + 1/K) = a D``: ``epsilon`` per metre exactly, clamping
    included. The realised law differs from ``e^{-a sqrt(s)}`` by a relative
    ``a (1 + sqrt(s)) / K`` at most, far below float resolution, so the
    aggregator's channel uses ``e^{-a sqrt(s)}``. A proposal is accepted with
    probability about ``pi / 4`` for small ``a`` (the ratio of the two
    normalisers, ``2 pi / a^2`` and ``8 / a^2``), near 1 for large ``a``; the
    number of proposals does not depend on the true cell.

    Parameters
    ----------
    epsilon : float
        Per metre of the metric's distance, finite and > 0.
    grid : shared.geo.Grid
        The report grid.
    metric : str
        ``"manhattan"`` (default) or ``"euclidean"``.
    """

    name = EXPONENTIAL_GRID

    def __init__(self, *, epsilon: float, grid: Grid, metric: str = MANHATTAN):
        self.epsilon = positive_finite(epsilon, "epsilon")
        if not isinstance(grid, Grid):
            raise TypeError("grid must be a shared.geo.Grid")
        if metric not in GRID_METRICS:
            raise ValueError(f"metric must be one of {', '.join(GRID_METRICS)}, got {metric!r}")
        self.grid = grid
        self.metric = metric
        self.step_epsilon = Fraction(self.epsilon) * Fraction(grid.cell_size_m)
        scale = 1 << ROOT_BITS
        self.sample_step = self.step_epsilon * Fraction(scale, scale + 1)
        self.proposal_step = self.sample_step * INV_SQRT2_BELOW

    @property
    def alpha(self) -> float:
        """``exp(-epsilon * cell)``: the ratio of the probabilities of neighbouring cells."""
        return math.exp(-float(self.step_epsilon))

    def offset(self, rng: RandomSource) -> tuple[int, int]:
        """The noise ``(Delta row, Delta col)`` on the unbounded lattice, before clamping."""
        if self.metric == MANHATTAN:
            return (
                discrete_laplace(rng, self.step_epsilon),
                discrete_laplace(rng, self.step_epsilon),
            )
        while True:
            di = discrete_laplace(rng, self.proposal_step)
            dj = discrete_laplace(rng, self.proposal_step)
            excess = self.sample_step * ceil_root(di * di + dj * dj) - self.proposal_step * (
                abs(di) + abs(dj)
            )
            if bernoulli_exp_minus(rng, excess.numerator, excess.denominator):
                return di, dj

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        row, col = divmod(x, self.grid.cols)
        di, dj = self.offset(rng)
        row = min(max(row + di, 0), self.grid.rows - 1)
        col = min(max(col + dj, 0), self.grid.cols - 1)
        return row * self.grid.cols + col


class HadamardResponse(IntegerWeights, OverDomain, Mechanism):
    r"""Hadamard response over a large set of labels (Acharya, Sun and Zhang, AISTATS 2019).

    With ``K`` the smallest power of two above ``k``, label ``x`` owns the half
    :math:`S_x = \{y < K : \mathrm{popcount}((x + 1) \,\&\, y) \text{ even}\}` of
    the outputs (row ``x + 1`` of the Sylvester Hadamard matrix, read as +1 on
    :math:`S_x`). The device reports a uniform output of :math:`S_x` with
    probability :math:`e^\varepsilon / (e^\varepsilon + 1)`, else a uniform one of
    the other half, so every output has probability proportional to
    :math:`e^\varepsilon` or 1 whatever ``x``: ``epsilon``-LDP. A report is one
    integer below ``K`` (``log2 K`` bits), and the server inverts the channel with
    one fast Walsh-Hadamard transform, O(K log K), whatever the number of users.

    The values are labels (``domain``), the integers ``0 .. K - 1``
    (``domain_size``, :class:`shared.domain.Domain`), or a region's cells (``grid``:
    a location is snapped to its cell on the device, as for :class:`KRR`).

    The side is drawn with integer weights exactly as binary randomized
    response's (``keep / unit <= e^epsilon``, :func:`shared.exactness.krr_weights`);
    the output within the half by rejection on uniform integers (each try lands
    in either half with probability 1/2).
    """

    name = HADAMARD_RESPONSE

    def __init__(
        self,
        *,
        epsilon: float,
        domain: Sequence[str] | None = None,
        domain_size: int | None = None,
        grid: Grid | None = None,
    ):
        self.epsilon = positive_finite(epsilon, "epsilon")
        self.grid = grid
        self.values = Domain(labels=cell_domain(domain, grid), size=domain_size)
        self._set_weights(2)
        self.size = 1 << self.values.size.bit_length()  # K: a power of two above k

    @property
    def n_outputs(self) -> int:
        return self.size

    @property
    def p_in(self) -> float:
        """P(the report falls in the true label's half)."""
        return self.p_keep

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        inside = randbelow(rng, self.total_weight) < self.keep_weight
        row = x + 1
        while True:
            y = randbelow(rng, self.size)
            if (bin(row & y).count("1") % 2 == 0) == inside:
                return y

    def report_value(self, y: int) -> int:
        return y

    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < self.size:
            raise ReportError(f"{field} must be an integer in [0, {self.size})", field=field)
        return raw

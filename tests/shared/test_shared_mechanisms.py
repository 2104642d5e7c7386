"""The three mechanisms: interface, exact integer weights, and samplers against their channels.

Goodness of fit: every sampler (the on-device scalar one with
``random.Random(seed)``, and the vectorised one with a numpy Generator) is
compared with the exact channel row of its input by Pearson's chi-square at
level ``GOF_ALPHA = 1e-3``. ``test_goodness_of_fit_has_power`` states (and
checks) what the test can see: with ``N_SCALAR`` draws it detects any shift
of the report distribution of 0.01 in total variation with probability at
least 0.99, and the negative controls (samplers built with ``1.05 epsilon``)
lie beyond that.
"""

from __future__ import annotations

import decimal
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from shared_stats import (
    GOF_ALPHA,
    chi_square_gof,
    chi_square_power,
    detectable_tv,
    scalar_counts,
    small_grid,
)

from aggregator.estimation import PlanarLaplaceChannel
from shared.errors import ReportError
from shared.exactness import keep_weight
from shared.geo import Grid, Region
from shared.mechanisms import KRR, Mechanism, PlanarLaplace, RandomizedResponse
from shared.spec import CampaignSpec
from simulate.sampling import sample

N_SCALAR = 200_000
N_VECTOR = 1_000_000
# Samples of this size detect a total-variation shift of this much with probability >= 0.99.
TV_SCALAR = 0.01
TV_VECTOR = 0.005
POWER = 0.99
WRONG_FACTOR = 1.05


def labels(k: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(k))


# A 6 x 5 grid of 100 m cells with epsilon * cell = 0.8: every output has >= 0.1 % of the
# mass, so nothing is pooled, and the remapped edge cells carry visible tails.
PLANAR_GRID = small_grid(6, 5, 100.0)
PLANAR_EPSILON = 0.008
# South-west corner, south edge, interior, west edge, north-east corner.
PLANAR_INPUTS = (0, 2, 12, 15, 29)


def krr_row(mechanism: KRR, x: int) -> np.ndarray:
    row = np.full(mechanism.k, mechanism.p_other)
    row[x] = mechanism.p_keep
    return row


def planar_rows(mechanism: PlanarLaplace) -> np.ndarray:
    grid = mechanism.grid
    channel = PlanarLaplaceChannel(
        epsilon=mechanism.epsilon, cell_size_m=grid.cell_size_m, rows=grid.rows, cols=grid.cols
    )
    return channel.dense_reference()


def exact_row(mechanism: Mechanism, x: int) -> np.ndarray:
    if isinstance(mechanism, KRR):
        return krr_row(mechanism, x)
    return planar_rows(mechanism)[x]


def with_epsilon(mechanism: Mechanism, epsilon: float) -> Mechanism:
    if isinstance(mechanism, PlanarLaplace):
        return PlanarLaplace(epsilon=epsilon, grid=mechanism.grid)
    return type(mechanism)(epsilon=epsilon, domain=mechanism.domain)


SAMPLER_CASES = [
    pytest.param(RandomizedResponse(epsilon=0.7), (0, 1), id="rr"),
    pytest.param(KRR(epsilon=1.0, domain=labels(2)), (0, 1), id="krr-2"),
    pytest.param(KRR(epsilon=1.0, domain=labels(5)), tuple(range(5)), id="krr-5"),
    pytest.param(KRR(epsilon=3.0, domain=labels(50)), (0, 17, 49), id="krr-50"),
    pytest.param(
        PlanarLaplace(epsilon=PLANAR_EPSILON, grid=PLANAR_GRID), PLANAR_INPUTS, id="planar"
    ),
]


# -- samplers against channels -------------------------------------------------------------


@pytest.mark.parametrize(("mechanism", "inputs"), SAMPLER_CASES)
def test_scalar_sampler_matches_channel(mechanism, inputs):
    for x in inputs:
        counts = scalar_counts(mechanism, x, N_SCALAR, seed=1000 + x)
        fit = chi_square_gof(counts, exact_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (x, fit)


@pytest.mark.parametrize(("mechanism", "inputs"), SAMPLER_CASES)
def test_vectorised_sampler_matches_channel(mechanism, inputs):
    generator = np.random.default_rng(2024)
    for x in inputs:
        draws = sample(mechanism, np.full(N_VECTOR, x), generator)
        assert draws.shape == (N_VECTOR,)
        counts = np.bincount(draws, minlength=mechanism.n_outputs)
        assert counts.size == mechanism.n_outputs
        fit = chi_square_gof(counts, exact_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (x, fit)


def test_vectorised_sampler_handles_mixed_inputs():
    # One call with many different inputs: each output's count must follow the mixture.
    mechanism = PlanarLaplace(epsilon=PLANAR_EPSILON, grid=PLANAR_GRID)
    generator = np.random.default_rng(5)
    x = generator.integers(0, mechanism.n_inputs, size=N_VECTOR)
    counts = np.bincount(sample(mechanism, x, generator), minlength=mechanism.n_outputs)
    true = np.bincount(x, minlength=mechanism.n_inputs) / N_VECTOR
    fit = chi_square_gof(counts, true @ planar_rows(mechanism))
    assert fit.p_value > GOF_ALPHA, fit


@pytest.mark.parametrize(("mechanism", "inputs"), SAMPLER_CASES)
def test_goodness_of_fit_has_power(mechanism, inputs):
    dof = mechanism.n_outputs - 1  # no outputs are pooled in these cases
    for x in inputs:
        assert np.all(N_SCALAR * exact_row(mechanism, x) >= 5)
    assert detectable_tv(N_SCALAR, dof, POWER) <= TV_SCALAR
    assert detectable_tv(N_VECTOR, dof, POWER) <= TV_VECTOR
    # The negative control below shifts every row by more than the detectable amount.
    wrong = with_epsilon(mechanism, mechanism.epsilon * WRONG_FACTOR)
    for x in inputs:
        tv = 0.5 * np.abs(exact_row(wrong, x) - exact_row(mechanism, x)).sum()
        assert chi_square_power(N_SCALAR, dof, tv) >= POWER, (x, tv)


@pytest.mark.parametrize(("mechanism", "inputs"), SAMPLER_CASES)
def test_negative_control_wrong_epsilon_is_detected(mechanism, inputs):
    # The same test, on samplers built with epsilon 5 % too large: every input is rejected.
    wrong = with_epsilon(mechanism, mechanism.epsilon * WRONG_FACTOR)
    generator = np.random.default_rng(99)
    for x in inputs:
        counts = scalar_counts(wrong, x, N_SCALAR, seed=7000 + x)
        assert chi_square_gof(counts, exact_row(mechanism, x)).p_value < GOF_ALPHA, x
        vector = np.bincount(
            sample(wrong, np.full(N_SCALAR, x), generator), minlength=wrong.n_outputs
        )
        assert chi_square_gof(vector, exact_row(mechanism, x)).p_value < GOF_ALPHA, x


def test_planar_channel_rows_are_distributions():
    rows = planar_rows(PlanarLaplace(epsilon=PLANAR_EPSILON, grid=PLANAR_GRID))
    assert rows.min() > 1e-3
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-12)


# -- k-RR's exact integer weights ----------------------------------------------------------

# 2**-63 is the smallest epsilon the weights can tell from 0; 200 and 700 need more than the
# 80 decimal digits once used for exp (their weights have 106 and 324 digits).
WEIGHT_EPSILONS = [2.0**-63, 1e-12, 0.1, 1.0, math.log(3), 5.0, 20.0, 50.0, 200.0, 700.0]


@pytest.mark.parametrize("epsilon", WEIGHT_EPSILONS, ids=repr)
def test_krr_weights_never_exceed_exp_epsilon(epsilon):
    mechanism = KRR(epsilon=epsilon, domain=labels(3))
    keep, unit = mechanism.keep_weight, mechanism.unit_weight
    assert isinstance(keep, int) and isinstance(unit, int)
    ratio = Fraction(keep, unit)
    with decimal.localcontext() as ctx:
        # 400 digits: the ratio (at most 324 integer digits over 2**64) is exact, and exp is
        # correctly rounded far below the 2**-60 the test resolves.
        ctx.prec = 400
        bound = decimal.Decimal(epsilon).exp()  # Decimal(float) is the float's exact value
        exact_ratio = decimal.Decimal(ratio.numerator) / decimal.Decimal(ratio.denominator)
        assert exact_ratio <= bound
        assert (bound - exact_ratio) / bound <= decimal.Decimal(2) ** -60
        # The keep weight is floor(exp(epsilon) * unit) - 1, to the last digit.
        assert 1 <= bound * unit - keep < 2
    assert mechanism.realized_epsilon <= epsilon
    # ... and it is the log of the weights: below epsilon by at most the 2**-63 of the
    # integer rounding plus a float ulp.
    assert epsilon - mechanism.realized_epsilon <= 2**-60 + 2 * math.ulp(epsilon)
    assert mechanism.total_weight == keep + 2 * unit
    assert mechanism.p_keep == keep / mechanism.total_weight
    assert mechanism.p_other == unit / mechanism.total_weight
    assert mechanism.p_keep + 2 * mechanism.p_other == pytest.approx(1.0, abs=1e-15)


def test_keep_weight_floor_at_unit():
    # exp(epsilon) rounds to 1 for a tiny epsilon: the weight is never below the unit.
    assert keep_weight(1e-30) == 1 << 64
    assert keep_weight(1e-30, unit=1000) == 1000
    # With a small unit the floor-minus-one rule is visible: 1000 e = 2718.28... -> 2717.
    assert keep_weight(1.0, unit=1000) == 2717


class ZeroBits:
    """The sampler's extreme draw: both exponentials at 1074 ln 2 (uniforms of 2**-1074), angle 0."""

    def getrandbits(self, k):
        return 0


def unchecked_planar(epsilon: float, grid: Grid) -> PlanarLaplace:
    """A planar mechanism built without the constructor's epsilon checks (to show what they stop)."""
    mechanism = object.__new__(PlanarLaplace)
    mechanism.epsilon, mechanism.grid = epsilon, grid
    return mechanism


def test_krr_epsilon_limits_of_the_integer_weights_are_exact():
    low = 2.0**-63
    krr = KRR(epsilon=low, domain=labels(3))
    assert krr.keep_weight == krr.unit_weight + 1 and krr.realized_epsilon > 0
    below = math.nextafter(low, 0)
    assert keep_weight(below) == 1 << 64  # the weights cannot tell the labels apart
    with pytest.raises(ValueError, match="too small for k-RR's integer weights"):
        KRR(epsilon=below, domain=labels(3))
    with pytest.raises(ValueError, match="too small"):
        RandomizedResponse(epsilon=1e-300)
    # The other end: the probability of another label stays a normal double.
    high = 1022 * math.log(2)
    rr = RandomizedResponse(epsilon=high)
    assert rr.p_other >= 2.0**-1022 and rr.p_other == rr.unit_weight / rr.total_weight
    assert rr.realized_epsilon == pytest.approx(high, rel=1e-15)
    for epsilon in (math.nextafter(high, math.inf), 750.0, 1e5, 1e7, 1e308):
        with pytest.raises(ValueError, match="too large for k-RR's integer weights"):
            RandomizedResponse(epsilon=epsilon)


def test_planar_epsilon_below_the_resolution_limit_is_refused():
    grid = small_grid(4, 4, 128.0)
    at_limit = 2.0**-54  # epsilon * cell = 2**-47 exactly
    mechanism = PlanarLaplace(epsilon=at_limit, grid=grid)
    assert 0 <= mechanism.perturb_index(5, ZeroBits()) < grid.n_cells
    rng = random.Random(3)
    assert all(0 <= mechanism.perturb_index(5, rng) < grid.n_cells for _ in range(100))
    for epsilon in (math.nextafter(at_limit, 0), 1e-300, 1e-308, 5e-324):
        with pytest.raises(ValueError, match=r"epsilon \* cell_size_m must be at least 2\*\*-47"):
            PlanarLaplace(epsilon=epsilon, grid=grid)
    # Far below it the radius overflows and the sampler fails: what the check stops.
    with pytest.raises(ValueError, match="NaN"):
        unchecked_planar(1e-308, grid).perturb_index(5, ZeroBits())


def test_planar_epsilon_overflow_limit_is_exact():
    # With 1e300 m cells the resolution limit is far below the overflow of the largest radius,
    # (2 * 1074 ln 2) / epsilon plus the centre: find the exact epsilon where it stays finite.
    grid = Grid(Region(0.0, 1.0, 0.0, 1.0), 1e300)
    assert grid.n_cells == 1

    def accepted(epsilon):
        try:
            PlanarLaplace(epsilon=epsilon, grid=grid)
        except ValueError:
            return False
        return True

    low, high = 1e-307, 1e-304
    assert not accepted(low) and accepted(high)
    while math.nextafter(low, high) != high:
        middle = (low + high) / 2
        low, high = (low, middle) if accepted(middle) else (middle, high)
    assert high == pytest.approx(2 * 1074 * math.log(2) / 1.7976931348623157e308, rel=1e-12)
    # At the limit the extreme draw is finite; one double below it the sampler meets infinity.
    assert PlanarLaplace(epsilon=high, grid=grid).perturb_index(0, ZeroBits()) == 0
    with pytest.raises(ValueError, match="NaN"):
        unchecked_planar(low, grid).perturb_index(0, ZeroBits())
    with pytest.raises(ValueError, match="largest radius"):
        PlanarLaplace(epsilon=low, grid=grid)


def test_planar_epsilon_beyond_the_reach_limit_is_refused():
    grid = small_grid(4, 4, 128.0)
    span = math.hypot(4, 4) * 128.0
    limit = 2 * 1022 * math.log(2)  # exponentials are finely resolved up to 1022 ln 2 each
    epsilon = limit / span
    while epsilon * span > limit:
        epsilon = math.nextafter(epsilon, 0)
    while math.nextafter(epsilon, math.inf) * span <= limit:
        epsilon = math.nextafter(epsilon, math.inf)
    assert 0 <= PlanarLaplace(epsilon=epsilon, grid=grid).perturb_index(15, ZeroBits()) < 16
    for too_large in (math.nextafter(epsilon, math.inf), 1e3, 1e308):
        with pytest.raises(ValueError, match="too large for this grid"):
            PlanarLaplace(epsilon=too_large, grid=grid)


def test_krr_draw_maps_to_reports_exactly():
    # randbelow(total) reads total.bit_length() bits; scripted draws hit every boundary.
    mechanism = KRR(epsilon=1.0, domain=labels(4))
    keep, unit = mechanism.keep_weight, mechanism.unit_weight

    class Draw:
        def __init__(self, value):
            self.value = value

        def getrandbits(self, k):
            assert k == mechanism.total_weight.bit_length()
            return self.value

    for x in range(4):
        assert mechanism.perturb_index(x, Draw(0)) == x
        assert mechanism.perturb_index(x, Draw(keep - 1)) == x
        others = [y for y in range(4) if y != x]
        for j, y in enumerate(others):
            assert mechanism.perturb_index(x, Draw(keep + j * unit)) == y
            assert mechanism.perturb_index(x, Draw(keep + (j + 1) * unit - 1)) == y
    assert mechanism.perturb_index(3, Draw(mechanism.total_weight - 1)) == 2


class CountingSource:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.requests = []

    def getrandbits(self, k):
        self.requests.append(k)
        return self.rng.getrandbits(k)


@pytest.mark.parametrize(
    "mechanism",
    [KRR(epsilon=1.0, domain=labels(5)), PlanarLaplace(epsilon=PLANAR_EPSILON, grid=PLANAR_GRID)],
    ids=["krr", "planar"],
)
def test_randomness_consumed_does_not_depend_on_the_true_value(mechanism):
    consumed = []
    for x in range(mechanism.n_inputs):
        source = CountingSource(seed=42)
        for _ in range(50):
            mechanism.perturb_index(x, source)
        consumed.append(source.requests)
    assert all(requests == consumed[0] for requests in consumed)


# -- interface -----------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [True, "1", None, [1.0]])
def test_epsilon_of_the_wrong_type_is_a_type_error(epsilon):
    with pytest.raises(TypeError):
        KRR(epsilon=epsilon, domain=labels(3))
    with pytest.raises(TypeError):
        PlanarLaplace(epsilon=epsilon, grid=PLANAR_GRID)


@pytest.mark.parametrize("epsilon", [0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_epsilon_out_of_range_is_a_value_error(epsilon):
    with pytest.raises(ValueError, match="epsilon"):
        KRR(epsilon=epsilon, domain=labels(3))
    with pytest.raises(ValueError, match="epsilon"):
        PlanarLaplace(epsilon=epsilon, grid=PLANAR_GRID)


def test_domain_and_grid_validation():
    with pytest.raises(TypeError):
        KRR(epsilon=1.0, domain="abc")
    with pytest.raises(TypeError):
        KRR(epsilon=1.0, domain={"a", "b"})
    with pytest.raises(TypeError):
        KRR(epsilon=1.0, domain=["a", 2])
    with pytest.raises(ValueError):
        KRR(epsilon=1.0, domain=["a"])
    with pytest.raises(ValueError):
        KRR(epsilon=1.0, domain=["a", "b", "a"])
    with pytest.raises(ValueError):
        RandomizedResponse(epsilon=1.0, domain=labels(3))
    with pytest.raises(TypeError):
        PlanarLaplace(epsilon=0.01, grid=(6, 5))
    assert RandomizedResponse(epsilon=1.0).domain == ("no", "yes")


def test_krr_encode_report_and_parse():
    mechanism = KRR(epsilon=1.0, domain=("apple", "banana", "cherry"))
    assert [mechanism.encode(v) for v in ("apple", "banana", "cherry")] == [0, 1, 2]
    for y in range(3):
        assert mechanism.parse_report_value(mechanism.report_value(y)) == y
    for bad in ("durian", "", None, 1, ["apple"]):
        with pytest.raises(ReportError) as info:
            mechanism.encode(bad)
        assert info.value.field == "value"
        with pytest.raises(ReportError) as info:
            mechanism.parse_report_value(bad, field="reports[2].value")
        assert info.value.field == "reports[2].value"
    rng = random.Random(1)
    assert {mechanism.perturb("banana", rng) for _ in range(200)} == {"apple", "banana", "cherry"}
    # Without an injected source the system CSPRNG is used.
    assert mechanism.perturb("apple") in mechanism.domain


def test_planar_encode_report_and_parse():
    mechanism = PlanarLaplace(epsilon=PLANAR_EPSILON, grid=PLANAR_GRID)
    grid = mechanism.grid
    for y in range(mechanism.n_outputs):
        value = mechanism.report_value(y)
        assert set(value) == {"lat", "lon"}
        assert mechanism.parse_report_value(value) == y
    region = grid.region
    inside = {"lat": region.lat_min + 1e-5, "lon": region.lon_min + 1e-5}
    assert mechanism.encode(inside) == 0
    assert mechanism.encode((region.lat_max, region.lon_max)) == grid.n_cells - 1
    bad_values = [
        {"lat": region.lat_min - 1e-4, "lon": region.lon_min + 1e-5},  # outside the region
        {"lat": region.lat_min + 1e-5},
        {"lat": 45.0, "lon": 7.0, "alt": 3},
        {"lat": float("nan"), "lon": 7.0},
        {"lat": True, "lon": 7.0},
        "45.0,7.0",
        None,
    ]
    for bad in bad_values:
        with pytest.raises(ReportError):
            mechanism.encode(bad)
    off_centre = dict(mechanism.report_value(3))
    off_centre["lat"] += 1e-4
    for bad in (off_centre, [45.0, 7.0], {"lat": "45", "lon": 7.0}, None):
        with pytest.raises(ReportError) as info:
            mechanism.parse_report_value(bad, field="value")
        assert info.value.field is not None and info.value.field.startswith("value")
    report = mechanism.perturb(inside, random.Random(3))
    assert 0 <= mechanism.parse_report_value(report) < mechanism.n_outputs


def test_from_spec_builds_each_mechanism():
    rr = Mechanism.from_spec(
        CampaignSpec.from_dict({"id": "a", "title": "A", "mechanism": "rr", "epsilon": 2})
    )
    assert type(rr) is RandomizedResponse and rr.epsilon == 2.0
    krr = Mechanism.from_spec(
        CampaignSpec.from_dict(
            {"id": "b", "title": "B", "mechanism": "krr", "epsilon": 1, "domain": ["x", "y", "z"]}
        )
    )
    assert type(krr) is KRR and krr.domain == ("x", "y", "z")
    region = Region(45.0, 45.01, 7.0, 7.01)
    planar = Mechanism.from_spec(
        CampaignSpec.from_dict(
            {
                "id": "c",
                "title": "C",
                "mechanism": "planar_laplace",
                "epsilon": 0.01,
                "region": region.to_dict(),
                "cell_size_m": 250,
            }
        )
    )
    assert type(planar) is PlanarLaplace and planar.grid == Grid(region, 250.0)
    assert planar.n_inputs == planar.n_outputs == planar.grid.n_cells


def test_from_spec_names_a_categorical_spec_without_a_domain():
    """Built by hand (parsing never gives one): refused by name, not with a TypeError."""
    spec = CampaignSpec(id="d", title="D", mechanism="krr", epsilon=1.0)
    with pytest.raises(ValueError, match=r"campaign 'd' \(krr\) has no domain"):
        Mechanism.from_spec(spec)

"""Memoization: a deterministic, keyed bit stream that still gives the mechanism's distribution."""

from __future__ import annotations

import hashlib
import hmac
import math
import uuid

import pytest

from client.memo import SECRET_BYTES, HmacRandom, memo_rng, report_id, value_tag
from shared.mechanisms import KRR, PlanarLaplace
from shared.rng import randbelow
from shared.spec import CampaignSpec

SECRET = bytes(range(SECRET_BYTES))
HASH = "ab" * 32


def test_the_stream_is_hmac_sha256_in_counter_mode():
    key = b"k" * 32
    stream = HmacRandom(key)
    block0 = hmac.new(key, (0).to_bytes(8, "big"), hashlib.sha256).digest()
    block1 = hmac.new(key, (1).to_bytes(8, "big"), hashlib.sha256).digest()
    assert stream.getrandbits(256) == int.from_bytes(block0, "big")
    # 12 bits take 2 fresh bytes and keep the top 12.
    assert stream.getrandbits(12) == int.from_bytes(block1[:2], "big") >> 4
    assert stream.getrandbits(0) == 0


def test_same_inputs_same_stream_and_any_change_changes_it():
    def draw(secret=SECRET, campaign="c", spec_hash=HASH, index=3):
        return memo_rng(secret, campaign, spec_hash, index).getrandbits(128)

    base = draw()
    assert draw() == base
    others = [
        draw(secret=bytes(32)),
        draw(campaign="d"),
        draw(spec_hash="cd" * 32),
        draw(index=4),
        draw(index=30),
        draw(campaign="c3"),  # no ambiguity between campaign and index
    ]
    assert base not in others and len(set(others)) == len(others)


def test_the_ledger_tag_is_not_the_memo_stream():
    tag = value_tag(SECRET, "c", HASH, 3)
    assert tag == value_tag(SECRET, "c", HASH, 3) != value_tag(SECRET, "c", HASH, 4)
    assert int(tag, 16) != memo_rng(SECRET, "c", HASH, 3).getrandbits(256)


def test_the_report_id_is_one_per_period_and_unrelated_across_periods():
    rid = report_id(SECRET, "c", HASH, "2025-W03")
    assert rid == report_id(SECRET, "c", HASH, "2025-W03")
    parsed = uuid.UUID(rid)
    assert str(parsed) == rid and parsed.version == 4
    others = [
        report_id(SECRET, "c", HASH, "2025-W04"),
        report_id(SECRET, "c", HASH, "once"),
        report_id(SECRET, "d", HASH, "2025-W03"),
        report_id(SECRET, "c", "cd" * 32, "2025-W03"),
        report_id(bytes(32), "c", HASH, "2025-W03"),
        report_id(SECRET, "c2", HASH, "025-W03"),  # no ambiguity between campaign and period
    ]
    assert rid not in others and len(set(others)) == len(others)
    # Neither the ledger's tag nor the memo stream.
    assert parsed.bytes[:6] != bytes.fromhex(value_tag(SECRET, "c", HASH, 0))[:6]


@pytest.mark.parametrize("bad", [b"short", "x" * 32, bytes(33)])
def test_secrets_of_the_wrong_size_are_refused(bad):
    with pytest.raises(ValueError, match="32 bytes"):
        memo_rng(bad, "c", HASH, 0)
    with pytest.raises(ValueError, match="32 bytes"):
        report_id(bad, "c", HASH, "once")


def test_bits_are_uniform():
    stream = HmacRandom(b"u" * 32)
    n, k = 40_000, 3
    counts = [0] * (1 << k)
    for _ in range(n):
        counts[stream.getrandbits(k)] += 1
    # Chi-square with 7 degrees of freedom: P(> 24.3) ~ 0.001.
    expected = n / len(counts)
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 24.3


def test_memoized_krr_reports_have_the_mechanism_distribution():
    """Across users (secrets), memoized reports keep the true label with probability p."""
    mechanism = KRR(epsilon=1.0, domain=["a", "b", "c", "d"])
    n = 20_000
    kept = 0
    for user in range(n):
        secret = hashlib.sha256(b"user %d" % user).digest()
        kept += mechanism.perturb_index(2, memo_rng(secret, "c", HASH, 2)) == 2
    p = mechanism.p_keep
    # Stated tolerance: 4.5 standard deviations of a binomial proportion.
    assert abs(kept / n - p) < 4.5 * math.sqrt(p * (1 - p) / n)


def test_memoized_planar_radius_has_the_gamma_mean():
    """The noise radius before snapping is Gamma(2, 1/eps): mean 2/eps, sd sqrt(2)/eps."""
    spec = CampaignSpec.from_dict(
        {
            "id": "p",
            "title": "p",
            "mechanism": "planar_laplace",
            "epsilon": 0.01,
            "region": {"lat_min": 0.0, "lat_max": 0.04, "lon_min": 0.0, "lon_max": 0.04},
            "cell_size_m": 10.0,
        }
    )
    mechanism = PlanarLaplace(epsilon=spec.epsilon, grid=spec.grid)
    centre = spec.grid.cell_of_xy(spec.grid.width_m / 2, spec.grid.height_m / 2)
    cx, cy = spec.grid.centre_xy(centre)
    n = 4000
    radii = []
    for user in range(n):
        secret = hashlib.sha256(b"u%d" % user).digest()
        y = mechanism.perturb_index(centre, memo_rng(secret, "p", HASH, centre))
        x2, y2 = spec.grid.centre_xy(y)
        radii.append(math.hypot(x2 - cx, y2 - cy))
    mean = sum(radii) / n
    # Snapping to 10 m cells moves a point by at most 7.1 m; tolerance 4.5 sd of the mean + that.
    assert abs(mean - 2 / 0.01) < 4.5 * math.sqrt(2) / 0.01 / math.sqrt(n) + 7.1


def test_stream_drives_exact_integer_sampling():
    stream = HmacRandom(b"r" * 32)
    draws = [randbelow(stream, 5) for _ in range(5000)]
    assert set(draws) == set(range(5))

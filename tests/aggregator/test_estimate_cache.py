"""The estimate cache lives in a budget of its own: it can never push reports out of Redis.

Unit tests run :class:`EstimateCache` on the session's real Redis with a clock of their
own; the app tests run an embedded Redis with a small ``maxmemory`` and ask for every
cacheable variant of large estimates while reports keep coming.
"""

from __future__ import annotations

import random

import pytest
import redis
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.http.estimates import CONFIDENCE_LEVELS
from aggregator.services import EXTENSION
from aggregator.settings import Settings, SettingsError
from aggregator.storage import keys
from aggregator.storage.capacity import MemoryReading
from aggregator.storage.estimate_cache import (
    BOOKKEEPING_BYTES,
    ESTIMATE_CACHE_TTL_S,
    EVICT_AT_ONCE,
    UNLIMITED_TOTAL_BYTES,
    CacheBudget,
    EstimateCache,
    allocated,
    reserved_bytes,
)
from aggregator.storage.redis_server import EmbeddedRedis

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
DIGEST = "d" * 64
SEEN = "spec:1.0:10:1,2,3"
BODY_BYTES = 100_000
# Every method a k-RR estimate takes (smoothing is for grids).
KRR_METHODS = ("projection", "mle", "ibu", "clip", "inversion")
SMALL_LIMIT = 8 * 2**20
LABELS = 4000


@pytest.fixture
def now(connection):
    """The caches' clock, unix seconds moved by hand: from Redis's now, which expires keys."""
    seconds, micros = connection.time()
    return [seconds + micros / 1e6]


def body(n: int = BODY_BYTES, fill: str = "x") -> str:
    return fill * n


def one_entry(campaign_id: str = "fruit", variant: str = "projection:0.95:4") -> int:
    """What :func:`reserved_bytes` reserves for a :func:`body` under this key."""
    key = keys.estimate(campaign_id, variant)
    return reserved_bytes(key, {"counts_digest": DIGEST, "body": body(), "reports": SEEN})


def put(cache: EstimateCache, campaign_id: str, variant: str, now: list[float], **kwargs) -> bool:
    """Cache a :func:`body` one second after the previous one."""
    now[0] += 1
    return cache.put(campaign_id, variant, DIGEST, kwargs.pop("text", body()), reports=SEEN)


def kept(cache: EstimateCache, campaign_id: str, variant: str) -> bool:
    return cache.get(campaign_id, variant, reports=SEEN) is not None


def test_the_default_caps_are_shares_of_maxmemory():
    assert CacheBudget().caps(1000 * 2**20) == (100 * 2**20, 25 * 2**20)
    assert CacheBudget().caps(0) == (UNLIMITED_TOTAL_BYTES, UNLIMITED_TOTAL_BYTES // 4)
    assert CacheBudget(total_bytes=8000).caps(10**9) == (8000, 2000)
    assert CacheBudget(campaign_bytes=10**9).caps(1000) == (100, 100)  # never past the total
    assert CacheBudget(total_bytes=0).caps(10**9) == (0, 0)


def test_an_entry_is_reserved_the_allocators_size_class():
    assert [allocated(n) for n in (100, 1024, 1025, 23_000_000)] == [112, 1024, 1280, 24 * 2**20]
    assert all(n <= allocated(n) < 1.25 * n + 16 for n in range(1, 5000, 7))
    # A 512 x 512 grid's 23 MB variant fits in a campaign's default cap at 1 GiB.
    grid = reserved_bytes("ldp:{c:g}:estimate:mle:0.95:4", {"body": "x" * 23_000_000})
    assert grid <= CacheBudget().caps(2**30)[1]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"high_water": 0}, ValueError),
        ({"high_water": 1.5}, ValueError),
        ({"high_water": True}, TypeError),
        ({"total_bytes": -1}, ValueError),
        ({"total_bytes": 1.5}, TypeError),
        ({"campaign_bytes": "1mb"}, TypeError),
    ],
)
def test_a_bad_budget_is_refused(fields, error):
    with pytest.raises(error):
        CacheBudget(**fields)


def test_a_campaign_over_its_cap_evicts_its_least_recently_computed_entries(connection, now):
    cache = EstimateCache(
        connection, budget=CacheBudget(campaign_bytes=int(2.5 * one_entry())), clock=lambda: now[0]
    )
    assert put(cache, "other", "a", now)
    for variant in ("a", "b"):
        assert put(cache, "fruit", variant, now)
    assert put(cache, "fruit", "a", now)  # computed again: now the most recent
    assert put(cache, "fruit", "c", now)  # room for two: b, the least recent, goes
    assert [kept(cache, "fruit", v) for v in "abc"] == [True, False, True]
    assert kept(cache, "other", "a")  # another campaign's entries are not touched
    assert cache.bytes_used("fruit") <= int(2.5 * one_entry())
    assert cache.bytes_used() == cache.bytes_used("fruit") + cache.bytes_used("other")
    assert not connection.exists(cache.key("fruit", "b"))


def test_the_total_cap_holds_across_processes_evicting_the_least_recently_computed(
    redis_url, connection, now
):
    budget = CacheBudget(total_bytes=int(2.5 * one_entry()), campaign_bytes=one_entry())
    first = EstimateCache(connection, budget=budget, clock=lambda: now[0])
    other_connection = redis.Redis.from_url(redis_url)
    second = EstimateCache(other_connection, budget=budget, clock=lambda: now[0])
    assert put(first, "fruit", "a", now)
    assert put(second, "veg", "a", now)
    assert put(first, "nuts", "a", now)  # full: the oldest entry of any campaign goes
    assert [kept(first, c, "a") for c in ("fruit", "veg", "nuts")] == [False, True, True]
    assert not connection.exists(first.key("fruit", "a"))
    assert first.bytes_used() == second.bytes_used("veg") + second.bytes_used("nuts")
    assert first.bytes_used() <= budget.total_bytes
    other_connection.close()


def test_past_the_total_an_entry_is_refused_if_the_oldest_would_not_make_room(connection, now):
    cache = EstimateCache(
        connection,
        budget=CacheBudget(total_bytes=int(1.5 * one_entry()), campaign_bytes=one_entry()),
        clock=lambda: now[0],
    )
    for n in range(EVICT_AT_ONCE + 1):
        assert put(cache, "many", f"small{n}", now, text=body(1000))
    assert put(cache, "fruit", "a", now)
    assert not put(cache, "veg", "a", now)
    assert not connection.exists(cache.key("veg", "a"))
    assert kept(cache, "fruit", "a") and kept(cache, "many", "small0")
    # A replacement that does not fit is refused, and its stale entry dropped.
    assert not cache.put("fruit", "a", DIGEST, body(2 * BODY_BYTES), reports=SEEN)
    assert not kept(cache, "fruit", "a") and cache.bytes_used("fruit") == 0
    assert cache.bytes_used() == cache.bytes_used("many") <= int(1.5 * one_entry())


def test_replacing_an_entry_counts_it_once(connection, now):
    cache = EstimateCache(connection, clock=lambda: now[0])
    assert put(cache, "fruit", "a", now)
    once = cache.bytes_used()
    assert BODY_BYTES < once <= one_entry()
    assert put(cache, "fruit", "a", now)
    again = cache.bytes_used()  # measured again by Redis: within a few bytes of the first
    assert again == cache.bytes_used("fruit") == int(connection.get(keys.CACHE_TOTAL))
    assert abs(again - once) < BOOKKEEPING_BYTES
    assert connection.zcard(keys.CACHE_EXPIRY) == 1


def test_an_entry_larger_than_a_campaign_may_hold_is_not_kept(connection, now):
    cache = EstimateCache(
        connection,
        budget=CacheBudget(campaign_bytes=one_entry("fruit", "a") - 1),
        clock=lambda: now[0],
    )
    assert not put(cache, "fruit", "a", now)
    assert connection.keys("ldp:*") == []
    assert put(cache, "fruit", "small", now, text=body(1000))


def test_nothing_is_cached_above_the_cache_mark(connection, now):
    used = [10]
    cache = EstimateCache(
        connection,
        budget=CacheBudget(high_water=0.75),
        memory=lambda: MemoryReading(used[0] * 2**20, 100 * 2**20, 90 * 2**20),
        clock=lambda: now[0],
    )
    assert put(cache, "fruit", "a", now)
    used[0] = 75  # above the cache's mark, below the reports'
    assert not cache.put("fruit", "a", "e" * 64, body(), reports="newer")
    # The stale entry is dropped rather than kept next to a newer estimate.
    assert cache.get("fruit", "a", reports=SEEN) is None and cache.bytes_used() == 0
    assert not put(cache, "fruit", "b", now)
    used[0] = 74
    assert put(cache, "fruit", "b", now)
    # Without maxmemory there is no mark (and the caps of an unlimited Redis).
    unlimited = EstimateCache(
        connection, memory=lambda: MemoryReading(10**12, 0, 0), clock=lambda: now[0]
    )
    assert put(unlimited, "fruit", "c", now)


def test_expired_entries_leave_the_count(connection, now):
    budget = CacheBudget(total_bytes=2 * one_entry(), campaign_bytes=one_entry())
    cache = EstimateCache(connection, budget=budget, clock=lambda: now[0])
    assert put(cache, "fruit", "a", now) and put(cache, "veg", "a", now)
    assert cache.bytes_used() == cache.bytes_used("fruit") + cache.bytes_used("veg") > 0
    now[0] += ESTIMATE_CACHE_TTL_S - 1  # the first one's expiry, a second before the other's
    assert cache.bytes_used() == cache.bytes_used("veg") > 0 == cache.bytes_used("fruit")
    now[0] += 1
    assert cache.bytes_used() == 0
    assert put(cache, "nuts", "a", now)
    assert cache.bytes_used() == cache.bytes_used("nuts") > 0
    assert int(connection.get(keys.CACHE_TOTAL)) == cache.bytes_used()
    assert connection.zcard(keys.CACHE_EXPIRY) == 1
    # The campaign's own ledger drops its expired entries (and their bodies) when it is
    # next written, by the same clock as the total.
    assert put(cache, "fruit", "b", now)
    assert connection.zrange(keys.estimate_expiry("fruit"), 0, -1) == [
        cache.key("fruit", "b").encode()
    ]
    assert not connection.exists(cache.key("fruit", "a"))
    # Every key of the cache expires with its last entry.
    assert all(connection.pttl(key) > 0 for key in connection.keys("ldp:*estimate*"))


def test_the_counted_bytes_cover_what_redis_allocates(connection, now):
    cache = EstimateCache(connection, clock=lambda: now[0])
    rng = random.Random(46)
    for n in range(30):
        size = rng.choice((300, 5_000, 70_000, 400_000))
        campaign = f"c{n % 3}"
        assert cache.put(campaign, f"projection:0.95:4:w{n}", DIGEST, body(size), reports=SEEN)
    allocated = sum(
        connection.memory_usage(key, samples=0) for key in connection.keys("ldp:*estimate*")
    )
    counted = cache.bytes_used()
    assert allocated <= counted <= allocated + 30 * BOOKKEEPING_BYTES


def test_the_cache_settings():
    settings = Settings.from_env(
        {"LDP_CACHE_MAX_BYTES": "64mb", "LDP_CACHE_CAMPAIGN_MAX_BYTES": "16mb"}
    )
    assert settings.cache_budget == CacheBudget(0.75, 64 * 2**20, 16 * 2**20)
    assert Settings(storage_high_water=0.6).cache_budget.high_water == pytest.approx(0.5)
    assert Settings(cache_high_water=0.5).cache_budget.high_water == 0.5
    assert Settings(cache_max_bytes=0).cache_budget.caps(10**9) == (0, 0)
    with pytest.raises(SettingsError, match="LDP_CACHE_HIGH_WATER must be below") as refused:
        Settings.from_env({"LDP_CACHE_HIGH_WATER": "0.9"})
    assert refused.value.env_var == "LDP_CACHE_HIGH_WATER"
    with pytest.raises(SettingsError, match="at most LDP_CACHE_MAX_BYTES") as refused:
        Settings(cache_max_bytes=10, cache_campaign_max_bytes=11)
    assert refused.value.env_var == "LDP_CACHE_CAMPAIGN_MAX_BYTES"
    with pytest.raises(SettingsError, match="LDP_CACHE_MAX_BYTES must be"):
        Settings.from_env({"LDP_CACHE_MAX_BYTES": "lots"})


# -- the app on a small Redis ------------------------------------------------------------


@pytest.fixture
def small_redis(tmp_path):
    with EmbeddedRedis(tmp_path / "data", maxmemory=SMALL_LIMIT) as server:
        yield server


@pytest.fixture
def small_app(config, small_redis):
    """An app on :func:`small_redis` that reads its memory on every check, with ``settings``."""
    return lambda **settings: create_app(
        {**config, "REDIS_URL": small_redis.url, "STORAGE_CHECK_INTERVAL_S": 0, **settings}
    )


def large_campaign(client, campaign_id: str, rng: random.Random) -> list[str]:
    """A k-RR campaign over :data:`LABELS` labels (an estimate of about 0.45 MB)."""
    labels = [f"label-{campaign_id}-{i:05d}" for i in range(LABELS)]
    spec = {"id": campaign_id, "title": "Many labels", "mechanism": "krr", "epsilon": 2.0}
    response = client.post("/api/v1/campaigns", json={**spec, "domain": labels}, headers=ADMIN)
    assert response.status_code == 201
    for _ in range(2):
        send(client, campaign_id, labels, rng, 1000)
    return labels


def send(client, campaign_id: str, labels: list[str], rng: random.Random, n: int) -> None:
    reports = [{"report_id": new_id(), "value": rng.choice(labels)} for _ in range(n)]
    response = client.post(f"/api/v1/campaigns/{campaign_id}/reports", json={"reports": reports})
    assert response.status_code == 200, response.get_json()


def estimate_keys(connection: redis.Redis) -> list[bytes]:
    return connection.keys("ldp:{c:*}:estimate:*")


def test_reports_go_on_while_analysts_ask_for_every_variant_of_large_estimates(
    small_redis, small_app
):
    app = small_app(CACHE_MAX_BYTES="2mb", CACHE_CAMPAIGN_MAX_BYTES=1_500_000)
    client = app.test_client()
    connection = redis.Redis.from_url(small_redis.url)
    rng = random.Random(46)
    campaigns = {campaign_id: large_campaign(client, campaign_id, rng) for campaign_id in "ab"}
    store = app.extensions[EXTENSION].get()
    cache = store.estimates
    total_cap, campaign_cap = cache.budget.caps(SMALL_LIMIT)
    assert (total_cap, campaign_cap) == (2 * 2**20, 1500 * 1000)
    high_water = int(SMALL_LIMIT * 0.9)
    used_before = connection.info("memory")["used_memory"]

    computed, peak, most = [], used_before, 0
    for campaign_id, labels in campaigns.items():
        for method in KRR_METHODS:
            for confidence in CONFIDENCE_LEVELS:
                url = f"/api/v1/campaigns/{campaign_id}/estimate"
                answer = client.get(
                    url, query_string={"method": method, "confidence": confidence}, headers=ANALYST
                )
                assert answer.status_code == 200, answer.get_json()
                computed.append(len(answer.get_data()))
                send(client, campaign_id, labels, rng, 50)  # never 507
                assert cache.bytes_used() <= total_cap
                assert cache.bytes_used(campaign_id) <= campaign_cap
                peak = max(peak, connection.info("memory")["used_memory"])
                most = max(most, len(estimate_keys(connection)))

    # Cached as they were, the 40 bodies alone would have crossed the reports' mark.
    assert sum(computed) > high_water - used_before
    assert len(computed) == 2 * len(KRR_METHODS) * len(CONFIDENCE_LEVELS)
    assert peak < high_water
    held = sum(connection.memory_usage(key, samples=0) for key in estimate_keys(connection))
    assert 0 < held <= cache.bytes_used() <= total_cap
    assert 2 <= most < 8  # evicted as they came (2 x 20 were computed)
    print(
        f"\n{len(computed)} estimates, {sum(computed)} bytes in all, reports' mark "
        f"{high_water - used_before} bytes away; at most {most} cached at once; Redis's peak "
        f"{peak} bytes ({peak / SMALL_LIMIT:.3f} of maxmemory); cache {cache.bytes_used()} "
        f"bytes counted, {held} allocated (caps {total_cap}, {campaign_cap} a campaign)"
    )
    # The cache still serves: the last variant is there, as long as no report came since.
    url = "/api/v1/campaigns/b/estimate?method=inversion&confidence=0.99"
    assert client.get(url, headers=ANALYST).headers["X-Estimate-Cache"] == "miss"
    assert client.get(url, headers=ANALYST).headers["X-Estimate-Cache"] == "hit"
    health = client.get("/api/v1/health").get_json()["storage"]
    assert health["accepting_reports"] is True
    assert health["refused"]["storage_full"] == {"submissions": 0, "reports": 0}
    connection.close()


def test_above_the_cache_mark_estimates_are_answered_not_cached(small_redis, small_app):
    app = small_app()
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    send(client, "fruit", KRR_SPEC["domain"], random.Random(46), 100)
    connection = redis.Redis.from_url(small_redis.url)
    # Something else takes Redis to 80 % of maxmemory: past the cache's mark (75 %), short
    # of the reports' (90 %).
    part = 0
    while connection.info("memory")["used_memory"] < 0.8 * SMALL_LIMIT:
        connection.set(f"ballast:{part}", b"\0" * 2**16)
        part += 1
    url = "/api/v1/campaigns/fruit/estimate"
    for _ in range(2):
        answer = client.get(url, headers=ANALYST)
        assert answer.status_code == 200 and answer.headers["X-Estimate-Cache"] == "miss"
    assert estimate_keys(connection) == []
    send(client, "fruit", KRR_SPEC["domain"], random.Random(47), 100)
    connection.delete(*(f"ballast:{n}" for n in range(part)))
    client.get(url, headers=ANALYST)
    assert client.get(url, headers=ANALYST).headers["X-Estimate-Cache"] == "hit"
    connection.close()

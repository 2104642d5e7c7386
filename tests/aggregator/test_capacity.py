"""A flood of reports cannot fill Redis: memory limit, high-water refusal, quotas, budgets.

Each test that fills the store runs its own embedded Redis with a small
``maxmemory``: reports stop at the high-water mark with 507 and
``Retry-After``, while health, reads, estimates and the dashboard's sign-in go
on in the reserve, and everything acknowledged is still there after a restart.
"""

from __future__ import annotations

import re

import pytest
import redis
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage.capacity import CapacityGuard
from aggregator.storage.redis_server import EmbeddedRedis, default_maxmemory, parse_memory_size
from aggregator.storage.store import CampaignStore

REPORTS = "/api/v1/campaigns/fruit/reports"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SMALL_LIMIT = 8 * 2**20


def batch(n: int, ids: list[str] | None = None) -> dict:
    ids = ids or [new_id() for _ in range(n)]
    return {
        "reports": [{"report_id": i, "value": KRR_SPEC["domain"][k % 4]} for k, i in enumerate(ids)]
    }


def make_app(redis_url: str, **settings):
    return create_app(
        {
            "REDIS_URL": redis_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "ANALYST_TOKEN": ANALYST_TOKEN,
            "RATELIMIT_REPORTS": "100000 per minute",
            "REPORT_BUDGET": "10000000 per hour",
            "STORAGE_CHECK_INTERVAL_S": 0,
            **settings,
        }
    )


def sign_in(client) -> int:
    page = client.get("/dashboard/login")
    assert page.status_code == 200
    csrf = CSRF.search(page.get_data(as_text=True)).group(1)
    response = client.post("/dashboard/login", data={"csrf_token": csrf, "token": ANALYST_TOKEN})
    return response.status_code


@pytest.fixture
def small_redis(tmp_path):
    with EmbeddedRedis(tmp_path / "data", maxmemory=SMALL_LIMIT) as server:
        yield server


def test_the_embedded_redis_has_a_memory_limit_and_never_evicts(tmp_path):
    with EmbeddedRedis(tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        assert int(client.config_get("maxmemory")["maxmemory"]) == default_maxmemory()
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        client.close()
    with EmbeddedRedis(tmp_path, maxmemory="64mb") as server:
        client = redis.Redis.from_url(server.url)
        assert int(client.config_get("maxmemory")["maxmemory"]) == 64 * 2**20
        client.close()


@pytest.mark.parametrize(
    ("setting", "size"),
    [
        (None, None),
        (0, 0),
        (1234, 1234),
        ("512mb", 512 * 2**20),
        ("2gb", 2 * 2**30),
        ("10k", 10_000),
    ],
)
def test_memory_sizes(setting, size):
    assert parse_memory_size(setting) == size


@pytest.mark.parametrize("setting", ["lots", "-1", -1, True, "12 parsecs"])
def test_bad_memory_sizes_are_refused(setting):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory_size(setting)


def test_a_full_store_refuses_reports_and_keeps_serving_everything_else(small_redis):
    # Raw reports kept: 8 MB fill up within seconds (counts alone take ten times longer).
    app = make_app(small_redis.url, RAW_REPORTS="keep")
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    accepted, refused = 0, None
    for _ in range(200):
        response = client.post(REPORTS, json=batch(1000))
        if response.status_code != 200:
            refused = response
            break
        accepted += response.get_json()["accepted"]
    assert refused is not None, "8 MB should fill up with 200,000 reports"
    assert refused.status_code == 507
    assert refused.get_json()["error"]["code"] == "storage_full"
    assert int(refused.headers["Retry-After"]) > 0
    connection = redis.Redis.from_url(small_redis.url)
    info = connection.info("memory")
    assert info["used_memory"] < info["maxmemory"]  # refused below the limit, not at it

    # Every further report is refused too, and writes nothing.
    assert client.post(REPORTS, json=batch(1)).status_code == 507
    # Health answers and says so; reads, estimates, sign-in and failed-token counting work.
    health = client.get("/api/v1/health")
    assert health.status_code == 200
    storage = health.get_json()["storage"]
    assert storage["accepting_reports"] is False
    assert storage["refused"]["storage_full"] == {"submissions": 2, "reports": 1001}
    assert client.get("/api/v1/campaigns").status_code == 200
    counts = client.get("/api/v1/campaigns/fruit/counts", headers=ANALYST)
    assert counts.status_code == 200 and counts.get_json()["n"] == accepted
    assert client.get("/api/v1/campaigns/fruit/estimate", headers=ANALYST).status_code == 200
    wrong = {"Authorization": "Bearer " + "x" * 40}
    assert client.get("/api/v1/campaigns/fruit/counts", headers=wrong).status_code == 401
    dashboard = app.test_client()
    assert sign_in(dashboard) == 303
    assert dashboard.get("/dashboard/campaigns/fruit").status_code == 200

    # Nothing acknowledged is lost, through a restart on the append-only file.
    store = CampaignStore(connection)
    assert sum(store.counts("fruit").values()) == accepted
    assert len(list(store.iter_reports("fruit"))) == accepted
    connection.close()
    small_redis.stop()
    small_redis.start()
    connection = redis.Redis.from_url(small_redis.url)
    assert CampaignStore(connection).get_campaign("fruit").n_reports == accepted
    connection.close()


def test_reads_and_health_answer_even_at_the_hard_limit(small_redis):
    app = make_app(small_redis.url)
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    assert client.post(REPORTS, json=batch(100)).status_code == 200
    # Something else filled Redis to its limit: every write command is refused.
    connection = redis.Redis.from_url(small_redis.url)
    connection.config_set("maxmemory", connection.info("memory")["used_memory"] // 2)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        connection.set("probe", "x")
    assert client.get("/api/v1/health").status_code == 200
    assert client.get("/api/v1/campaigns").status_code == 200
    assert client.get("/api/v1/campaigns/fruit").status_code == 200
    assert client.get("/dashboard/login").status_code == 200  # its limiter counter is skipped
    # The estimate is computed but not cached.
    estimate = client.get("/api/v1/campaigns/fruit/estimate", headers=ANALYST)
    assert estimate.status_code == 200 and estimate.get_json()["n"] == 100
    response = client.post(REPORTS, json=batch(1))
    assert response.status_code == 507 and "Retry-After" in response.headers
    connection.config_set("maxmemory", SMALL_LIMIT)
    connection.close()


def test_the_high_water_reading_is_cached_for_its_interval(small_redis):
    connection = redis.Redis.from_url(small_redis.url)
    now = [0.0]
    guard = CapacityGuard(connection, high_water=0.3, check_interval_s=1.0, clock=lambda: now[0])
    assert not guard.reading().full
    for part in range(4):
        connection.set(f"ballast:{part}", "x" * 2**19)
    assert not guard.reading().full  # the cached reading
    now[0] = 1.0
    assert guard.reading().full
    connection.close()


def test_a_full_store_is_logged_once_without_report_values(small_redis, caplog):
    app = make_app(small_redis.url, STORAGE_HIGH_WATER=0.01)
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert client.post(REPORTS, json=batch(2)).status_code == 507
    messages = [r.getMessage() for r in caplog.records if r.name == "aggregator.storage.capacity"]
    assert sum("report storage full" in m for m in messages) == 1
    assert sum("reports refused (storage_full)" in m for m in messages) == 1
    assert not any(label in m for m in messages for label in KRR_SPEC["domain"])


def test_the_report_budget_counts_reports_per_address(config, admin):
    # One shard: the whole budget is counted in one place (split over shards: test_report_path).
    client = create_app({**config, "REPORT_BUDGET": "5 per hour", "SHARDS": 1}).test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    ids = [new_id() for _ in range(3)]
    assert client.post(REPORTS, json=batch(3, ids)).get_json()["accepted"] == 3
    refused = client.post(REPORTS, json=batch(3))
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "report_budget_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 3600
    # Duplicates cost nothing; what is left of the budget can still be spent.
    retried = client.post(REPORTS, json=batch(3, ids)).get_json()
    assert (retried["accepted"], retried["duplicates"]) == (0, 3)
    assert client.post(REPORTS, json=batch(2)).get_json()["accepted"] == 2
    assert client.post(REPORTS, json=batch(1)).status_code == 429
    # Another address has a budget of its own.
    other = client.post(REPORTS, json=batch(5), environ_base={"REMOTE_ADDR": "198.51.100.9"})
    assert other.get_json()["accepted"] == 5
    assert client.get("/api/v1/campaigns/fruit").get_json() is not None
    body = client.get("/api/v1/campaigns/fruit/counts", headers=admin).get_json()
    assert body["n"] == 10
    refusals = client.get("/api/v1/health").get_json()["storage"]["refused"]
    assert refusals["report_budget_exceeded"] == {"submissions": 2, "reports": 4}


def test_a_campaign_quota_caps_its_reports(config, admin):
    client = create_app({**config, "CAMPAIGN_MAX_REPORTS": 5, "SHARDS": 1}).test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    ids = [new_id() for _ in range(3)]
    assert client.post(REPORTS, json=batch(3, ids)).get_json()["accepted"] == 3
    refused = client.post(REPORTS, json=batch(3))
    assert refused.status_code == 507
    assert refused.get_json()["error"]["code"] == "campaign_full"
    assert client.post(REPORTS, json=batch(2)).get_json()["accepted"] == 2
    # Full: a retry of stored reports is still acknowledged as duplicates, new ones refused.
    retried = client.post(REPORTS, json=batch(3, ids)).get_json()
    assert (retried["accepted"], retried["duplicates"]) == (0, 3)
    assert client.post(REPORTS, json=batch(1)).status_code == 507
    assert client.get("/api/v1/campaigns/fruit/counts", headers=admin).get_json()["n"] == 5


def test_redis_refusing_a_report_for_memory_is_507_not_503(small_redis):
    """A flood can overshoot the mark between two readings: Redis's own refusal is 507 too."""
    app = make_app(small_redis.url, STORAGE_CHECK_INTERVAL_S=3600)
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=ADMIN).status_code == 201
    assert client.post(REPORTS, json=batch(10)).status_code == 200  # reading cached: room
    connection = redis.Redis.from_url(small_redis.url)
    connection.config_set("maxmemory", connection.info("memory")["used_memory"] // 2)
    refused = client.post(REPORTS, json=batch(10))
    assert refused.status_code == 507, refused.get_json()
    assert refused.get_json()["error"]["code"] == "storage_full"
    assert "Retry-After" in refused.headers
    assert CampaignStore(connection).get_campaign("fruit").n_reports == 10
    connection.config_set("maxmemory", SMALL_LIMIT)
    # The refusal made the guard read again: with room, reports are taken.
    assert client.post(REPORTS, json=batch(10)).status_code == 200
    connection.close()

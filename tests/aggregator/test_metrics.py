"""``GET /metrics``: exact counts of reports, refusals and estimates; Redis nodes; the tokens
that open it, and what it shows without one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from aggregator_testdata import ADMIN_TOKEN, KRR_SPEC, create_campaign, new_id
from prometheus_client.parser import text_string_to_metric_families
from support.ports import free_port

from aggregator.app import create_app
from aggregator.http.metrics import (
    Metrics,
    RedisNodeCollector,
    ReplicationCollector,
    node_of_error,
)
from aggregator.settings import Settings, SettingsError
from aggregator.storage.cluster import node_name
from aggregator.storage.replication import MasterReplicas, ReplicationReading
from shared.errors import ValidationError

URL = "/api/v1/campaigns/fruit/reports"
DOC = Path(__file__).resolve().parents[2] / "docs" / "aggregator.md"
METRICS_TOKEN = "metrics-scraper-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WRONG = {"Authorization": "Bearer not-a-configured-token-0123456789abcdef"}
REPORT_COUNTS = {
    "ldp_reports_accepted_total",
    "ldp_reports_duplicate_total",
    "ldp_report_submissions_accepted_total",
}


def samples_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape's text: {(name, sorted labels): value}."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape(client, headers=ADMIN) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape with ``headers`` (the admin token's by default)."""
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples_of(response.get_data(as_text=True))


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_a_scrape_counts_accepted_reports_duplicates_refusals_and_estimates(
    client, analyst, admin, krr_campaign, redis_server
):
    batch = [{"report_id": new_id(), "value": label} for label in ("apple", "apple", "cherry")]
    assert client.post(URL, json={"reports": batch}).status_code == 200
    assert client.post(URL, json=batch[0]).get_json()["duplicates"] == 1
    assert client.post(URL, json={"report_id": new_id(), "value": "kiwi"}).status_code == 422
    assert client.post(URL, data="{", content_type="application/json").status_code == 400
    unknown = client.post("/api/v1/campaigns/no-such/reports", json=batch[0])
    assert unknown.status_code == 404
    estimate = "/api/v1/campaigns/fruit/estimate?method=inversion&confidence=0.9"
    assert client.get(estimate, headers=analyst).headers["X-Estimate-Cache"] == "miss"
    assert client.get(estimate, headers=analyst).headers["X-Estimate-Cache"] == "hit"
    client.patch("/api/v1/campaigns/fruit", json={"status": "closed"}, headers=admin)
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 409

    samples = scrape(client)
    assert value(samples, "ldp_reports_accepted_total", campaign="fruit") == 3
    assert value(samples, "ldp_reports_duplicate_total", campaign="fruit") == 1
    assert value(samples, "ldp_report_submissions_accepted_total", campaign="fruit") == 2
    refused = {
        labels: count
        for (name, labels), count in samples.items()
        if name == "ldp_report_submissions_refused_total"
    }
    assert refused == {
        (("campaign", "fruit"), ("reason", "invalid")): 2,
        (("campaign", "fruit"), ("reason", "campaign_closed")): 1,
        # an unknown campaign's id is not a label value
        (("campaign", ""), ("reason", "campaign_not_found")): 1,
    }
    estimate_labels = {"method": "inversion", "confidence": "0.9"}
    count = "ldp_estimate_duration_seconds_count"
    assert value(samples, count, **estimate_labels, outcome="computed") == 1
    assert value(samples, count, **estimate_labels, outcome="cached") == 1
    slowest = value(
        samples,
        "ldp_estimate_duration_seconds_bucket",
        **estimate_labels,
        le="30.0",
        outcome="cached",
    )
    assert slowest == 1
    node = str(Path(redis_server.url.removeprefix("unix://")))
    assert value(samples, "ldp_redis_up", node=node) == 1
    assert value(samples, "ldp_redis_memory_used_bytes", node=node) > 0
    assert value(samples, "ldp_redis_memory_max_bytes", node=node) is not None


@pytest.mark.parametrize(
    ("setting", "reports", "reason", "status"),
    [
        ({"RATELIMIT_REPORTS": "1 per minute"}, 1, "rate_limited", 429),
        ({"REPORT_BUDGET": "1 per hour"}, 1, "report_budget_exceeded", 429),
        ({"CAMPAIGN_MAX_REPORTS": 1}, 1, "campaign_full", 507),
        ({"STORAGE_HIGH_WATER": 1e-9, "STORAGE_CHECK_INTERVAL_S": 0}, 0, "storage_full", 507),
        ({"MAX_CONTENT_LENGTH": 10}, 0, "too_large", 413),
    ],
)
def test_each_limit_is_counted_under_its_own_reason(config, setting, reports, reason, status):
    """The first submission passes where the limit allows one report (``reports``); one shard,
    so that each limit is counted whole in it."""
    creator = create_app({**config, "SHARDS": 1}).test_client()
    create_campaign(creator, {"Authorization": f"Bearer {ADMIN_TOKEN}"}, KRR_SPEC)
    client = create_app({**config, **setting}).test_client()
    if reports:
        assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    refused = client.post(URL, json={"reports": [{"report_id": new_id(), "value": "apple"}] * 2})
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (status, reason)
    samples = scrape(client)
    assert value(samples, "ldp_report_submissions_refused_total", campaign="fruit", reason=reason)
    assert value(samples, "ldp_reports_accepted_total", campaign="fruit") == (reports or None)


def test_an_estimate_that_fails_is_timed_as_failed(config, analyst):
    client = create_app({**config, "ESTIMATE_MAX_WORK": 1}).test_client()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=headers).status_code == 201
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    answer = client.get("/api/v1/campaigns/fruit/estimate", headers=analyst)
    assert answer.get_json()["error"]["code"] == "estimate_too_costly"
    labels = {"method": "projection", "confidence": "0.95"}
    samples = scrape(client)
    assert value(samples, "ldp_estimate_duration_seconds_count", **labels, outcome="failed") == 1
    assert (
        value(samples, "ldp_estimate_duration_seconds_count", **labels, outcome="computed") is None
    )


def test_apps_in_one_process_count_apart(config, krr_campaign, client):
    other = create_app(config).test_client()
    assert client.post(URL, json={"report_id": new_id(), "value": "apple"}).status_code == 200
    assert value(scrape(client), "ldp_reports_accepted_total", campaign="fruit") == 1
    assert value(scrape(other), "ldp_reports_accepted_total", campaign="fruit") is None


def test_redis_errors_are_counted_per_node_and_the_node_shows_down(config):
    port = free_port()  # nothing listens there
    client = create_app({**config, "REDIS_URL": f"redis://127.0.0.1:{port}"}).test_client()
    answer = client.post(URL, json={"report_id": new_id(), "value": "apple"})
    assert (answer.status_code, answer.get_json()["error"]["code"]) == (503, "storage_unavailable")
    samples = scrape(client)
    node = f"127.0.0.1:{port}"
    assert value(samples, "ldp_redis_errors_total", node=node) == 1
    assert value(samples, "ldp_redis_up", node=node) == 0
    assert value(samples, "ldp_redis_memory_used_bytes", node=node) is None
    refused = value(
        samples, "ldp_report_submissions_refused_total", campaign="", reason="storage_unavailable"
    )
    assert refused == 1
    # Failed attempts cannot be counted without Redis: the token is still compared.
    assert client.get("/metrics", headers=WRONG).status_code == 401
    assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize(
    ("error", "node"),
    [
        (
            redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused."),
            "10.0.0.5:6379",
        ),
        (
            redis.ConnectionError("Error while reading from 10.0.0.7:7001 : (104, 'reset')"),
            "10.0.0.7:7001",
        ),
        (
            redis.ConnectionError("Error 2 connecting to /run/ldp/redis.sock. No such file."),
            "/run/ldp/redis.sock",
        ),
        (redis.TimeoutError("Timeout reading from db-1.internal:6380"), "db-1.internal:6380"),
        (redis.exceptions.MovedError("3999 10.0.0.6:7002"), "10.0.0.6:7002"),
        (redis.TimeoutError("Timeout connecting to server"), "unknown"),
        (
            redis.ResponseError("ERR Error running script (call to f_1): @user_script:1: x"),
            "unknown",
        ),
    ],
)
def test_the_node_an_error_names(error, node):
    assert node_of_error(error) == node


def test_a_unix_socket_node_is_named_by_its_path_and_a_tcp_one_by_host_and_port():
    assert node_name(redis.Redis.from_url("unix:///tmp/x/redis.sock")) == "/tmp/x/redis.sock"
    assert node_name(redis.Redis.from_url("redis://10.1.2.3:7000/0")) == "10.1.2.3:7000"


def test_the_node_collector_reports_the_high_water_mark_of_a_limited_node(redis_url):
    connection = redis.Redis.from_url(redis_url)
    limit = connection.config_get("maxmemory")["maxmemory"]
    try:
        connection.config_set("maxmemory", 64 * 2**20)
        families = {family.name: family for family in RedisNodeCollector(connection, 0.5).collect()}
    finally:
        connection.config_set("maxmemory", limit)
        connection.close()
    assert families["ldp_redis_memory_max_bytes"].samples[0].value == 64 * 2**20
    assert families["ldp_redis_memory_high_water_bytes"].samples[0].value == 32 * 2**20


def test_metrics_need_a_token_of_the_metrics_role(config, analyst):
    # They were open to anyone, with each campaign's accepted reports (the analyst's n) and
    # the Redis socket's path.
    client = create_app({**config, "METRICS_TOKEN": METRICS_TOKEN}).test_client()
    refused = client.get("/metrics")
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (401, "unauthorized")
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers=WRONG).status_code == 401
    assert client.get("/metrics", headers=analyst).status_code == 403
    scrape(client, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    scrape(client, headers=ADMIN)
    # The metrics token is no analyst's.
    counts = client.get(
        "/api/v1/campaigns/x/counts", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    assert counts.status_code == 403


def test_without_a_metrics_token_only_the_admin_token_opens_them(client):
    assert client.get("/metrics").status_code == 401
    scrape(client, headers=ADMIN)


def test_wrong_tokens_count_as_failed_attempts(config):
    """The admin token opens the metrics too: guessing at them is throttled like anywhere."""
    client = create_app({**config, "RATELIMIT_AUTH_FAILURES": "2 per minute"}).test_client()
    assert [client.get("/metrics", headers=WRONG).status_code for _ in range(2)] == [401, 401]
    assert client.get("/metrics", headers=ADMIN).status_code == 429


def test_the_open_view_lists_no_report_counts_no_campaign_and_no_redis_address(
    config, redis_server
):
    client = create_app({**config, "METRICS_PUBLIC": True}).test_client()
    create_campaign(client, ADMIN, KRR_SPEC)
    batch = [{"report_id": new_id(), "value": label} for label in ("apple", "apple", "cherry")]
    assert client.post(URL, json={"reports": batch}).status_code == 200
    assert client.post(URL, json=batch[0]).get_json()["duplicates"] == 1
    assert client.post(URL, json={"report_id": new_id(), "value": "kiwi"}).status_code == 422
    assert client.post("/api/v1/campaigns/no-such/reports", json=batch[0]).status_code == 404

    response = client.get("/metrics")  # no token
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    socket_path = redis_server.url.removeprefix("unix://")
    assert socket_path not in text and "redis.sock" not in text
    assert "fruit" not in text and "campaign=" not in text
    samples = samples_of(text)
    assert not {name for name, _ in samples} & REPORT_COUNTS
    refused = value(samples, "ldp_report_submissions_refused_total", reason="invalid")
    assert refused == 1
    assert value(samples, "ldp_report_submissions_refused_total", reason="campaign_not_found") == 1
    assert value(samples, "ldp_redis_up", node="0") == 1
    assert value(samples, "ldp_redis_memory_used_bytes", node="0") > 0
    # A token still gets everything; a wrong one gets no open view but 401.
    everything = scrape(client, headers=ADMIN)
    assert value(everything, "ldp_reports_accepted_total", campaign="fruit") == 3
    assert value(everything, "ldp_redis_up", node=socket_path) == 1
    assert client.get("/metrics", headers=WRONG).status_code == 401


def test_the_open_view_sums_over_campaigns_and_nodes():
    metrics = Metrics()
    for campaign in ("a", "b"):
        metrics.record_refusal(campaign, ValidationError("bad", field="value"))
    metrics.record_redis_error(redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379."))
    metrics.record_redis_error(redis.ConnectionError("Error 111 connecting to 10.0.0.6:6379."))
    samples = samples_of(metrics.exposition(None, 0.9, open_view=True).decode())
    assert value(samples, "ldp_report_submissions_refused_total", reason="invalid") == 2
    assert value(samples, "ldp_redis_errors_total") == 2
    assert not [name for name, _ in samples if name.endswith("_created")]


def test_a_weak_metrics_token_is_refused():
    with pytest.raises(SettingsError, match=r"^LDP_METRICS_TOKEN is shorter"):
        Settings.from_env({"LDP_METRICS_TOKEN": "short"})


def _metric_names() -> set[str]:
    """Every metric the aggregator exposes, as Prometheus names it."""
    names = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    connection = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}")
    names |= {family.name for family in RedisNodeCollector(connection, 0.9).collect()}
    reading = ReplicationReading(1, (MasterReplicas("n", 0, 16384, 1),), reports=0)
    names |= {family.name for family in ReplicationCollector(reading, {"n": "n"}).collect()}
    return names


def _doc_section() -> str:
    text = DOC.read_text("utf-8")
    return text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


def test_the_docs_list_every_metric_and_only_those():
    listed = set(re.findall(r"^\| `(ldp_\w+)`", _doc_section(), re.M))
    base = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in _metric_names()}
    assert listed == base


def test_the_example_alerts_parse_and_name_only_exposed_metrics():
    yaml = pytest.importorskip("yaml")
    blocks = [
        yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", _doc_section(), re.S)
    ]
    rules = next(block for block in blocks if "groups" in block)["groups"][0]["rules"]
    assert len(rules) >= 4
    exposed = _metric_names()
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(rule)
        used = set(re.findall(r"\bldp_\w+", rule["expr"]))
        assert used and used <= exposed, rule["alert"]

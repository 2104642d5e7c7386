"""Counts per period, estimates over windows, trends and comparisons (docs/aggregator.md).

The server's receipt time decides a report's period: these tests set the store's clock
(``CampaignStore.clock``) instead of waiting for days to pass.
"""

from __future__ import annotations

import datetime
import json
import math
import random

import numpy as np
import pytest
import redis
from aggregator_testdata import ADMIN_TOKEN, KRR_SPEC, new_id

from aggregator.cli import main
from aggregator.estimation import channel_for
from aggregator.http import trends
from aggregator.http.windows import WindowRead
from aggregator.services import EXTENSION
from aggregator.storage import layout as layouts
from aggregator.storage import migrate, periods
from aggregator.storage.ingest import StoredReport
from aggregator.storage.periods import Window
from aggregator.storage.retention import DAY_S
from aggregator.storage.store import Campaign, CampaignStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

BASE = "/api/v1/campaigns"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Monday 2 November 2026, 00:00 UTC (ISO week 2026-W45).
MONDAY = datetime.datetime(2026, 11, 2, tzinfo=datetime.UTC).timestamp()
DAILY = {**KRR_SPEC, "period": "day"}
WEEKLY = {**KRR_SPEC, "id": "weekly", "period": "week"}


class Clock:
    """The time the app's store stamps reports with (unix seconds); set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(app):
    """The app's store, on a clock the test sets (created before any request)."""
    now = Clock(MONDAY - DAY_S)
    with app.app_context():
        app.extensions[EXTENSION].get().clock = now
    return now


def send(client, campaign_id: str, values: list[str], at: float, clock: Clock) -> None:
    """Post ``values`` as new reports, received at ``at``."""
    clock.now = at
    for start in range(0, len(values), 1000):
        chunk = values[start : start + 1000]
        body = {"reports": [{"report_id": new_id(), "value": value} for value in chunk]}
        answer = client.post(f"{BASE}/{campaign_id}/reports", json=body)
        assert answer.status_code == 200, answer.get_json()
        assert answer.get_json()["accepted"] == len(chunk)


def counts_of(client, analyst, campaign_id: str, **window) -> dict:
    answer = client.get(f"{BASE}/{campaign_id}/counts", query_string=window, headers=analyst)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def by_label(body: dict) -> dict[str, int]:
    return {row["label"]: row["count"] for row in body["counts"]}


def test_a_windows_counts_are_the_reports_received_in_it(client, admin, analyst, clock):
    clock.now = MONDAY - DAY_S
    assert client.post(BASE, json=DAILY, headers=admin).status_code == 201
    # Monday up to its last second, Tuesday from its first, and Thursday.
    sent = {
        "2026-11-02": (["apple"] * 3 + ["banana"] * 2, MONDAY + DAY_S - 1),
        "2026-11-03": (["banana"] * 4 + ["cherry"], MONDAY + DAY_S),
        "2026-11-05": (["damson"] * 6, MONDAY + 3 * DAY_S + 3600),
    }
    for values, at in sent.values():
        send(client, "fruit", values, at, clock)
    clock.now = MONDAY + 6 * DAY_S
    for day, (values, _) in sent.items():
        body = counts_of(client, analyst, "fruit", since=day, until=day)
        assert body["window"] == {"since": day, "until": day, "period": "day"}
        assert body["n"] == len(values)
        assert by_label(body) == {label: values.count(label) for label in KRR_SPEC["domain"]}
        assert body["warnings"] == []
        # Its hours are the window's only.
        assert sum(hour["count"] for hour in body["hourly"]) == len(values)
    two_days = counts_of(client, analyst, "fruit", since="2026-11-02", until="2026-11-03")
    assert by_label(two_days) == {"apple": 3, "banana": 6, "cherry": 1, "damson": 0}
    assert counts_of(client, analyst, "fruit", since="2026-11-04", until="2026-11-04")["n"] == 0
    # Open ends: from the campaign's first period, up to the current one.
    assert counts_of(client, analyst, "fruit", until="2026-11-03")["n"] == 10
    assert counts_of(client, analyst, "fruit", since="2026-11-03")["n"] == 11
    # No window: all time, as before.
    everything = counts_of(client, analyst, "fruit")
    assert everything["n"] == 16 and "window" not in everything
    # The estimate's n is the window's, and so are its counts.
    estimate = client.get(
        f"{BASE}/fruit/estimate",
        query_string={"since": "2026-11-03", "until": "2026-11-05"},
        headers=analyst,
    ).get_json()
    assert estimate["n"] == 11
    assert estimate["window"] == {"since": "2026-11-03", "until": "2026-11-05", "period": "day"}


def test_weeks_are_iso_weeks_and_once_campaigns_are_counted_by_day(client, admin, analyst, clock):
    clock.now = MONDAY - DAY_S
    for spec in (WEEKLY, KRR_SPEC):
        assert client.post(BASE, json=spec, headers=admin).status_code == 201
    for campaign_id in ("weekly", "fruit"):
        # Sunday 8 November 23:59:59 is week 45; the Monday after, week 46.
        send(client, campaign_id, ["apple"] * 2, MONDAY + 7 * DAY_S - 1, clock)
        send(client, campaign_id, ["cherry"] * 3, MONDAY + 7 * DAY_S, clock)
    assert counts_of(client, analyst, "weekly", since="2026-W45", until="2026-W45")["n"] == 2
    assert counts_of(client, analyst, "weekly", since="2026-W46")["n"] == 3
    assert counts_of(client, analyst, "fruit", since="2026-11-08", until="2026-11-08")["n"] == 2
    assert counts_of(client, analyst, "fruit", since="2026-11-09")["n"] == 3


def test_a_period_turned_dense_keeps_its_counts(redis_url):
    """A shard's counts of a period become a dense string once many outputs have reports."""
    k = 64
    spec = CampaignSpec.from_dict(
        {
            "id": "wide",
            "title": "Wide",
            "mechanism": "krr",
            "epsilon": 1.0,
            "period": "day",
            "domain": [f"v{i}" for i in range(k)],
        }
    )
    store = CampaignStore(redis.Redis.from_url(redis_url), shards=2)
    store.create_campaign(spec, now=MONDAY)
    rng = np.random.default_rng(3)
    truth: dict[int, int] = {}
    for batch in range(6):
        outputs = rng.integers(0, 10 + 10 * batch, size=40)
        reports = [StoredReport(new_id(), int(y), f"v{y}") for y in outputs]
        for y in outputs.tolist():
            truth[y] = truth.get(y, 0) + 1
        store.ingest("wide", reports, now=MONDAY + 60 * batch)
    layout = store.layout("wide")
    key = periods.key_at(periods.DAY, MONDAY)
    kinds = {store.connection.type(layout.period_dense_key(s, key)) for s in range(2)}
    assert kinds == {b"string"}
    assert not any(store.connection.exists(layout.period_key(s, key)) for s in range(2))
    assert layouts.dense_from(k, 128) <= 64
    assert store.period_counts("wide", [key]) == [truth]
    assert store.window_counts("wide", [key]) == store.counts("wide") == truth


def test_counts_per_period_expire_with_retention_and_windows_say_so(config, admin, analyst):
    from aggregator.app import create_app

    app = create_app({**config, "PERIOD_RETENTION_DAYS": 10})
    client = app.test_client()
    clock = Clock(MONDAY - DAY_S)
    with app.app_context():
        store = app.extensions[EXTENSION].get()
        store.clock = clock
    assert store.period_retention_s == 10 * DAY_S
    assert client.post(BASE, json=DAILY, headers=admin).status_code == 201
    send(client, "fruit", ["apple"] * 4, MONDAY + 3600, clock)
    layout = store.layout("fruit")
    kept = [
        store.connection.ttl(name)
        for s in range(layout.shards)
        for name in (layout.period_key(s, "2026-11-02"), layout.period_dense_key(s, "2026-11-02"))
        if store.connection.exists(name)
    ]
    # Ten days after the period's end (Tuesday 00:00), from the receipt time.
    assert kept and all(abs(ttl - (11 * DAY_S - 3600)) <= 2 for ttl in kept)
    # Twenty days later the period is past its retention: the window says so, and reads none.
    clock.now = MONDAY + 20 * DAY_S
    body = counts_of(client, analyst, "fruit", since="2026-11-01", until="2026-11-20")
    assert body["n"] == 0
    assert any("LDP_PERIOD_RETENTION_DAYS" in warning for warning in body["warnings"])
    assert counts_of(client, analyst, "fruit")["n"] == 4  # all-time counts stay


def test_a_campaign_of_the_previous_layout_is_counted_per_period_from_its_migration(
    redis_url, runner
):
    connection = redis.Redis.from_url(redis_url)
    store = CampaignStore(connection, clock=Clock(MONDAY))
    spec = CampaignSpec.from_dict(DAILY)
    store.create_campaign(spec)
    reports = [StoredReport(new_id(), 0, "apple") for _ in range(5)]
    store.ingest("fruit", reports, now=MONDAY + 3600)
    # What the previous version left: layout 2, all-time counts only.
    layout = store.layout("fruit")
    connection.delete(*[name for name in connection.keys("ldp:{c:fruit:*}:period*")])
    connection.hset(layout.record_key, "layout", 2)
    connection.hdel(layout.record_key, "periods_from")
    old = CampaignStore(connection, clock=Clock(MONDAY + 2 * DAY_S + 7200))
    assert old.get_campaign("fruit").periods_from is None
    assert migrate.migrate_campaigns(old) == {}
    assert connection.hget(layout.record_key, "layout") == b"3"
    campaign = old.get_campaign("fruit")
    assert campaign.periods_from == MONDAY + 2 * DAY_S + 7200
    old.ingest("fruit", [StoredReport(new_id(), 1, "banana")], now=MONDAY + 2 * DAY_S + 9000)
    # Opening again changes nothing.
    assert migrate.mark_period_counts(old, now=MONDAY + 5 * DAY_S) == []
    assert old.get_campaign("fruit").periods_from == MONDAY + 2 * DAY_S + 7200
    # A window over the days before the migration has no counts for them, and says so.
    result = runner.invoke(
        main,
        ["--redis-url", redis_url, "counts", "fruit", "--since", "2026-11-02", "--json"],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["n"] == 1 and body["counts"][1]["count"] == 1
    assert any("counted per period since 2026-11-04 02:00 UTC" in w for w in body["warnings"])
    # All time still has every report.
    assert old.get_campaign("fruit").n_reports == 6


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ({"since": "2026-W45"}, "since", "ISO date YYYY-MM-DD"),
        ({"until": "2026-11-31"}, "until", "that exists"),
        ({"since": "02/11/2026"}, "since", "ISO date"),
        ({"since": "2026-11-05", "until": "2026-11-02"}, "until", "is before since"),
        ({"sinse": "2026-11-02"}, "sinse", "unknown parameter"),
    ],
)
def test_window_parameters_are_checked_naming_the_parameter(
    client, analyst, krr_campaign, query, field, words
):
    for path in ("estimate", "counts"):
        answer = client.get(f"{BASE}/fruit/{path}", query_string=query, headers=analyst)
        assert answer.status_code == 422, (path, answer.get_json())
        error = answer.get_json()["error"]
        assert error["code"] == "invalid_parameter" and error["field"] == field
        assert words in error["message"]


def test_a_weekly_campaign_takes_iso_weeks_only(client, admin, analyst):
    assert client.post(BASE, json=WEEKLY, headers=admin).status_code == 201
    for bad in ("2026-11-02", "2025-W53", "2026-W7"):
        answer = client.get(f"{BASE}/weekly/estimate?since={bad}", headers=analyst)
        assert answer.status_code == 422
        assert answer.get_json()["error"]["field"] == "since"
        assert "ISO week YYYY-Www" in answer.get_json()["error"]["message"]
    assert client.get(f"{BASE}/weekly/estimate?since=2026-W45", headers=analyst).status_code == 200


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("periods=0", "periods"),
        ("periods=367", "periods"),
        ("periods=3.0", "periods"),
        ("top=0", "top"),
        ("top=51", "top"),
        ("until=2026-13-01", "until"),
        ("since=2026-11-01", "since"),
    ],
)
def test_trend_parameters_are_checked(client, analyst, krr_campaign, query, field):
    answer = client.get(f"{BASE}/fruit/trend?{query}", headers=analyst)
    assert answer.status_code == 422
    assert answer.get_json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("a_since=2026-11-1", "a_since"),
        ("b_until=x", "b_until"),
        ("a_since=2026-11-05&a_until=2026-11-01", "a_until"),
        ("since=2026-11-01", "since"),
    ],
)
def test_comparison_parameters_are_checked(client, analyst, krr_campaign, query, field):
    answer = client.get(f"{BASE}/fruit/compare?{query}", headers=analyst)
    assert answer.status_code == 422
    assert answer.get_json()["error"]["field"] == field


def test_each_window_has_its_own_cached_estimate(client, admin, analyst, clock):
    clock.now = MONDAY - DAY_S
    assert client.post(BASE, json=DAILY, headers=admin).status_code == 201
    send(client, "fruit", ["apple"] * 30, MONDAY + 60, clock)
    send(client, "fruit", ["banana"] * 20, MONDAY + DAY_S + 60, clock)

    def estimate(**window):
        answer = client.get(f"{BASE}/fruit/estimate", query_string=window, headers=analyst)
        return answer.headers["X-Estimate-Cache"], answer.get_json()["n"]

    monday = {"since": "2026-11-02", "until": "2026-11-02"}
    tuesday = {"since": "2026-11-03", "until": "2026-11-03"}
    assert estimate(**monday) == ("miss", 30)
    assert estimate(**tuesday) == ("miss", 20)
    assert estimate() == ("miss", 50)
    assert estimate(**monday) == ("hit", 30)
    assert estimate(**tuesday) == ("hit", 20)
    # A report today changes neither past day's counts: found again by their digest.
    send(client, "fruit", ["cherry"], MONDAY + 2 * DAY_S, clock)
    assert estimate(**monday) == ("hit", 30)
    assert estimate() == ("miss", 51)


def test_the_trend_gives_each_periods_estimate_for_the_top_categories(
    client, admin, analyst, clock
):
    clock.now = MONDAY - DAY_S
    assert client.post(BASE, json=DAILY, headers=admin).status_code == 201
    per_day = [40, 0, 60, 50]
    for day, n in enumerate(per_day):
        if n:
            send(client, "fruit", ["apple"] * n, MONDAY + day * DAY_S + 60, clock)
    clock.now = MONDAY + 3 * DAY_S + 120
    answer = client.get(f"{BASE}/fruit/trend?periods=5&top=2", headers=analyst)
    assert answer.status_code == 200, answer.get_json()
    body = answer.get_json()
    assert body["window"] == {"since": "2026-11-01", "until": "2026-11-05", "period": "day"}
    assert [p["period"] for p in body["periods"]] == [
        "2026-11-01",
        "2026-11-02",
        "2026-11-03",
        "2026-11-04",
        "2026-11-05",
    ]
    assert [p["n"] for p in body["periods"]] == [0, 40, 0, 60, 50]
    assert body["n"] == 150
    assert body["series"][0]["label"] == "apple"
    assert len(body["series"]) == 2
    apple = body["series"][0]
    assert apple["frequency"][0] is None and apple["frequency"][2] is None
    for i in (1, 3, 4):
        assert apple["ci_low"][i] <= apple["frequency"][i] <= apple["ci_high"][i]
    # Each period's estimate is that of the period as a window (without the poisoning check).
    single = client.get(
        f"{BASE}/fruit/estimate?since=2026-11-04&until=2026-11-04", headers=analyst
    ).get_json()
    row = next(r for r in single["estimates"] if r["label"] == "apple")
    assert apple["frequency"][3] == row["frequency"]
    assert (apple["ci_low"][3], apple["ci_high"][3]) == (row["ci_low"], row["ci_high"])
    # Until a given period, and asked again: the same numbers.
    earlier = client.get(f"{BASE}/fruit/trend?periods=2&until=2026-11-04", headers=analyst)
    assert [p["n"] for p in earlier.get_json()["periods"]] == [0, 60]
    assert client.get(f"{BASE}/fruit/trend?periods=5&top=2", headers=analyst).get_json() == body


def test_the_comparison_marks_a_change_and_defaults_to_the_previous_period(
    client, admin, analyst, clock
):
    clock.now = MONDAY - DAY_S
    assert client.post(BASE, json=DAILY, headers=admin).status_code == 201
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(DAILY))
    rng = random.Random(7)
    # Monday: mostly apples; Tuesday: mostly damsons (through the mechanism's noise).
    for day, favourite in ((0, "apple"), (1, "damson")):
        values = [mechanism.perturb(favourite, rng) for _ in range(1500)]
        send(client, "fruit", values, MONDAY + day * DAY_S + 60, clock)
    clock.now = MONDAY + DAY_S + 120
    answer = client.get(f"{BASE}/fruit/compare", headers=analyst)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["X-Estimate-Cache"] == "miss"
    body = answer.get_json()
    assert body["a"] == {
        "window": {"since": "2026-11-02", "until": "2026-11-02", "period": "day"},
        "n": 1500,
    }
    assert body["b"]["window"]["since"] == "2026-11-03" and body["b"]["n"] == 1500
    rows = {row["label"]: row for row in body["differences"]}
    assert rows["apple"]["difference"] < 0 and rows["apple"]["excludes_zero"]
    assert rows["damson"]["difference"] > 0 and rows["damson"]["excludes_zero"]
    for row in rows.values():
        assert row["difference"] == pytest.approx(row["b"] - row["a"])
        assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    assert body["excluding_zero"] == sum(row["excludes_zero"] for row in rows.values())
    again = client.get(
        f"{BASE}/fruit/compare?a_since=2026-11-02&a_until=2026-11-02&b_since=2026-11-03",
        headers=analyst,
    )
    assert again.headers["X-Estimate-Cache"] == "hit"
    # Overlapping windows are compared, with a word on what that does to the intervals.
    overlapping = client.get(
        f"{BASE}/fruit/compare?a_since=2026-11-02&b_since=2026-11-02", headers=analyst
    ).get_json()
    assert any("overlap" in warning for warning in overlapping["warnings"])


# The comparison's coverage: 200 pairs of independent windows of a k-RR campaign (k = 5,
# epsilon 1, 2,000 reports each, five shares changing by 0 to 6 points), 1,000 intervals at
# 0.95. Their coverage must lie in the binomial band 0.95 +- 3.29 sd (a 99.9% band for 1,000
# independent intervals: 0.927 to 0.973); the categories of one pair are not independent, and
# the seed makes the run fixed.
COVERAGE_PAIRS = 200
COVERAGE_LEVEL = 0.95


def test_the_comparisons_interval_covers_the_true_difference_at_its_nominal_rate():
    spec = CampaignSpec.from_dict(
        {
            "id": "sim",
            "title": "Sim",
            "mechanism": "krr",
            "epsilon": 1.0,
            "domain": ["a", "b", "c", "d", "e"],
        }
    )
    mechanism = Mechanism.from_spec(spec)
    campaign = Campaign(spec, "open", 0.0, 0, mechanism)
    channel = channel_for(mechanism)
    shares = (np.array([0.4, 0.25, 0.15, 0.12, 0.08]), np.array([0.34, 0.25, 0.2, 0.1, 0.11]))
    truth = shares[1] - shares[0]
    windows = (
        WindowRead(Window("day", "2026-11-02", "2026-11-02"), None),
        WindowRead(Window("day", "2026-11-03", "2026-11-03"), None),
    )
    rng = np.random.default_rng(2026)
    covered = total = 0
    for _ in range(COVERAGE_PAIRS):
        counts = []
        for p in shares:
            q = channel.forward(p)
            drawn = rng.multinomial(2000, q / q.sum())
            counts.append({y: int(c) for y, c in enumerate(drawn)})
        body = trends.comparison_body(
            campaign,
            (counts[0], counts[1]),
            "projection",
            COVERAGE_LEVEL,
            windows,
            channel=channel,
        )
        for row, true in zip(body["differences"], truth, strict=True):
            covered += row["ci_low"] <= true <= row["ci_high"]
            total += 1
    assert total == 1000
    half = 3.29 * math.sqrt(COVERAGE_LEVEL * (1 - COVERAGE_LEVEL) / total)
    assert COVERAGE_LEVEL - half <= covered / total <= COVERAGE_LEVEL + half, covered / total


def test_the_cli_takes_a_window(runner, redis_url):
    store = CampaignStore(redis.Redis.from_url(redis_url), clock=Clock(MONDAY))
    store.create_campaign(CampaignSpec.from_dict(DAILY))
    store.ingest("fruit", [StoredReport(new_id(), 0, "apple") for _ in range(7)], now=MONDAY)
    store.ingest(
        "fruit", [StoredReport(new_id(), 2, "cherry") for _ in range(3)], now=MONDAY + DAY_S
    )

    def run(*args):
        return runner.invoke(main, ["--redis-url", redis_url, *args])

    shown = run("estimate", "fruit", "--since", "2026-11-03", "--until", "2026-11-03")
    assert shown.exit_code == 0, shown.output
    assert "window 2026-11-03  method projection  n 3" in shown.stdout
    counts = run("counts", "fruit", "--until", "2026-11-02")
    assert counts.exit_code == 0, counts.output
    assert "window 2026-11-02  n 7" in counts.stdout
    exported = run(
        "export", "fruit", "--data", "counts", "--format", "csv", "--since", "2026-11-03"
    )
    assert exported.exit_code == 0, exported.output
    assert "cherry,3" in exported.stdout and "apple,0" in exported.stdout
    bad = run("estimate", "fruit", "--since", "2026-W45")
    assert bad.exit_code == 1
    assert "Error: --since must be an ISO date YYYY-MM-DD" in bad.stderr

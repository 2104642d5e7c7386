"""Campaigns stored by the previous version (layout 1) move to the sharded layout, losing nothing.

The old data is written by the previous version's own scripts (``layout1/*.lua``,
copied unchanged), with its key scheme: one hash tag per campaign and a key per
report id.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.app import create_app
from aggregator.storage import migrate
from aggregator.storage.errors import LayoutOutdated
from aggregator.storage.ingest import StoredReport, token_digest
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec

OLD_SCRIPTS = Path(__file__).parent / "layout1"
TTL_S = 90 * 24 * 3600


class Layout1:
    """What the previous version did to Redis for a campaign: create and ingest."""

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection
        self.create_script = connection.register_script((OLD_SCRIPTS / "create.lua").read_text())
        self.ingest_script = connection.register_script((OLD_SCRIPTS / "ingest.lua").read_text())

    def create(self, spec: CampaignSpec, created_at: float) -> None:
        key = f"ldp:{{c:{spec.id}}}:campaign"
        self.create_script(keys=[key], args=[spec.canonical_json(), spec.spec_hash, created_at])
        self.connection.zadd("ldp:campaigns", {spec.id: created_at}, nx=True)

    def ingest(self, spec: CampaignSpec, reports: list[StoredReport], now: float) -> None:
        tag = f"ldp:{{c:{spec.id}}}"
        keys = [
            f"{tag}:campaign",
            f"{tag}:counts",
            f"{tag}:hourly",
            f"{tag}:reports",
            f"{tag}:enrollment",
            f"{tag}:ratelimit::0",
            f"{tag}:ratelimit-reports::0",
        ]
        prefix = f"{tag}:seen:"
        enrollment = spec.enrollment_required
        args: list = [TTL_S, int(now // 3600 * 3600), int(enrollment), 0, spec.spec_hash]
        args += [0, 0, 0, 0, 0, len(prefix.encode())]
        values = {r.output: json.dumps(r.value, separators=(",", ":")) for r in reports}
        args.append(len(values))
        for output, value in values.items():
            args += [output, value]
        for report in reports:
            keys.append(prefix + report.report_id)
            args.append(report.output)
            if enrollment:
                args.append(token_digest(report.enrollment_token))
        status = self.ingest_script(keys=keys, args=args)[0]
        assert status == 0

    def add_tokens(self, spec: CampaignSpec, tokens: list[str]) -> None:
        key = f"ldp:{{c:{spec.id}}}:enrollment"
        self.connection.sadd(key, *(token_digest(t) for t in tokens))


def krr_reports(spec: CampaignSpec, outputs: list[int], tokens=None) -> list[StoredReport]:
    tokens = tokens or [None] * len(outputs)
    return [
        StoredReport(new_id(), y, spec.domain[y], token)
        for y, token in zip(outputs, tokens, strict=True)
    ]


@pytest.fixture
def old(redis_url):
    connection = redis.Redis.from_url(redis_url)
    yield Layout1(connection)
    connection.close()


def test_an_old_campaign_keeps_its_counts_reports_and_deduplication(old, redis_url):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    now = time.time()
    old.create(spec, now - 3 * 86400)
    first = krr_reports(spec, [i % 4 for i in range(250)])
    later = krr_reports(spec, [0, 0, 1])
    old.ingest(spec, first, now - 2 * 86400)
    old.ingest(spec, later, now - 3600)
    connection = old.connection
    hourly_before = {int(h): int(c) for h, c in connection.hgetall("ldp:{c:fruit}:hourly").items()}
    stream_before = connection.xrange("ldp:{c:fruit}:reports")

    store = CampaignStore(connection)
    assert migrate.unmigrated(store) == ["fruit"]
    assert migrate.migrate_campaigns(store) == {"fruit": 253}
    assert migrate.unmigrated(store) == []

    campaign = store.get_campaign("fruit")
    assert campaign.n_reports == 253 and campaign.spec == spec and campaign.status == "open"
    # Counted per period from its migration on; its earlier reports are in its all-time counts.
    assert campaign.periods_from == pytest.approx(time.time(), abs=60)
    assert store.counts("fruit") == {0: 65, 1: 64, 2: 62, 3: 62}
    assert dict(store.hourly_counts("fruit")) == hourly_before
    exported = list(store.iter_reports("fruit"))
    assert [r["report_id"] for r in exported] == [
        f[b"report_id"].decode() for _, f in stream_before
    ]
    assert store.last_report_times(["fruit"])["fruit"] == pytest.approx(
        int(stream_before[-1][0].split(b"-")[0]) / 1000
    )
    # No key of the old layout is left but the record.
    assert sorted(connection.keys("ldp:{c:fruit}:*")) == [b"ldp:{c:fruit}:campaign"]
    # Old report ids are still duplicates; new ones are counted.
    retried = store.ingest("fruit", first[:40] + later + krr_reports(spec, [3]))
    assert (retried.accepted, retried.duplicates) == (1, 43)
    assert store.get_campaign("fruit").n_reports == 254
    # Nothing to do a second time.
    assert migrate.migrate_campaigns(store) == {}
    assert store.get_campaign("fruit").n_reports == 254


def test_an_interrupted_migration_run_again_counts_nothing_twice(old, monkeypatch):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    old.create(spec, time.time() - 60)
    sent = krr_reports(spec, [i % 4 for i in range(120)])
    old.ingest(spec, sent, time.time() - 30)
    store = CampaignStore(old.connection)

    def crash(*args, **kwargs):
        raise RuntimeError("power cut")

    original = migrate._finish
    monkeypatch.setattr(migrate, "_finish", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        migrate.migrate_campaigns(store)
    # Meanwhile the campaign refuses reports rather than store them where nobody looks.
    app_store = CampaignStore(old.connection)
    with pytest.raises(LayoutOutdated):
        app_store.ingest("fruit", krr_reports(spec, [1]))
    monkeypatch.setattr(migrate, "_finish", original)
    assert migrate.migrate_campaigns(store) == {"fruit": 0}  # ids were moved the first time
    assert store.counts("fruit") == {0: 30, 1: 30, 2: 30, 3: 30}
    assert store.get_campaign("fruit").n_reports == 120
    again = store.ingest("fruit", sent)
    assert (again.accepted, again.duplicates) == (0, 120)


def test_an_old_enrollment_campaign_keeps_its_tokens_and_its_retries(old):
    spec = CampaignSpec.from_dict({**KRR_SPEC, "id": "enrolled", "enrollment_required": True})
    old.create(spec, time.time() - 60)
    tokens = [f"token-{i}-" + "x" * 30 for i in range(10)]
    old.add_tokens(spec, tokens)
    sent = krr_reports(spec, [0, 1, 2, 3], tokens[:4])
    old.ingest(spec, sent, time.time() - 30)
    store = CampaignStore(old.connection)
    migrate.migrate_campaigns(store)
    assert store.unused_enrollment_tokens("enrolled") == 6
    # A retry of an old report (its token spent by itself) is a duplicate, not refused.
    retried = store.ingest("enrolled", sent, enrollment_required=True)
    assert (retried.accepted, retried.duplicates) == (0, 4)
    fresh = krr_reports(spec, [2], tokens[4:5])
    assert store.ingest("enrolled", fresh, enrollment_required=True).accepted == 1
    assert store.unused_enrollment_tokens("enrolled") == 5


def test_the_app_migrates_when_it_opens_the_store(old, redis_url, config, admin):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    old.create(spec, time.time() - 60)
    old.ingest(spec, krr_reports(spec, [0, 1, 1]), time.time() - 30)
    client = create_app(config).test_client()
    body = client.get("/api/v1/campaigns/fruit/counts", headers=admin).get_json()
    assert body["n"] == 3

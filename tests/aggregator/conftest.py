"""Fixtures: one real embedded Redis per session (flushed per test), the app, a CLI runner."""

from __future__ import annotations

import pytest
import redis
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC, PLANAR_SPEC, create_campaign
from click.testing import CliRunner

from aggregator.app import create_app
from aggregator.storage.redis_server import EmbeddedRedis
from aggregator.storage.store import CampaignStore


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def connection(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_url):
    connection = redis.Redis.from_url(redis_url)
    # Most tests look at the raw reports too; the default (counts only) has tests of its own.
    yield CampaignStore(connection, raw_reports="keep")
    connection.close()


@pytest.fixture
def config(redis_url):
    return {
        "REDIS_URL": redis_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "ANALYST_TOKEN": ANALYST_TOKEN,
        "RATELIMIT_REPORTS": "10000 per minute",
        "REPORT_BUDGET": "10000000 per hour",
        "RAW_REPORTS": "keep",
    }


@pytest.fixture
def app(config):
    return create_app(config)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def admin():
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def analyst():
    return {"Authorization": f"Bearer {ANALYST_TOKEN}"}


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def krr_campaign(client, admin):
    return create_campaign(client, admin, KRR_SPEC)


@pytest.fixture
def planar_campaign(client, admin):
    return create_campaign(client, admin, PLANAR_SPEC)

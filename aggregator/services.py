"""What an app keeps in ``app.extensions``: its settings and its store handle.

Reached through :func:`current_settings`, :func:`get_store`, :func:`get_capacity`,
:func:`get_replication`, :func:`get_channels` and :func:`get_redis_client`.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import flask
import redis

from aggregator.http.estimates import ChannelCache
from aggregator.storage.capacity import CapacityGuard
from aggregator.storage.cluster import Connection, open_connection
from aggregator.storage.estimate_cache import EstimateCache
from aggregator.storage.migrate import migrate_campaigns
from aggregator.storage.redis_server import EmbeddedRedis, connect_url
from aggregator.storage.replication import ReplicaWatch, UnderReplicatedReports
from aggregator.storage.store import CampaignStore

if TYPE_CHECKING:
    from aggregator.settings import Settings

EXTENSION = "ldp"
SETTINGS_EXTENSION = "ldp_settings"


class OpenedStore(NamedTuple):
    """A store, its connection, and the guard over its memory."""

    store: CampaignStore
    connection: Connection
    capacity: CapacityGuard


def open_store(
    url: str,
    settings: Settings,
    *,
    on_under_replicated: Callable[[str, int], None] | None = None,
) -> OpenedStore:
    """The store at ``url`` (one Redis or a cluster) as ``settings`` say, its connection,
    and the guard over its memory.

    Campaigns stored by an earlier version are moved to the current layout first
    (:func:`aggregator.storage.migrate.migrate_campaigns`). New reports a master
    acknowledges with fewer replicas than asked for are counted in Redis
    (:class:`~aggregator.storage.replication.UnderReplicatedReports`) and passed on to
    ``on_under_replicated(node, reports)``. The guard refuses reports above
    ``STORAGE_HIGH_WATER``; the store's estimate cache takes the budget the settings give
    it and its mark from the same reading, read once a second at most.
    """
    connection = open_connection(url, health_check_interval=30)
    counted = UnderReplicatedReports(connection, on_count=on_under_replicated)
    capacity = CapacityGuard(
        connection,
        high_water=settings.storage_high_water,
        check_interval_s=settings.storage_check_interval_s,
    )
    store = CampaignStore(
        connection,
        report_id_ttl_s=settings.report_id_ttl_s,
        retention_s=settings.retention_s,
        period_retention_s=settings.period_retention_s,
        raw_reports=settings.raw_reports,
        shards=settings.shards,
        max_reports=settings.campaign_max_reports,
        ack_replicas=settings.ack_replicas,
        ack_timeout_ms=settings.ack_timeout_ms,
        on_under_replicated=counted.record,
        estimates=EstimateCache(connection, budget=settings.cache_budget, memory=capacity.reading),
    )
    migrate_campaigns(store)
    return OpenedStore(store, connection, capacity)


class StoreHandle:
    """Opens the store on first use, once per process, and closes what it opened.

    ``on_under_replicated(node, reports)`` hears of the new reports the store's masters
    acknowledge with fewer replicas than asked for (the app's metrics count them).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        on_under_replicated: Callable[[str, int], None] | None = None,
    ) -> None:
        self._settings = settings
        self._on_under_replicated = on_under_replicated
        self._lock = threading.Lock()
        self._store: CampaignStore | None = None
        self._capacity: CapacityGuard | None = None
        self._replication: ReplicaWatch | None = None
        self._client: Connection | None = None
        self._url: str | None = None
        self.embedded: EmbeddedRedis | None = None
        self.channels = ChannelCache()

    def get(self) -> CampaignStore:
        with self._lock:
            if self._store is None:
                settings = self._settings
                url, self.embedded = connect_url(
                    settings.redis_url,
                    settings.data_dir,
                    settings.redis_fsync,
                    maxmemory=settings.redis_maxmemory,
                )
                if self.embedded is not None:
                    atexit.register(self.embedded.stop)
                self._url = url
                self._store, self._client, self._capacity = open_store(
                    url, settings, on_under_replicated=self._on_under_replicated
                )
                self._replication = ReplicaWatch(self._store)
            return self._store

    def capacity(self) -> CapacityGuard:
        """The guard over the store's memory (opens the store if needed)."""
        self.get()
        assert self._capacity is not None
        return self._capacity

    def replication(self) -> ReplicaWatch:
        """What the store's masters have of replicas (opens the store if needed)."""
        self.get()
        assert self._replication is not None
        return self._replication

    def client(self) -> Connection:
        """The Redis client the store uses (opens the store if needed), for the metrics' scrape.

        If the store cannot be opened because its server does not answer, a client of
        that server's URL, so that the scrape can show it down.
        """
        try:
            self.get()
        except redis.RedisError:
            if self._url is None:
                raise
            return redis.Redis.from_url(self._url)
        assert self._client is not None
        return self._client


def current_settings() -> Settings:
    """The current app's settings (read and checked once by the app factory)."""
    return flask.current_app.extensions[SETTINGS_EXTENSION]


def get_store() -> CampaignStore:
    """The current app's store (opened on first call)."""
    return flask.current_app.extensions[EXTENSION].get()


def get_capacity() -> CapacityGuard:
    """The current app's guard over the store's memory."""
    return flask.current_app.extensions[EXTENSION].capacity()


def get_replication() -> ReplicaWatch:
    """The current app's watch over the replicas of the store's masters."""
    return flask.current_app.extensions[EXTENSION].replication()


def get_channels() -> ChannelCache:
    """The current app's per-process cache of channel operators."""
    return flask.current_app.extensions[EXTENSION].channels


def get_redis_client() -> Connection:
    """The current app's Redis client, for reading each node's state (``/metrics``)."""
    return flask.current_app.extensions[EXTENSION].client()

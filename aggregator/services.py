"""What an app keeps in ``app.extensions``: its settings and its store handle.

Reached through :func:`current_settings`, :func:`get_store`, :func:`get_capacity`
and :func:`get_channels`.
"""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING

import flask

from aggregator.http.estimates import ChannelCache
from aggregator.storage.capacity import CapacityGuard
from aggregator.storage.cluster import Connection, default_ack_replicas, open_connection
from aggregator.storage.migrate import migrate_campaigns
from aggregator.storage.redis_server import EmbeddedRedis, connect_url
from aggregator.storage.store import CampaignStore

if TYPE_CHECKING:
    from aggregator.settings import Settings

EXTENSION = "ldp"
SETTINGS_EXTENSION = "ldp_settings"


def open_store(url: str, settings: Settings) -> tuple[CampaignStore, Connection]:
    """The store at ``url`` (one Redis or a cluster) as ``settings`` say, and its connection.

    Campaigns stored by an earlier version are moved to the current layout first
    (:func:`aggregator.storage.migrate.migrate_campaigns`).
    """
    connection = open_connection(url, health_check_interval=30)
    ack_replicas = settings.ack_replicas
    if ack_replicas is None:
        ack_replicas = default_ack_replicas(connection)
    store = CampaignStore(
        connection,
        report_id_ttl_s=settings.report_id_ttl_s,
        retention_s=settings.retention_s,
        raw_reports=settings.raw_reports,
        shards=settings.shards,
        max_reports=settings.campaign_max_reports,
        ack_replicas=ack_replicas,
        ack_timeout_ms=settings.ack_timeout_ms,
    )
    migrate_campaigns(store)
    return store, connection


class StoreHandle:
    """Opens the store on first use, once per process, and closes what it opened."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._store: CampaignStore | None = None
        self._capacity: CapacityGuard | None = None
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
                self._store, connection = open_store(url, settings)
                self._capacity = CapacityGuard(
                    connection,
                    high_water=settings.storage_high_water,
                    check_interval_s=settings.storage_check_interval_s,
                )
            return self._store

    def capacity(self) -> CapacityGuard:
        """The guard over the store's memory (opens the store if needed)."""
        self.get()
        assert self._capacity is not None
        return self._capacity


def current_settings() -> Settings:
    """The current app's settings (read and checked once by the app factory)."""
    return flask.current_app.extensions[SETTINGS_EXTENSION]


def get_store() -> CampaignStore:
    """The current app's store (opened on first call)."""
    return flask.current_app.extensions[EXTENSION].get()


def get_capacity() -> CapacityGuard:
    """The current app's guard over the store's memory."""
    return flask.current_app.extensions[EXTENSION].capacity()


def get_channels() -> ChannelCache:
    """The current app's per-process cache of channel operators."""
    return flask.current_app.extensions[EXTENSION].channels

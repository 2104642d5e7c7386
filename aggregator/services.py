"""The store handle kept in ``app.extensions``, reached through :func:`get_store`."""

from __future__ import annotations

import atexit
import threading

import flask
import redis

from aggregator.http.estimates import ChannelCache
from aggregator.storage.capacity import CapacityGuard
from aggregator.storage.redis_server import EmbeddedRedis, connect_url
from aggregator.storage.retention import retention_seconds
from aggregator.storage.store import CampaignStore

EXTENSION = "ldp"


class StoreHandle:
    """Opens the store on first use, once per process, and closes what it opened."""

    def __init__(self, config: flask.Config) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._store: CampaignStore | None = None
        self._capacity: CapacityGuard | None = None
        self.embedded: EmbeddedRedis | None = None
        self.channels = ChannelCache()

    def get(self) -> CampaignStore:
        with self._lock:
            if self._store is None:
                url, self.embedded = connect_url(
                    self._config["REDIS_URL"],
                    self._config["DATA_DIR"],
                    self._config["REDIS_FSYNC"],
                    maxmemory=self._config["REDIS_MAXMEMORY"],
                )
                if self.embedded is not None:
                    atexit.register(self.embedded.stop)
                connection = redis.Redis.from_url(url, health_check_interval=30)
                self._store = CampaignStore(
                    connection,
                    report_id_ttl_s=self._config["REPORT_ID_TTL_S"],
                    retention_s=retention_seconds(self._config.get("RETENTION_DAYS")),
                )
                self._capacity = CapacityGuard(
                    connection,
                    high_water=float(self._config["STORAGE_HIGH_WATER"]),
                    check_interval_s=float(self._config["STORAGE_CHECK_INTERVAL_S"]),
                )
            return self._store

    def capacity(self) -> CapacityGuard:
        """The guard over the store's memory (opens the store if needed)."""
        self.get()
        assert self._capacity is not None
        return self._capacity


def get_store() -> CampaignStore:
    """The current app's store (opened on first call)."""
    return flask.current_app.extensions[EXTENSION].get()


def get_capacity() -> CapacityGuard:
    """The current app's guard over the store's memory."""
    return flask.current_app.extensions[EXTENSION].capacity()


def get_channels() -> ChannelCache:
    """The current app's per-process cache of channel operators."""
    return flask.current_app.extensions[EXTENSION].channels

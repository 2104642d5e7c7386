"""The replicas of the store's masters, and the reports acknowledged on fewer copies.

With ``LDP_ACK_REPLICAS`` unset, a write to a Redis Cluster waits for one replica, or for
as many as its master has while it has fewer (:class:`~aggregator.storage.cluster.NodeWriter`
with ``only_present``): a replica promoted by a failover acknowledges reports held by it
alone until a replica joins it. What is counted and read here lets ``/health``,
``/metrics`` and the dashboard say so while it lasts.

* :class:`UnderReplicatedReports` counts those reports in Redis, in the hash
  :data:`~aggregator.storage.keys.METRICS` that every process adds to, best effort: a count
  that cannot be written is logged, and the reports stay acknowledged.
* :class:`ReplicaWatch` reads ``INFO replication`` of every master at most once every
  :data:`~aggregator.storage.cluster.REPLICA_CHECK_S` per process, and for a master with
  fewer replicas than writes wait for, the campaigns' shards it holds. A master that does
  not answer is left out (and the cluster's map read again), not an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from aggregator.storage import keys
from aggregator.storage.cluster import REPLICA_CHECK_S, Connection, node_clients, refresh_map
from aggregator.storage.store import CampaignStore
from shared.errors import LDPError

logger = logging.getLogger(__name__)


class UnderReplicatedReports:
    """Counts, for every process, the new reports masters acknowledged on fewer replicas.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's connection.
    on_count : callable, optional
        Also called as ``on_count(node, reports)`` (this process's own count, for Prometheus).
    """

    FIELD = "under_replicated_reports"

    def __init__(
        self, connection: Connection, *, on_count: Callable[[str, int], None] | None = None
    ) -> None:
        self.connection = connection
        self.on_count = on_count

    def record(self, node: str, reports: int) -> None:
        """Count ``reports`` acknowledged by ``node`` on fewer replicas; never raises for Redis."""
        try:
            self.connection.hincrby(keys.METRICS, self.FIELD, reports)
        except redis.RedisError as exc:  # the reports are stored: a count must not fail them
            logger.warning(
                "%d reports acknowledged by %s on fewer replicas not counted: %s",
                reports,
                node,
                exc,
            )
        if self.on_count is not None:
            self.on_count(node, reports)

    def total(self) -> int:
        """The reports counted by every process since the store was created."""
        return int(cast(bytes | None, self.connection.hget(keys.METRICS, self.FIELD)) or 0)


@dataclass(frozen=True)
class MasterReplicas:
    """A master as read: its replicas now, the cluster slots it serves (a single server holds
    all 16,384) and the campaigns' shards in them (counted for a master with fewer replicas
    than wanted only; None otherwise, or when the campaigns could not be read)."""

    node: str
    replicas: int
    slots: int
    shards: int | None


@dataclass(frozen=True)
class ReplicationReading:
    """The replicas writes wait for, every master that answered, and the reports counted by
    :class:`UnderReplicatedReports` (None if they could not be read)."""

    wanted: int
    masters: tuple[MasterReplicas, ...]
    reports: int | None

    @property
    def under_replicated(self) -> tuple[MasterReplicas, ...]:
        """The masters with fewer replicas than writes wait for."""
        return tuple(master for master in self.masters if master.replicas < self.wanted)

    @property
    def under_replicated_slots(self) -> int:
        """Cluster slots the under-replicated masters serve."""
        return sum(master.slots for master in self.under_replicated)

    @property
    def under_replicated_shards(self) -> int | None:
        """Campaign shards the under-replicated masters hold (None where the campaigns
        could not be read)."""
        shards = [master.shards for master in self.under_replicated]
        return None if None in shards else sum(count or 0 for count in shards)


class ReplicaWatch:
    """Reads the replicas of a store's masters, at most once every ``check_interval_s``.

    Parameters
    ----------
    store : CampaignStore
        The store: its connection, the replicas its writer waits for, its campaigns.
    check_interval_s : float
        How long a reading is reused (0: read on every call).
    clock : callable
        Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        store: CampaignStore,
        *,
        check_interval_s: float = REPLICA_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._counted = UnderReplicatedReports(store.connection)
        self._reading: ReplicationReading | None = None
        self._read_at = float("-inf")

    def reading(self) -> ReplicationReading:
        """The masters' replicas, at most ``check_interval_s`` old."""
        now = self._clock()
        if self._reading is None or now - self._read_at >= self.check_interval_s:
            self._reading = self._read()
            self._read_at = now
        return self._reading

    def _read(self) -> ReplicationReading:
        wanted = self.store.writer.ack_replicas
        connection = self.store.connection
        replicas, stale = _replicas_per_master(connection)
        if stale:  # the map is out of date (a failover): read it again, then the masters
            refresh_map(connection)
            replicas, _ = _replicas_per_master(connection)
        slots = _slots_per_master(connection)
        short = {name for name, count in replicas.items() if count < wanted}
        shards = self._shards_on(short) if short else {}
        try:
            reports: int | None = self._counted.total()
        except redis.RedisError:
            reports = None
        masters = tuple(
            MasterReplicas(
                node=name,
                replicas=count,
                slots=slots.get(name, 0),
                shards=None if shards is None or name not in short else shards.get(name, 0),
            )
            for name, count in sorted(replicas.items())
        )
        return ReplicationReading(wanted=wanted, masters=masters, reports=reports)

    def _shards_on(self, nodes: set[str]) -> dict[str, int] | None:
        """The campaigns' shards held by each of ``nodes`` (None if they could not be read)."""
        store = self.store
        master_of = _masters_of_keys(store.connection)
        held: dict[str, int] = {}
        try:
            for campaign_id in store.campaign_ids():
                try:
                    layout = store.layout(campaign_id)  # read once per process
                except LDPError:  # deleted meanwhile, or not migrated yet
                    continue
                for shard in range(layout.shards):
                    node = master_of(layout.state_key(shard))
                    if node in nodes:
                        held[node] = held.get(node, 0) + 1
        except redis.RedisError:
            return None
        return held


def _replicas_per_master(connection: Connection) -> tuple[dict[str, int], bool]:
    """The replicas of each master that answered, and whether one did not answer as a master
    (down, failing over, or a replica now): then the client's map is out of date."""
    replicas: dict[str, int] = {}
    stale = False
    for name, client in node_clients(connection):
        try:
            info = client.info("replication")
        except redis.ResponseError:  # INFO disabled (some managed servers): left out
            continue
        except redis.RedisError:  # down, or failing over: left out
            stale = True
            continue
        if info.get("role") != "master":  # demoted since the map was read
            stale = True
            continue
        replicas[name] = int(info.get("connected_slaves", 0))
    return replicas, stale


def _slots_per_master(connection: Connection) -> dict[str, int]:
    """The slots each master serves, from the client's map (a single server: all of them)."""
    if not isinstance(connection, RedisCluster):
        return {name: REDIS_CLUSTER_HASH_SLOTS for name, _ in node_clients(connection)}
    counts: dict[str, int] = {}
    # The map is replaced whole when it is read again: this is a consistent copy.
    for nodes in list(connection.nodes_manager.slots_cache.values()):
        if nodes:
            counts[nodes[0].name] = counts.get(nodes[0].name, 0) + 1
    return counts


def _masters_of_keys(connection: Connection) -> Callable[[str], str]:
    """The master a key lives on, by the client's map ("" for a slot the map has no master for)."""
    if not isinstance(connection, RedisCluster):
        lone = node_clients(connection)[0][0]
        return lambda key: lone
    slots = connection.nodes_manager.slots_cache

    def master_of(key: str) -> str:
        nodes = slots.get(key_slot(key.encode()))
        return nodes[0].name if nodes else ""

    return master_of

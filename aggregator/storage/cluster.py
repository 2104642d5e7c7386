"""One Redis or a Redis Cluster behind the same store: connecting, and writing to a node.

:func:`open_connection` asks the server at ``LDP_REDIS_URL`` whether it is a
cluster node (``INFO cluster``) and returns a :class:`redis.cluster.RedisCluster`
if it is, else a :class:`redis.Redis`; nothing else needs configuring. Reads go
through that client, which routes each key to its slot's node (a pipeline is
sent per node).

Writes of reports go through :class:`NodeWriter`: the scripts for the shards
that live on one node are sent down one connection to that node, followed by
``WAIT`` when acknowledged reports must have reached replicas, so that ``WAIT``
counts exactly those writes. A node that has gone (failover), moved its slots
or is loading is retried with a fresh view of the cluster until
``retry_for_s`` runs out; the scripts are idempotent (report ids are
deduplicated), so a retry after a lost reply stores nothing twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    ClusterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    TryAgainError,
)

Connection = redis.Redis | RedisCluster
# Errors after which the cluster's map is read again and the write retried: the node
# died or is failing over, the slot moved, or the node became a replica.
RETRIED = (
    redis.ConnectionError,
    redis.TimeoutError,
    MovedError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    redis.BusyLoadingError,
)
DEFAULT_RETRY_FOR_S = 3.0
RETRY_PAUSE_S = 0.1

logger = logging.getLogger(__name__)


def open_connection(url: str, **options: Any) -> Connection:
    """A client for the Redis at ``url``: a cluster client if the server is a cluster node."""
    single = redis.Redis.from_url(url, **options)
    try:
        enabled = single.info("cluster").get("cluster_enabled") == 1
    except redis.ResponseError:  # a server without INFO cluster is no cluster node
        enabled = False
    if not enabled:
        return single
    single.close()
    options.pop("health_check_interval", None)
    return RedisCluster.from_url(url, **options)


def is_cluster(connection: Connection) -> bool:
    return isinstance(connection, RedisCluster)


def node_clients(connection: Connection) -> list[tuple[str, redis.Redis]]:
    """(``host:port``, client) of each master: the cluster's, or the one server."""
    if isinstance(connection, RedisCluster):
        return [
            (node.name, connection.get_redis_connection(node))
            for node in connection.get_primaries()
        ]
    kwargs = connection.connection_pool.connection_kwargs
    name = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    return [(str(name), connection)]


def replicas_per_master(connection: Connection) -> int:
    """The fewest replicas any master has (0 for a single server without replicas)."""
    counts = []
    for _, client in node_clients(connection):
        counts.append(int(client.info("replication").get("connected_slaves", 0)))
    return min(counts, default=0)


def default_ack_replicas(connection: Connection) -> int:
    """Replicas to wait for by default: 1 on a cluster whose masters all have one, else 0."""
    if not is_cluster(connection):
        return 0
    return min(replicas_per_master(connection), 1)


def config_value(connection: Connection, name: str) -> str | None:
    """A server setting read with ``CONFIG GET`` from a master (None if not allowed)."""
    try:
        _, client = node_clients(connection)[0]
        value = client.config_get(name).get(name)
    except redis.ResponseError:  # CONFIG renamed or disabled, as managed services do
        return None
    return None if value is None else str(value)


class NotAcknowledged(redis.RedisError):
    """A write reached its master but not the replicas it must reach before it is acknowledged."""


@dataclass(frozen=True)
class Call:
    """One script call: its keys (all in one slot) and arguments."""

    script: Script
    keys: Sequence[str]
    args: Sequence[Any]


class NodeWriter:
    """Runs script calls on the masters that own their keys, and waits for replicas.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's client.
    ack_replicas : int
        Replicas a write must reach before it counts as done (0: the master's word).
    ack_timeout_ms : int
        How long ``WAIT`` waits for them.
    retry_for_s : float
        How long a write is retried through a failover before the error is raised.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        ack_replicas: int = 0,
        ack_timeout_ms: int = 1000,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.connection = connection
        self.ack_replicas = ack_replicas
        self.ack_timeout_ms = ack_timeout_ms
        self.retry_for_s = retry_for_s
        self._sleep = sleep

    def run(self, calls: Sequence[Call], *, wait: bool = True) -> list[Any]:
        """The replies of ``calls``, in order: one round trip per node they touch.

        ``wait`` False sends no ``WAIT`` (for calls that write nothing). Raises :class:`NotAcknowledged` if a node's writes did not reach
        ``ack_replicas`` replicas in time, and the connection's errors once
        ``retry_for_s`` has run out.
        """
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        deadline = time.monotonic() + self.retry_for_s
        while pending:
            by_node: dict[str, tuple[redis.Redis, list[int]]] = {}
            for index in pending:
                name, client = self._client_for(calls[index].keys[0])
                by_node.setdefault(name, (client, []))[1].append(index)
            failed: list[int] = []
            error: Exception | None = None
            for client, indices in by_node.values():
                try:
                    sent = self._send(client, calls, indices, wait)
                    for index, reply in zip(indices, sent, strict=True):
                        replies[index] = reply
                except RETRIED as exc:
                    failed.extend(indices)
                    error = exc
            if failed and time.monotonic() >= deadline:
                assert error is not None
                raise error
            if failed:
                logger.warning("write to a Redis node failed (%s); retrying", type(error).__name__)
                self._sleep(RETRY_PAUSE_S)
                self._refresh()
            pending = failed
        return replies

    def _client_for(self, key: str) -> tuple[str, redis.Redis]:
        connection = self.connection
        if isinstance(connection, RedisCluster):
            node: ClusterNode = connection.get_node_from_key(key)
            return node.name, connection.get_redis_connection(node)
        return "", connection

    def _refresh(self) -> None:
        if isinstance(self.connection, RedisCluster):
            try:
                self.connection.nodes_manager.initialize()
            except (*RETRIED, redis.RedisClusterException) as exc:
                logger.warning("could not read the cluster's map yet (%s)", type(exc).__name__)

    def _send(
        self, client: redis.Redis, calls: Sequence[Call], indices: list[int], wait: bool
    ) -> list[Any]:
        """The scripts of ``indices`` and a ``WAIT`` down one connection of ``client``."""
        replies: dict[int, Any] = {}
        todo = indices
        replicas = self.ack_replicas if wait else 0
        # Each attempt may use another connection: WAIT counts only its own connection's writes.
        reached = replicas
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            for index in todo:
                call = calls[index]
                pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
            if replicas:
                pipe.execute_command("WAIT", replicas, self.ack_timeout_ms)
            results = pipe.execute(raise_on_error=False)
            if replicas:
                reached = min(reached, int(results.pop()))
            for index, result in zip(todo, results, strict=True):
                replies[index] = result
            todo = [index for index in todo if isinstance(replies[index], NoScriptError)]
            if not todo or attempt == 2:
                break
            # A node that restarted or was promoted has not loaded the scripts yet.
            for script in {calls[index].script for index in todo}:
                client.script_load(script.script)
        for index in indices:
            if isinstance(replies[index], Exception):
                raise replies[index]
        if reached < replicas:
            raise NotAcknowledged(
                f"the write reached {reached} of {replicas} replicas in {self.ack_timeout_ms} ms"
            )
        return [replies[index] for index in indices]

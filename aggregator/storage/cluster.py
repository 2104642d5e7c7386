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
deduplicated), so a retry after a lost reply stores nothing twice. A node whose
writes were acknowledged with fewer replicas than asked for (``only_present``:
a master with fewer replicas now) is reported to the writer's owner with the
replies concerned, so that it can count what is held on fewer copies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
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
# How often the number of replicas of a master is read again (only_present).
REPLICA_CHECK_S = 5.0
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


def lua_script(connection: Connection, name: str) -> Script:
    """The script ``aggregator/storage/lua/<name>``, registered on ``connection``."""
    source = resources.files("aggregator.storage") / "lua" / name
    return connection.register_script(source.read_text("utf-8"))


def node_clients(
    connection: Connection, *, masters_only: bool = True
) -> list[tuple[str, redis.Redis]]:
    """(``host:port`` or socket path, client) of each master (or node) of a cluster, or the one."""
    if isinstance(connection, RedisCluster):
        nodes = connection.get_primaries() if masters_only else connection.get_nodes()
        return [(node.name, connection.get_redis_connection(node)) for node in nodes]
    return [(node_name(connection), connection)]


def node_name(connection: redis.Redis) -> str:
    """``host:port`` of a server's client, or its unix socket's path."""
    kwargs = connection.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def config_value(connection: Connection, name: str) -> str | None:
    """A server setting read with ``CONFIG GET`` from a master (None if not allowed)."""
    try:
        _, client = node_clients(connection)[0]
        value = client.config_get(name).get(name)
    except redis.ResponseError:  # CONFIG renamed or disabled, as managed services do
        return None
    return None if value is None else str(value)


def refresh_map(connection: Connection) -> None:
    """Read a cluster's map of slots and nodes again (after a node failed); no-op otherwise."""
    if isinstance(connection, RedisCluster):
        try:
            connection.nodes_manager.initialize()
        except (*RETRIED, redis.RedisClusterException) as exc:
            logger.warning("could not read the cluster's map yet (%s)", type(exc).__name__)


def slot_owners(connection: Connection) -> dict[int, str]:
    """Each slot's master (``host:port``), read afresh; empty on a single server."""
    if not isinstance(connection, RedisCluster):
        return {}
    refresh_map(connection)
    return {slot: nodes[0].name for slot, nodes in connection.nodes_manager.slots_cache.items()}


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
    only_present : bool
        Wait for at most the replicas a master has now (read every
        :data:`REPLICA_CHECK_S`), so that a master whose replica died, or a replica
        promoted by a failover, goes on acknowledging on its own word until a replica
        joins it; False waits for ``ack_replicas`` whatever happens (and refuses
        meanwhile).
    retry_for_s : float
        How long a write is retried through a failover before the error is raised.
    on_under_replicated : callable, optional
        Called as ``on_under_replicated(node, replies)`` after a node (``host:port`` or
        socket path) acknowledged writes with fewer than ``ack_replicas`` replicas
        (``only_present`` only), with the replies of those calls, in order; calls sent
        with ``wait=False`` are never reported. It must not raise: its errors fail the
        write that was acknowledged.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        ack_replicas: int = 0,
        ack_timeout_ms: int = 1000,
        only_present: bool = False,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        sleep: Callable[[float], None] = time.sleep,
        on_under_replicated: Callable[[str, list[Any]], None] | None = None,
    ) -> None:
        self.connection = connection
        self.ack_replicas = ack_replicas
        self.only_present = only_present
        self._replicas: dict[str, tuple[float, int]] = {}
        self.ack_timeout_ms = ack_timeout_ms
        self.retry_for_s = retry_for_s
        self._sleep = sleep
        self.on_under_replicated = on_under_replicated

    def run(self, calls: Sequence[Call], *, wait: bool = True) -> list[Any]:
        """The replies of ``calls``, in order: one round trip per node they touch.

        ``wait`` False sends no ``WAIT`` (for calls that write nothing). Raises
        :class:`NotAcknowledged` if a node's writes did not reach the replicas they
        must in time, and the connection's errors once ``retry_for_s`` has run out.
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
            for name, (client, indices) in by_node.items():
                try:
                    replicas = self._replicas_to_wait(name, client) if wait else 0
                    sent = self._send(client, calls, indices, replicas)
                except RETRIED as exc:
                    failed.extend(indices)
                    error = exc
                    continue
                for index, reply in zip(indices, sent, strict=True):
                    replies[index] = reply
                # Outside the try: an error of the hook must not send the writes again.
                if wait and replicas < self.ack_replicas and self.on_under_replicated is not None:
                    self.on_under_replicated(name, sent)
            if failed and time.monotonic() >= deadline:
                assert error is not None
                raise error
            if failed:
                logger.warning("write to a Redis node failed (%s); retrying", type(error).__name__)
                self._sleep(RETRY_PAUSE_S)
                refresh_map(self.connection)
            pending = failed
        return replies

    def _client_for(self, key: str) -> tuple[str, redis.Redis]:
        connection = self.connection
        if isinstance(connection, RedisCluster):
            node: ClusterNode = connection.get_node_from_key(key)
            return node.name, connection.get_redis_connection(node)
        return node_name(connection), connection

    def _replicas_to_wait(self, name: str, client: redis.Redis) -> int:
        if not self.ack_replicas or not self.only_present:
            return self.ack_replicas
        now = time.monotonic()
        checked = self._replicas.get(name)
        if checked is None or now - checked[0] >= REPLICA_CHECK_S:
            present = int(client.info("replication").get("connected_slaves", 0))
            if present < self.ack_replicas:
                logger.warning(
                    "Redis node %s has %d replicas: reports are acknowledged on fewer copies "
                    "until a replica joins",
                    name,
                    present,
                )
            checked = self._replicas[name] = (now, present)
        return min(self.ack_replicas, checked[1])

    def _send(
        self, client: redis.Redis, calls: Sequence[Call], indices: list[int], replicas: int
    ) -> list[Any]:
        """The scripts of ``indices`` and a ``WAIT`` for ``replicas`` down one connection."""
        if len(indices) == 1 and not replicas:
            # One script and nothing to wait for (a single report on one server): sent as
            # it is, without a pipeline's bookkeeping (redis-py loads it on NOSCRIPT).
            call = calls[indices[0]]
            return [call.script(keys=call.keys, args=call.args, client=client)]
        replies: dict[int, Any] = {}
        todo = indices
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
                waited = results.pop()
                if isinstance(waited, Exception):
                    # A node that is a replica now (an old master back after a failover)
                    # refuses WAIT: read the map again and write to the new master.
                    raise ReadOnlyError(f"WAIT refused: {waited}")
                reached = min(reached, int(waited))
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

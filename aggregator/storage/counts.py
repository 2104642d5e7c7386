"""What a campaign's shards have counted, read back: sums over the shards, pipelined.

Every shard counts the reports it stores (``lua/ingest.lua``): by output index in all
and in the period each was received in, by hour, and in its ``state`` hash its total
and the time of its last report (:mod:`aggregator.storage.layout`). A read sends one
command per shard in one pipeline (the cluster client sends it per node) and sums the
replies, and a window's periods. The counts are the estimators' sufficient statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aggregator.storage.cluster import Connection
from aggregator.storage.layout import Layout

# One command for one shard of one layout, added to a pipeline (a single server's or a
# cluster's).
ShardCommand = Callable[[Any, Layout, int], Any]


def read_shards(
    connection: Connection, layouts: Sequence[Layout], command: ShardCommand
) -> list[list[Any]]:
    """``command`` for each shard of each of ``layouts``, pipelined: the replies by layout."""
    pipe = connection.pipeline(transaction=False)
    for layout in layouts:
        for shard in range(layout.shards):
            command(pipe, layout, shard)
    replies = iter(pipe.execute() if layouts else [])
    return [[next(replies) for _ in range(layout.shards)] for layout in layouts]


def shard_reports(connection: Connection, layouts: Sequence[Layout]) -> list[tuple[int, ...]]:
    """Each shard's stored reports (``n_reports``), for each of ``layouts``."""
    parts = read_shards(
        connection, layouts, lambda pipe, lay, s: pipe.hget(lay.state_key(s), "n_reports")
    )
    return [tuple(int(part or 0) for part in shards) for shards in parts]


def all_time(connection: Connection, layout: Layout) -> dict[int, int]:
    """Reports per output index (indices with no report are absent)."""
    return _summed_hash(connection, layout, Layout.counts_key)


def hourly(connection: Connection, layout: Layout) -> list[tuple[int, int]]:
    """Accepted reports per hour, as (hour start in unix seconds, count), oldest first."""
    return sorted(_summed_hash(connection, layout, Layout.hourly_key).items())


def per_period(connection: Connection, layout: Layout, keys: Sequence[str]) -> list[dict[int, int]]:
    """Reports per output index received in each period of ``keys`` (its key in
    :mod:`aggregator.storage.periods`), in that order: one pipelined read.

    A period whose counts expired, or from before the campaign was counted by period,
    reads as empty.
    """
    pipe = connection.pipeline(transaction=False)
    for key in keys:
        for shard in range(layout.shards):
            pipe.hgetall(layout.period_key(shard, key))
            pipe.get(layout.period_dense_key(shard, key))
    replies = iter(pipe.execute() if keys else [])
    out = []
    for _ in keys:
        dense: list[np.ndarray] = []
        total: dict[int, int] = {}
        for _ in range(layout.shards):
            part, raw = next(replies), next(replies)
            for name, count in part.items():
                total[int(name)] = total.get(int(name), 0) + int(count)
            if raw:
                dense.append(np.frombuffer(raw, dtype=">u4"))
        if dense:
            summed = np.zeros(max(len(array) for array in dense), dtype=np.int64)
            for array in dense:
                summed[: len(array)] += array
            nonzero = np.flatnonzero(summed)
            for index, count in zip(nonzero.tolist(), summed[nonzero].tolist(), strict=True):
                total[index] = total.get(index, 0) + count
        out.append(total)
    return out


def in_window(connection: Connection, layout: Layout, keys: Sequence[str]) -> dict[int, int]:
    """Reports per output index received in the periods of ``keys``, summed."""
    total: dict[int, int] = {}
    for part in per_period(connection, layout, keys):
        for index, count in part.items():
            total[index] = total.get(index, 0) + count
    return total


def last_report_times(connection: Connection, layouts: Sequence[Layout]) -> dict[str, float | None]:
    """When each campaign last accepted a report (unix seconds; None: never), by id."""
    parts = read_shards(
        connection, layouts, lambda pipe, lay, s: pipe.hget(lay.state_key(s), "last_ms")
    )
    return {
        layout.campaign_id: max((int(ms) / 1000 for ms in shard_times if ms), default=None)
        for layout, shard_times in zip(layouts, parts, strict=True)
    }


def _summed_hash(
    connection: Connection, layout: Layout, key_of: Callable[[Layout, int], str]
) -> dict[int, int]:
    (parts,) = read_shards(connection, [layout], lambda pipe, lay, s: pipe.hgetall(key_of(lay, s)))
    total: dict[int, int] = {}
    for part in parts:
        for name, count in part.items():
            total[int(name)] = total.get(int(name), 0) + int(count)
    return total

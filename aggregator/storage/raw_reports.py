"""The raw reports a campaign keeps besides its counts (``LDP_RAW_REPORTS=keep``).

The ingestion script appends each report it stores to its shard's stream, with the
report's id and its wire value, under an entry id that is its arrival in unix
milliseconds; retention trims them by that time (:mod:`aggregator.storage.retention`),
and the export reads them back, oldest first across the shards.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator
from typing import cast

from aggregator.storage.cluster import Connection
from aggregator.storage.counts import read_shards
from aggregator.storage.layout import Layout

# Entries read from a stream per call while exporting.
EXPORT_CHUNK = 1000


def trim(connection: Connection, layout: Layout, *, older_than: float) -> int:
    """Drop raw reports received before ``older_than`` (unix s); how many were dropped."""
    min_id = max(int(older_than * 1000), 1)
    (trimmed,) = read_shards(
        connection,
        [layout],
        lambda pipe, lay, s: pipe.xtrim(lay.stream_key(s), minid=min_id, approximate=False),
    )
    return sum(int(count) for count in trimmed)


def any_kept(connection: Connection, layout: Layout) -> bool:
    """Whether any raw report of the campaign is stored."""
    (lengths,) = read_shards(
        connection, [layout], lambda pipe, lay, s: pipe.xlen(lay.stream_key(s))
    )
    return any(lengths)


def oldest_first(
    connection: Connection, layout: Layout, *, chunk: int = EXPORT_CHUNK
) -> Iterator[dict]:
    """Every kept raw report, oldest first: ``report_id``, ``value``, ``received_at``."""
    streams = [
        _stream(connection, layout.stream_key(shard), chunk) for shard in range(layout.shards)
    ]
    for _, report in heapq.merge(*streams, key=lambda entry: entry[0]):
        yield report


def _stream(connection: Connection, key: str, chunk: int) -> Iterable[tuple[tuple[int, int], dict]]:
    start = "-"
    while True:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            connection.xrange(key, min=start, max="+", count=chunk),
        )
        for entry_id, fields in entries:
            ms, sequence = entry_id.split(b"-")
            yield (
                (int(ms), int(sequence)),
                {
                    "report_id": fields[b"report_id"].decode(),
                    "value": json.loads(fields[b"value"]),
                    "received_at": int(ms) / 1000,
                },
            )
        if len(entries) < chunk:
            return
        start = "(" + entries[-1][0].decode()

"""Enrollment tokens: issued to a campaign's devices, each good for one report.

A token is kept as its SHA-256 digest (:func:`token_digest`), so a leak of the store
spends nothing, in the set of the shard its digest routes to
(:meth:`~aggregator.storage.layout.Layout.token_shard`): the ingestion script spends it
in the same atomic step that stores its report (:mod:`aggregator.storage.ingest`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from aggregator.storage.cluster import Connection
from aggregator.storage.counts import read_shards
from aggregator.storage.layout import Layout


def token_digest(token: str) -> str:
    """What the store keeps of an enrollment token: its SHA-256, so a leak spends nothing."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def add(connection: Connection, layout: Layout, tokens: Sequence[str]) -> None:
    """Make ``tokens`` valid for one report each: one pipelined write."""
    by_shard: dict[int, list[str]] = {}
    for token in tokens:
        digest = token_digest(token)
        by_shard.setdefault(layout.token_shard(digest), []).append(digest)
    pipe = connection.pipeline(transaction=False)
    for shard, digests in by_shard.items():
        pipe.sadd(layout.tokens_key(shard), *digests)
    pipe.execute()


def unused(connection: Connection, layout: Layout) -> int:
    """How many of the campaign's tokens are issued and not spent yet."""
    (sizes,) = read_shards(connection, [layout], lambda pipe, lay, s: pipe.scard(lay.tokens_key(s)))
    return sum(int(size) for size in sizes)

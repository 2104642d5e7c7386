"""Where a campaign's shards go: placed evenly over a cluster's masters, whatever their slots."""

from __future__ import annotations

from collections import Counter

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from aggregator.storage.keys import shard_tag
from aggregator.storage.layout import Layout, placement


def slot_map(shares: dict[str, float]) -> dict[int, str]:
    """Slots in contiguous ranges, each master's range its share of them."""
    owners: dict[int, str] = {}
    start = 0
    for index, (master, share) in enumerate(shares.items()):
        last = len(shares) - 1 == index
        end = REDIS_CLUSTER_HASH_SLOTS if last else start + round(share * REDIS_CLUSTER_HASH_SLOTS)
        owners.update(dict.fromkeys(range(start, end), master))
        start = end
    return owners


def masters_of(layout: Layout, owners: dict[int, str]) -> Counter:
    return Counter(
        owners[key_slot(layout.state_key(shard).encode())] for shard in range(layout.shards)
    )


@pytest.mark.parametrize(
    "shares",
    [
        {"a:1": 1 / 3, "b:2": 1 / 3, "c:3": 1 / 3},
        {"a:1": 0.80, "b:2": 0.15, "c:3": 0.05},  # after a lopsided resharding
        {"a:1": 0.25, "b:2": 0.25, "c:3": 0.25, "d:4": 0.25},
    ],
)
@pytest.mark.parametrize("shards", [3, 16, 17])
def test_every_master_gets_the_same_number_of_shards_to_within_one(shares, shards):
    owners = slot_map(shares)
    for campaign_id in ("fruit", "commute", "sf-cells"):
        salts = placement(campaign_id, shards, owners)
        held = masters_of(Layout(campaign_id, shards, 1, 1, salts), owners)
        counts = [held.get(master, 0) for master in shares]
        assert max(counts) - min(counts) <= 1, (campaign_id, counts)


def test_the_master_with_one_shard_more_differs_between_campaigns():
    owners = slot_map({"a:1": 1 / 3, "b:2": 1 / 3, "c:3": 1 / 3})
    heaviest = {
        masters_of(Layout(name, 16, 1, 1, placement(name, 16, owners)), owners).most_common(1)[0][0]
        for name in (f"campaign-{i}" for i in range(12))
    }
    assert len(heaviest) > 1


def test_one_server_and_old_campaigns_keep_the_plain_tags():
    assert placement("fruit", 16, {}) == (0,) * 16
    assert placement("fruit", 16, dict.fromkeys(range(REDIS_CLUSTER_HASH_SLOTS), "only:1")) == (
        (0,) * 16
    )
    plain = Layout("fruit", 4, 1, 1)
    assert plain.state_key(2) == "ldp:{c:fruit:2}:state" and plain.placement_field == ""
    placed = Layout("fruit", 4, 1, 1, (0, 3, 0, 7))
    assert placed.state_key(1) == "ldp:{c:fruit:1:3}:state"
    assert placed.state_key(2) == "ldp:{c:fruit:2}:state"
    assert placed.placement_field == "0,3,0,7"
    assert shard_tag("fruit", 1, 3) == "{c:fruit:1:3}"

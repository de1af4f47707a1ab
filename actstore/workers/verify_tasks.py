"""The Ray side of `actstore verify`: scrub a group of one run's shards where the task runs."""

from __future__ import annotations

from actstore.records import Damage
from actstore.store.handle import StoreHandle
from actstore.store.upkeep.scrub import check_shard


def verify_shards(store: StoreHandle, run_key: str, checksums: dict[int, dict[int, int]],
                  ids_expected: bool) -> list[Damage]:
    """`check_shard` for every shard in `checksums` (shard -> layer -> the catalog's crc32c)."""
    arrays = store.open()
    return [found for shard, recorded in checksums.items()
            for found in check_shard(arrays, run_key, shard, recorded, ids_expected)]

"""The stores of the partitions a worker owns, restored from the changelog on assignment."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.state.store import KeyValueStore, MemoryStore

log = logging.getLogger(__name__)


class PartitionStores:
    """One store per owned input partition; changelog partition number = input partition number."""

    def __init__(
        self,
        common: CommonSettings,
        changelog_topic: str,
        store_factory: Callable[[int], KeyValueStore] = lambda _partition: MemoryStore(),
        restore_timeout_s: float = 120.0,
    ) -> None:
        self._common = common
        self.changelog_topic = changelog_topic
        self._factory = store_factory
        self._restore_timeout_s = restore_timeout_s
        self._stores: dict[int, KeyValueStore] = {}
        self.restored_records = 0

    def __getitem__(self, partition: int) -> KeyValueStore:
        return self._stores[partition]

    def __contains__(self, partition: int) -> bool:
        return partition in self._stores

    @property
    def partitions(self) -> list[int]:
        return sorted(self._stores)

    def items(self) -> list[tuple[int, KeyValueStore]]:
        """A snapshot of (partition, store) pairs: safe to call from another thread (admin)."""
        return list(self._stores.items())

    def assign(self, partitions: Iterable[int]) -> None:
        new = [p for p in partitions if p not in self._stores]
        for partition in new:
            self._stores[partition] = self._factory(partition)
        self.catch_up(new)

    def revoke(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            store = self._stores.pop(partition, None)
            if store is not None:
                store.close()

    def catch_up(self, partitions: Iterable[int] | None = None) -> None:
        """Apply committed changelog records past each store's checkpoint, up to the last stable
        offset. Used on assignment, and after an abort or an indefinite commit, when the store
        may lag a transaction that did commit."""
        targets = list(self._stores if partitions is None else partitions)
        if not targets:
            return
        started = time.monotonic()
        reader = clients.reader(self._common)
        try:
            assignment = []
            for partition in targets:
                checkpoint = self._stores[partition].checkpoint
                offset = checkpoint if checkpoint is not None else -2  # OFFSET_BEGINNING
                assignment.append(TopicPartition(self.changelog_topic, partition, offset))
            reader.assign(assignment)
            pending = set(targets)
            applied = 0
            while pending:
                if time.monotonic() - started > self._restore_timeout_s:
                    raise TimeoutError(
                        f"restore of {self.changelog_topic} partitions {sorted(pending)} "
                        f"exceeded {self._restore_timeout_s}s"
                    )
                # One apply per partition per fetched chunk: a store that writes through (Redis)
                # pays one round trip per chunk, not per record. Later records win, as in order.
                changes: dict[int, dict[bytes, bytes | None]] = {}
                next_offsets: dict[int, int] = {}
                for message in reader.consume(num_messages=10_000, timeout=0.5):
                    partition = message.partition()
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.discard(partition)
                            continue
                        raise RuntimeError(f"restore of {self.changelog_topic}[{partition}]: {error}")
                    changes.setdefault(partition, {})[message.key()] = message.value()
                    next_offsets[partition] = message.offset() + 1
                    applied += 1
                for partition, chunk in changes.items():
                    self._stores[partition].apply(chunk, checkpoint=next_offsets[partition])
            self.restored_records += applied
            log.info(
                "restored %d changelog records of %s partitions %s in %.2fs",
                applied,
                self.changelog_topic,
                targets,
                time.monotonic() - started,
            )
        finally:
            reader.close()

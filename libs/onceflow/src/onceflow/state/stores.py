"""The stores of the partitions a worker owns, restored from the changelog on assignment and
rebuilt from it whenever a store outside the process (Redis) is found to have gone back in time
(docs/architecture.md, "State: changelog first, store second")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic

from confluent_kafka import KafkaError, TopicPartition

from onceflow import metrics
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.records import key_of, offset_of, partition_of
from onceflow.state.store import MemoryStore, StoreDiverged, StoreT, StoreUnavailable

log = logging.getLogger(__name__)

# Rebuilds of one partition in a row before giving up (a store that diverges again while it is
# being rebuilt is being rolled back or flushed over and over: let the supervisor see it).
_REBUILD_TRIES = 5


@dataclass(frozen=True)
class Changelog(Generic[StoreT]):
    """A hop's state: the changelog topic it materialises, and the store an owned partition gets
    (its type is the one the hop's stage is handed)."""

    topic: str
    store_factory: Callable[[int], StoreT]

    @staticmethod
    def in_memory(topic: str) -> Changelog[MemoryStore]:
        """A `MemoryStore` per partition: every assignment restores the whole changelog."""
        return Changelog(topic, lambda _partition: MemoryStore())


def memory_store(_partition: int) -> MemoryStore:
    """A hop's state in memory: every assignment restores the whole changelog partition."""
    return MemoryStore()


class PartitionStores(Generic[StoreT]):
    """One store per owned input partition; changelog partition number = input partition number."""

    def __init__(
        self,
        common: CommonSettings,
        changelog_topic: str,
        store_factory: Callable[[int], StoreT],
        restore_timeout_s: float = 60.0,  # without a record read: a stalled restore
        service: str = "",
    ) -> None:
        self._common = common
        self._service = service or changelog_topic
        self.changelog_topic = changelog_topic
        self._factory = store_factory
        self._restore_timeout_s = restore_timeout_s
        self._stores: dict[int, StoreT] = {}
        self.restored_records = 0
        # Rebuilds after a divergence, and the last one's reason (Status, metrics, logs).
        self.repairs = 0
        self.last_repair = ""

    def __getitem__(self, partition: int) -> StoreT:
        return self._stores[partition]

    def __contains__(self, partition: int) -> bool:
        return partition in self._stores

    @property
    def partitions(self) -> list[int]:
        return sorted(self._stores)

    def items(self) -> list[tuple[int, StoreT]]:
        """A snapshot of (partition, store) pairs: safe to call from another thread (admin)."""
        return list(self._stores.items())

    def assign(self, partitions: Iterable[int]) -> None:
        """Open and restore the stores of newly owned partitions. Idempotent, so a caller may
        retry it whole after the store was unavailable half-way."""
        owned = list(partitions)
        for partition in owned:
            if partition not in self._stores:
                self._stores[partition] = self._factory(partition)
        self.catch_up(owned)

    def apply_committed(self, partition: int, changes: dict[bytes, bytes | None], checkpoint: int | None) -> None:
        """A committed transaction's changes into the store, rebuilding it if it diverged (the
        rebuild replays this transaction too: it is in the changelog)."""
        try:
            self._stores[partition].apply(changes, checkpoint)
        except StoreDiverged as exc:
            self.repair(exc)

    def audit(self) -> None:
        """Check every owned store against what was last written to it; rebuild any that
        diverged. Cheap (one round trip per Redis store), so an idle worker notices a rolled-back
        Redis within a punctuation interval, not only at its next record."""
        for store in list(self._stores.values()):
            try:
                store.audit()
            except StoreDiverged as exc:
                self.repair(exc)

    def repair(self, diverged: StoreDiverged) -> None:
        """Rebuild one partition's store from the start of its changelog. Until this returns the
        caller processes nothing (it runs on the loop's thread), so nothing is decided on a store
        that is not whole."""
        partition = diverged.partition
        for attempt in range(1, _REBUILD_TRIES + 1):
            started = time.monotonic()
            log.warning(
                "%s[%d]: %s; rebuilding it from the changelog (attempt %d)",
                self.changelog_topic, partition, diverged.reason, attempt,
            )
            store = self._stores[partition]
            store.reset()
            try:
                applied = self._restore([partition])
            except StoreDiverged as again:
                diverged = again
                time.sleep(min(5.0, 0.2 * 2**attempt))
                continue
            self.repairs += 1
            self.last_repair = f"partition {partition}: {diverged.reason}"
            metrics.STORE_REPAIRS.labels(self._service).inc()
            log.warning(
                "%s[%d]: rebuilt from %d changelog records in %.2fs",
                self.changelog_topic, partition, applied, time.monotonic() - started,
            )
            return
        raise StoreUnavailable(
            f"{self.changelog_topic}[{partition}]: still diverging after {_REBUILD_TRIES} rebuilds: {diverged.reason}"
        )

    def revoke(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            store = self._stores.pop(partition, None)
            if store is not None:
                store.close()

    def catch_up(self, partitions: Iterable[int] | None = None) -> None:
        """Apply committed changelog records past each store's checkpoint, up to the last stable
        offset. Used on assignment, and after an abort or an indefinite commit, when the store
        may lag a transaction that did commit. A store found diverged on the way is rebuilt."""
        targets = list(self._stores if partitions is None else partitions)
        while targets:
            try:
                self._restore(targets)
                return
            except StoreDiverged as exc:
                self.repair(exc)  # that partition is whole again; the others resume from their checkpoints

    def _restore(self, targets: list[int]) -> int:
        if not targets:
            return 0
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
            # A read_committed EOF comes at the last stable offset, which any producer's open
            # transaction holds back, also behind records that did commit: a kill -9'd worker's
            # until its transaction times out, or the previous owner's last commit whose markers
            # are not written yet. The input offsets
            # committed with those records are visible to this owner already, so stopping there
            # would resume the input after state the store never saw (a q7 CI run lost 254 bids
            # so). Read on until the stable end passes the high watermark seen at the first
            # EOF: every transaction that could hold a write made before now has then ended.
            ends: dict[int, int] = {}
            applied = 0
            progressed = time.monotonic()
            while pending:
                # A stall, not a long restore, is the failure: a big store (a million ids) takes
                # as long as it takes, and a total limit would turn it into a restart loop.
                if time.monotonic() - progressed > self._restore_timeout_s:
                    stuck = {p: ends[p] for p in sorted(pending) if p in ends}
                    raise TimeoutError(
                        f"restore of {self.changelog_topic} partitions {sorted(pending)} "
                        f"read nothing for {self._restore_timeout_s}s"
                        + (
                            f"; the last stable offset stays below the high watermark {stuck}: a transaction "
                            "that never ends; `onceflow infra abort-hanging --topic "
                            f"{self.changelog_topic}` finds and aborts it (docs/architecture.md, 'Hanging transactions')"
                            if stuck else ""
                        )
                    )
                # One apply per partition per fetched chunk: a store that writes through (Redis)
                # pays one round trip per chunk, not per record. Later records win, as in order.
                changes: dict[int, dict[bytes, bytes | None]] = {}
                next_offsets: dict[int, int] = {}
                for message in clients.consume_ready(reader, 10_000, 0.5):
                    progressed = time.monotonic()
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            partition = partition_of(message)
                            if partition not in ends:  # the fetch's high watermark, not the stable end
                                _low, high = reader.get_watermark_offsets(
                                    TopicPartition(self.changelog_topic, partition), cached=True
                                )
                                ends[partition] = high
                            if offset_of(message) >= ends[partition]:
                                pending.discard(partition)
                            continue
                        raise RuntimeError(f"restore of {self.changelog_topic}[{message.partition()}]: {error}")
                    partition = partition_of(message)
                    changes.setdefault(partition, {})[key_of(message)] = message.value()
                    next_offsets[partition] = offset_of(message) + 1
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
            return applied
        finally:
            reader.close()

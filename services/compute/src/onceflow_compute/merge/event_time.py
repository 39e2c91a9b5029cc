"""What the merge hops of event-time jobs (windowed aggregations: windowed.py; joins:
joined.py) share: per owned ``compute.partials.<job>`` partition, one keyed state (panes, join rows)
restored from the partition's store, the watermarks its source partitions reported, and after
each batch the snapshot of every key the batch changed, into the changelog in the batch's
transaction. The state is a cache of committed state plus the open batch: when a batch is
abandoned, :meth:`on_rollback` reloads it from the stores."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from onceflow.kafka.records import partition_of
from onceflow.state.overlay import StateTransaction
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate, SourceWatermark

from onceflow_compute import stats
from onceflow_compute.api import encode_json
from onceflow_compute.merge.hop import MergeHop
from onceflow_compute.results import state_key


class SourceWatermarks:
    """What each merge partition knows of event time: the latest watermark every
    ``dedup.records`` partition reported to it, and how many there are. Kept in the partition's
    store under ``job\x01<source partition>`` next to the job's state."""

    def __init__(self, job: str) -> None:
        self._prefix = f"{job}\x01".encode()
        self._marks: dict[int, dict[int, int]] = {}
        self._count: dict[int, int] = {}

    def forget(self, partition: int) -> None:
        self._marks.pop(partition, None)
        self._count.pop(partition, None)

    def restore(self, partition: int, key: bytes, value: bytes) -> bool:
        """Take one stored entry if it is a source watermark."""
        if not key.startswith(self._prefix):
            return False
        mark, count = json.loads(value)
        self._marks.setdefault(partition, {})[int(key[len(self._prefix) :])] = mark
        self._count[partition] = count
        return True

    def note(self, partition: int, mark: SourceWatermark, reported: set[int]) -> None:
        marks = self._marks.setdefault(partition, {})
        if mark.watermark_ms > marks.get(mark.partition, mark.watermark_ms - 1):
            marks[mark.partition] = mark.watermark_ms
            self._count[partition] = mark.partitions
            reported.add(mark.partition)

    def watermark(self, partition: int) -> int | None:
        """The minimum over every dedup.records partition, once each has reported."""
        marks = self._marks.get(partition, {})
        count = self._count.get(partition, 0)
        if not count or len(marks) < count:
            return None
        return min(marks.values())

    def persist(self, state: StateTransaction[MemoryStore], partition: int, reported: set[int]) -> None:
        count = self._count.get(partition, 0)
        for source in reported:
            state.put(self._prefix + str(source).encode(), encode_json([self._marks[partition][source], count]))


class KeyedState(Protocol):
    changed_keys: set[str]

    def restore(self, key: str, snapshot: Any) -> None: ...

    def snapshot(self, key: str) -> Any: ...


S = TypeVar("S", bound=KeyedState)


class KeyedEventTimeMerge(MergeHop, Generic[S]):
    """The state's life cycle and the batch loop; a subclass says what a partial does to a key's
    state (``take``, ``apply``) and what follows a batch (``after_batch``)."""

    def __init__(self, job: Any, results_topic: str, counts: stats.JobCounts) -> None:
        super().__init__(job, results_topic, counts)
        # The owned partitions' stores, as the loop hands them on assignment (restored).
        self._stores: dict[int, MemoryStore] = {}
        self.states: dict[int, S] = {}
        self.sources = SourceWatermarks(job.name)
        self._key_prefix = f"{job.name}\x00".encode()

    def new_state(self) -> S:
        raise NotImplementedError

    def loaded(self, partition: int, state: S) -> None:
        """Called once a partition's state is restored."""

    def take(self, partition: int, partial: PartialAggregate) -> Any:
        """Check one record's partial (and, if that cannot fail half-way, apply it). Raising
        dead-letters the record."""
        raise NotImplementedError

    def apply(self, batch: Batch[MemoryStore], partition: int, partial: PartialAggregate, taken: Any) -> int:
        """Apply what :meth:`take` returned; the result changes emitted."""
        return 0

    def after_batch(self, batch: Batch[MemoryStore], partition: int, reported: set[int]) -> int:
        """Once per partition the batch touched; the result changes emitted."""
        raise NotImplementedError

    # -- state ---------------------------------------------------------------------------

    def on_assign(self, partitions: list[int], stores: Mapping[int, MemoryStore]) -> None:
        super().on_assign(partitions, stores)  # the fingerprint first: a carry-over remaps the stores
        self._stores.update(stores)
        for partition in partitions:
            self._load(partition)

    def on_revoke(self, partitions: list[int]) -> None:
        super().on_revoke(partitions)
        for partition in partitions:
            self._stores.pop(partition, None)
            self.states.pop(partition, None)
            self.sources.forget(partition)

    def on_rollback(self) -> None:
        for partition in list(self.states):
            self._load(partition)

    def _load(self, partition: int) -> None:
        state = self.new_state()
        self.sources.forget(partition)
        for key, value in self._stores[partition].items():
            if key.startswith(self._key_prefix):
                state.restore(key[len(self._key_prefix) :].decode(), json.loads(value))
            else:
                self.sources.restore(partition, key, value)
        state.changed_keys.clear()
        self.states[partition] = state
        self.loaded(partition, state)

    def watermarks(self) -> dict[int, int | None]:
        return {p: self.sources.watermark(p) for p in sorted(self.states)}

    # -- a batch -------------------------------------------------------------------------

    def process(self, batch: Batch[MemoryStore]) -> None:
        touched: dict[int, set[int]] = {}
        changes = 0
        self.layout.begin(batch)
        for record in batch.records:
            partition = partition_of(record)
            reported = touched.setdefault(partition, set())
            try:
                partial = PartialAggregate.FromString(record.value() or b"")
                self.consumed(batch, partial)
                if partial.HasField("watermark"):
                    self.sources.note(partition, partial.watermark, reported)
                    continue
                taken = self.take(partition, partial)
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the stream
                batch.dead_letter(record, exc)
                continue
            changes += self.apply(batch, partition, partial, taken)
        for partition, reported in touched.items():
            changes += self.after_batch(batch, partition, reported)
        self.count_after_commit(batch, changes)

    # -- after a batch -------------------------------------------------------------------

    def persist(self, batch: Batch[MemoryStore], partition: int, reported: set[int]) -> None:
        """The changed keys' snapshots and the newly reported source watermarks, into the
        batch's state (its changelog records)."""
        state = self.states[partition]
        overlay = batch.state(partition)
        for key in state.changed_keys:
            snapshot = state.snapshot(key)
            skey = state_key(self.job.name, key)
            if snapshot is None:
                overlay.delete(skey)
            else:
                overlay.put(skey, encode_json(snapshot))
        state.changed_keys.clear()
        self.sources.persist(overlay, partition, reported)

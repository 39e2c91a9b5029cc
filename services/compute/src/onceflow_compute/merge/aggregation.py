"""The merge hop of an aggregation without a window: compute.partials.<job> -> merge into the key's
state (changelog-backed) -> for each key whose row changed, ``-old`` then ``+new`` to
compute.results. (Windowed aggregations: windowed.py; joins: joined.py.)"""

from __future__ import annotations

import json

from confluent_kafka import Message

from onceflow.kafka.records import partition_of
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, JSONValue, encode_json
from onceflow_compute.merge.hop import MergeHop
from onceflow_compute.results import state_key


class MergeStage(MergeHop):
    def __init__(self, job: Aggregation, results_topic: str, counts: stats.JobCounts) -> None:
        super().__init__(job, results_topic, counts)
        self.job: Aggregation = job

    def process(self, batch: Batch[MemoryStore]) -> None:
        job = self.job
        # Per (partition, key): the row as committed before this batch and the row now, so a key
        # gets one -old/+new per transaction however many partials of it the batch held.
        rows: dict[tuple[int, str], tuple[dict[str, JSONValue] | None, dict[str, JSONValue]]] = {}
        self.layout.begin(batch)
        for record in batch.records:
            savepoint = batch.savepoint()
            try:
                key, values = self._decode(batch, record)
                partition = partition_of(record)
                state = batch.state(partition)
                skey = state_key(job.name, key)
                current = state.get(skey)
                current_partials = None if current is None else json.loads(current)
                merged = values if current_partials is None else job.merge(current_partials, values)
                new_row = job.row(key, merged)
                encode_json(new_row)  # a result() that raises or is not JSON is this partial's fault
                state.put(skey, encode_json(merged))
                seen = rows.get((partition, key))
                old_row = seen[0] if seen else None if current_partials is None else job.row(key, current_partials)
                rows[(partition, key)] = (old_row, new_row)
            except Exception as exc:  # noqa: BLE001 - one bad partial must not stop the stream
                batch.rollback_to(savepoint)
                batch.dead_letter(record, exc)
        changes = 0
        for (_partition, key), (old_computed, new_computed) in rows.items():
            before, after = job.shown(old_computed), job.shown(new_computed)  # HAVING: rows the table holds
            if before == after:
                continue
            if before is not None:
                self.emit_change(batch, key, ResultChange.RETRACT, before)
                changes += 1
            if after is not None:
                self.emit_change(batch, key, ResultChange.UPSERT, after)
                changes += 1
        self.count_after_commit(batch, changes)

    def _decode(self, batch: Batch[MemoryStore], record: Message) -> tuple[str, list[JSONValue]]:
        partial = PartialAggregate.FromString(record.value() or b"")  # the job's own topic: its partials only
        self.consumed(batch, partial)
        return partial.key, self.layout.partials(partial)

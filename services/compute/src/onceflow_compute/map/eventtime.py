"""The map hop's event-time duties for a windowed job (aggregation or join).

Per ``dedup.records`` partition it keeps the newest event time committed so far, in the hop's
changelog-backed state (``compute.eventtime``), so a restart or a rebalance resumes it. A record
is judged against the watermark of its partition just before it (newest earlier event time minus
the bound): it is too late when a window it belongs to ended ``allowed_lateness_ms`` or more
before that watermark (for hopping windows: as soon as the earliest of its windows has, so a
record counts in all of its windows or in none). That depends only on the partition's order, never on batch boundaries,
crashes or which worker reads the partition, so a replayed batch judges every record the same.
Too-late records go to ``compute.late`` (as dead letters naming the watermark and the window),
are acked and never reach the job.

A record from the future (its event time more than ``max_ahead_ms`` after the broker first
appended it to ``ingest.records``: ``Envelope.first_appended_ms``, which the gate stamps; else
its ingest time) goes to ``compute.dlq`` and
never moves event time: taken, it would hold the partition's watermark there for good (it is
persisted), and every later record of the partition would be late (issue 39). Ingest refuses
such records already (against its own clock, answering its caller); this catches the Kafka
source's (a user's topic stamped by its producers' clocks: judged here on the broker's clock,
not the source host's), a time column of the payload, which ingest does not read, and records
written before the bound existed.

After each batch the hop sends each partition's watermark to every ``compute.partials.<job>``
partition in the same transaction, so the merge hop knows how far every input has come.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.kafka.records import partition_of
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate, SourceWatermark

from onceflow_compute.api import Aggregation, Join
from onceflow_compute.frames import Frame


def event_times(table: pa.Table, column: str) -> list[int | None]:
    """The time column as epoch ms: an integer column as is, a timestamp (a SQL table's TIMESTAMP,
    milliseconds in the job's schema) as its milliseconds."""
    times = table.column(column)
    if pa.types.is_timestamp(times.type):
        times = times.cast(pa.timestamp("ms")).cast(pa.int64())
    values: list[int | None] = times.to_pylist()
    return values


class EventTimeGate:
    def __init__(
        self,
        job: Aggregation | Join,
        bound_ms: int,
        late_topic: str,
        partials_topic: str,
        partials_partitions: int,
        source_partitions: int,
        max_ahead_ms: int = 3_600_000,
    ) -> None:
        self.job = job
        self.bound_ms = bound_ms
        self.max_ahead_ms = max_ahead_ms
        self._late_topic = late_topic
        self._partials_topic = partials_topic
        self._partials_partitions = partials_partitions
        self._source_partitions = source_partitions
        self._state_key = job.name.encode()

    def newest(self, batch: Batch[MemoryStore], partition: int) -> int | None:
        value = batch.state(partition).get(self._state_key)
        return None if value is None else int(value)

    def split(self, frame: Frame, batch: Batch[MemoryStore]) -> tuple[Frame, int, dict[int, int]]:
        """The frame without its too-late records (dead-lettered to compute.late and acked) and
        without records that have no event time (dead-lettered to compute.dlq); how many were
        too late; and each input partition's new watermark, for ``emit_watermarks`` once the
        batch's partials are out."""
        times = event_times(frame.table, self.job.time_column) if frame.table.num_rows else []
        newest: dict[int, int | None] = {}
        keep: list[bool] = []
        late = 0
        for record, envelope, time in zip(frame.records, frame.envelopes, times, strict=True):
            partition = partition_of(record)
            if partition not in newest:
                newest[partition] = self.newest(batch, partition)
            if time is None:
                batch.dead_letter(record, f"no event time: {self.job.time_column} is null")
                batch.ack(envelope)
                keep.append(False)
                continue
            taken_ms = envelope.first_appended_ms or envelope.ingest_time_ms
            if taken_ms and time > taken_ms + self.max_ahead_ms:
                batch.dead_letter(
                    record,
                    f"event time from the future: {self.job.time_column} {time} is {time - taken_ms} ms after the pipeline "
                    f"took the record in ({taken_ms}), the limit is {self.max_ahead_ms} "
                    f"(ONCEFLOW_EVENT_TIME_MAX_AHEAD_MS); taken, it would hold the watermark there and make every later "
                    f"record late",
                )
                batch.ack(envelope)
                keep.append(False)
                continue
            before = newest[partition]
            watermark = None if before is None else before - self.bound_ms
            first_end = min(w.end for w in self.job.window.assign(time))
            if watermark is not None and first_end + self.job.allowed_lateness_ms <= watermark:
                reason = (
                    f"late: job {self.job.name}: event time {time} is in a window ending at {first_end}, and the watermark of "
                    f"partition {partition} was {watermark} (allowed lateness {self.job.allowed_lateness_ms} ms)"
                )
                batch.dead_letter(record, reason, topic=self._late_topic)
                batch.ack(envelope)
                keep.append(False)
                late += 1
                continue
            keep.append(True)
            newest[partition] = time if before is None else max(before, time)
        marks: dict[int, int] = {}
        for partition, time in newest.items():
            if time is not None:
                batch.state(partition).put(self._state_key, str(time).encode())
                marks[partition] = time - self.bound_ms
        if all(keep):
            return frame, late, marks
        mask = pa.array(keep, pa.bool_())
        kept = Frame(
            pc.filter(frame.table, mask),
            [r for r, k in zip(frame.records, keep, strict=True) if k],
            [e for e, k in zip(frame.envelopes, keep, strict=True) if k],
            frame.rejected,
            frame.passed_over,
        )
        return kept, late, marks

    def emit_watermarks(self, batch: Batch[MemoryStore], marks: dict[int, int]) -> None:
        """After the batch's partials, never before: a watermark says nothing earlier follows
        from its partition, and a merge batch may end between the two. Emitted first, the merge
        could expire a window and then meet this batch's partial for it (dropped)."""
        for partition, watermark in marks.items():
            self._emit_watermark(batch, partition, watermark)

    def _emit_watermark(self, batch: Batch[MemoryStore], partition: int, watermark: int) -> None:
        value = PartialAggregate(
            job=self.job.name,
            watermark=SourceWatermark(partition=partition, watermark_ms=watermark, partitions=self._source_partitions),
        ).SerializeToString()
        for target in range(self._partials_partitions):
            batch.emit(self._partials_topic, value, partition=target)

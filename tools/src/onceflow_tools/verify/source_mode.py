"""``onceflow verify --source``: the workload enters the pipeline the other way in, through the
Kafka source. A plain idempotent producer (``TopicWriter``) writes the workload's records, once
each, into a user topic of the run (``<prefix>user.orders``), and the source service
(``onceflow_source``, a sixth supervised service) copies them into ``ingest.records`` under its
default record ids, ``kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>``.

What the checker expects is then what was produced: one record id per delivered record, made
from the delivery report (partition, offset) and the cluster's and topic's ids of the topic it
was written to, in the form the source documents (``onceflow_client.kafka_identity``). The
checker's verdict rules are unchanged; only its input side is: those ids instead of the
generator's.

The ``recreate-source-topic`` fault (``SourceTopic.recreate``) pauses the writer, waits until
the source has copied every record of the topic (its committed positions, stored for the
topic's current id, at the end of every partition), deletes the topic, creates it again under
its name with as many partitions, and resumes writing into the new topic, whose offsets start
at 0 again. Its records are new records: with ``topic/partition/offset`` ids they carried the
old ones' ids and the gate dropped them as copies (issue 46).

A re-send does not exist here: producing the same payload again is a new record at a new offset,
so client re-sends and late re-sends are off in this mode. The producer's own retries are
idempotent (``enable.idempotence``): each record is in the topic once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.topic_ids import read_topic_id
from onceflow.topology import SOURCE
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.kafka_identity import KafkaOrigin, kafka_record_id
from onceflow_source.positions import stored_topic_id

log = logging.getLogger(__name__)

TOPIC_SUFFIX = "user.orders"  # after the run's prefix
PARTITIONS = 3
COPIED_TIMEOUT_S = 180.0  # the source may be restarting (kill -9, a Spark-less start: seconds)
# After a recreation: how long the running source gets to copy a first record of the new topic
# on its own before it is restarted (see SourceTopic.recreate).
NOTICE_WAIT_S = 10.0
_TOPIC_TIMEOUT_S = 60.0


def _until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class TopicWriter(threading.Thread):
    """Writes ``records`` (key, payload, headers, event time as the record's timestamp) to the
    topic at ``rate`` records/s with an idempotent producer; ``pause`` and ``resume`` around a
    recreation of the topic. ``ids`` are the record ids of the delivered records."""

    def __init__(
        self, bootstrap: str, topic: str, records: Sequence[IngestRecord], rate: float, origin: Callable[[], KafkaOrigin]
    ) -> None:
        super().__init__(name="topic-writer", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.records = records
        self.rate = rate
        self._origin = origin
        self.ids: list[str] = []
        self.acknowledged = 0
        self.error: BaseException | None = None
        self._go = threading.Event()
        self._go.set()
        self._paused = threading.Event()
        self._lock = threading.Lock()

    def _producer(self) -> Producer:
        # A new producer per topic incarnation: its sequence numbers and metadata are the old topic's.
        return Producer(clients.plain_config(self.bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # noqa: BLE001 - reported by the campaign
            log.exception("topic writer failed")
            self.error = exc
        finally:
            self._paused.set()  # nothing more will be written: a pause never waits for it

    def _write(self) -> None:
        producer, origin = self._producer(), self._origin()
        started, paused_s = time.monotonic(), 0.0
        for sent, record in enumerate(self.records):
            if not self._go.is_set():
                self._flush(producer)
                self._paused.set()
                was = time.monotonic()
                self._go.wait()
                self._paused.clear()
                paused_s += time.monotonic() - was
                producer, origin = self._producer(), self._origin()
            if self.rate:
                time.sleep(max(0.0, started + paused_s + sent / self.rate - time.monotonic()))
            self._produce(producer, origin, record)
        self._flush(producer)

    def _produce(self, producer: Producer, origin: KafkaOrigin, record: IngestRecord) -> None:
        def delivered(err: KafkaError | None, message: Message) -> None:
            if err is not None:
                self.error = self.error or KafkaException(err)
                return
            with self._lock:
                self.ids.append(kafka_record_id(origin, self.topic, message.partition() or 0, message.offset() or 0))
                self.acknowledged += 1

        while True:
            try:
                producer.produce(
                    self.topic, record.payload, key=record.key or None, headers=list(record.headers.items()) or None,
                    on_delivery=delivered, timestamp=max(record.event_time_ms, 0),  # 0: now
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.5)
        producer.poll(0)

    def _flush(self, producer: Producer) -> None:
        if producer.flush(300) != 0:
            raise RuntimeError(f"records to {self.topic} still undelivered after 300 s")
        if self.error is not None:
            raise self.error

    def pause(self, timeout_s: float = 330.0) -> None:
        """Stop writing, once every record written so far is delivered."""
        self._go.clear()
        if self.is_alive() and not self._paused.wait(timeout_s):
            raise RuntimeError(f"the writer to {self.topic} did not pause within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"the writer to {self.topic} failed: {self.error}")

    def resume(self) -> None:
        self._go.set()


class SourceTopic:
    """The run's user topic, the writer that fills it, and what the source has copied of it."""

    def __init__(self, common: CommonSettings, records: Sequence[IngestRecord], rate: float) -> None:
        self.common = common
        self.name = f"{common.topic_prefix}{TOPIC_SUFFIX}"
        self.group_id = SOURCE.group_id(common.topic_prefix, job=self.name)
        self.admin: AdminClient = clients.admin(common)
        # confluent_kafka leaves ClusterMetadata.cluster_id untyped (None until librdkafka learns one).
        cluster_id: str | None = self.admin.list_topics(timeout=15).cluster_id
        self.cluster_id = cluster_id or ""
        self.recreations = 0
        self.restarts_after_recreate = 0  # the running source had not noticed: restarted
        # One reader of watermarks and of the source group's positions for the whole run (it never
        # subscribes, so it does not join the group); the campaign and the fault take turns.
        self._reader = clients.consumer(common, self.group_id)
        self._reader_lock = threading.Lock()
        self._create()
        self.writer = TopicWriter(common.kafka_bootstrap, self.name, records, rate, self.origin)

    # -- the input, as the campaign drives it (as it drives Senders) ------------------------

    def start(self) -> None:
        self.writer.start()

    def running(self) -> bool:
        return self.writer.is_alive()

    @property
    def acknowledged(self) -> int:
        return self.writer.acknowledged

    @property
    def error(self) -> BaseException | None:
        return self.writer.error

    def expected_ids(self) -> set[str]:
        """The record id of every record produced, before and after each recreation: distinct,
        since each topic incarnation has an id of its own."""
        ids = set(self.writer.ids)
        if len(ids) != len(self.writer.ids):
            raise RuntimeError(f"{len(self.writer.ids) - len(ids)} records produced into {self.name} share a record id")
        return ids

    # -- the topic -------------------------------------------------------------------------

    def origin(self) -> KafkaOrigin:
        return KafkaOrigin(self.cluster_id, self.topic_id())

    def topic_id(self) -> str:
        return str(read_topic_id(self.admin, self.name))

    def _create(self) -> None:
        brokers = len(self.admin.list_topics(timeout=15).brokers)
        replicas = 3 if brokers >= 3 else 1
        config = {"min.insync.replicas": "2"} if replicas == 3 else {}

        def created() -> bool:
            try:
                self.admin.create_topics([NewTopic(self.name, PARTITIONS, replicas, config=config)])[self.name].result(30)
                return True
            except KafkaException as exc:
                if "already exists" in str(exc) or "marked for deletion" in str(exc):
                    return False  # the deleted one is still being let go of
                raise

        _until(created, _TOPIC_TIMEOUT_S, f"topic {self.name} to be created")

        def readable() -> bool:
            try:
                return bool(self.topic_id()) and len(self._ends()) == PARTITIONS
            except KafkaException:  # the metadata does not know it yet
                return False

        _until(readable, _TOPIC_TIMEOUT_S, f"topic {self.name}'s id and leaders")

    def _ends(self) -> dict[int, int]:
        """partition -> high watermark (the writer is not transactional: no markers)."""
        partitions = self.admin.list_topics(self.name, timeout=15).topics[self.name].partitions
        with self._reader_lock:
            return {p: self._reader.get_watermark_offsets(TopicPartition(self.name, p), timeout=10)[1] for p in partitions}

    def _positions(self) -> list[TopicPartition]:
        """The source group's committed positions on the topic, with their metadata."""
        with self._reader_lock:
            stored: list[TopicPartition] = self._reader.committed(
                [TopicPartition(self.name, p) for p in range(PARTITIONS)], timeout=10
            )
        return stored

    def close(self) -> None:
        self._reader.close()

    # -- what the source copied ------------------------------------------------------------

    def behind(self) -> list[str]:
        """What the source has not yet copied of the topic as it is now (empty: everything):
        per partition, the group's committed position must be stored for the topic's current
        id and be at its end. A position of the deleted topic counts as nothing copied."""
        try:
            topic_id, ends, stored = self.topic_id(), self._ends(), self._positions()
        except KafkaException as exc:
            return [f"source: cannot read its positions on {self.name} ({exc})"]
        missing = 0
        for tp in stored:
            current = tp.offset >= 0 and stored_topic_id(tp.metadata) in (topic_id, None)
            missing += ends[tp.partition] - (tp.offset if current else 0)
        return [f"source: {missing} records of {self.name} not copied"] if missing > 0 else []

    # -- the fault -------------------------------------------------------------------------

    def copied_of_current(self) -> int:
        """Records of the topic as it is now that the source has copied (positions stored for
        its current id)."""
        try:
            topic_id, stored = self.topic_id(), self._positions()
        except KafkaException:
            return 0
        return sum(max(tp.offset, 0) for tp in stored if stored_topic_id(tp.metadata) == topic_id)

    def recreate(self, restart_source: Callable[[], None]) -> str:
        """The ``recreate-source-topic`` fault (module docstring). Then, if the running source
        has copied nothing of the new topic within ``NOTICE_WAIT_S`` while records are written
        to it, it is restarted (``restart_source``, kill -9), and the note says so. A running
        source notices by itself: its partitions stop on librdkafka's offset-out-of-range error
        (``auto.offset.reset=error``), it re-reads the topic's id every few seconds while idle,
        and exits for a restart under the new id, which the supervisor gives it. So a restart
        here (counted in the verdict's ``faults_injected`` as ``source_restarts_after_recreate``)
        means it did not; what it copies afterwards is judged as usual."""
        started = time.monotonic()
        self.writer.pause()
        try:
            _until(lambda: not self.behind(), COPIED_TIMEOUT_S, f"the source to copy all of {self.name}", interval_s=1.0)
            copied = sum(self._ends().values())
            before = self.topic_id()
            self.admin.delete_topics([self.name])[self.name].result(30)
            _until(lambda: self.name not in self.admin.list_topics(timeout=15).topics, _TOPIC_TIMEOUT_S, f"{self.name} to be gone")
            self._create()
            after = self.topic_id()
            if after == before:
                raise RuntimeError(f"{self.name} was recreated under the same topic id {after}")
        finally:
            self.writer.resume()
        self.recreations += 1
        note = (f"{self.name} deleted after the source copied its {copied} records, and created again "
                f"(id {before} -> {after}, {time.monotonic() - started:.0f} s)")
        deadline = time.monotonic() + NOTICE_WAIT_S
        while not self.copied_of_current() and time.monotonic() < deadline:
            if not self.writer.is_alive() and not sum(self._ends().values()):
                return note  # nothing will be written to the new topic: nothing to copy
            time.sleep(1.0)
        if self.copied_of_current():
            return note
        restart_source()
        self.restarts_after_recreate += 1
        return f"{note}; the running source copied nothing of the new topic within {NOTICE_WAIT_S:.0f} s: kill -9, restarted"

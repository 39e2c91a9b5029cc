"""Who reads each stream (docs/decisions/0028), so that a record's tree ends once every job
reading its stream has processed it.

A tree is Storm's XOR of edges: an edge acked twice cancels out. Two jobs reading one stream
each acked the one edge the gate forwarded, so the tree never completed: every record of a
shared stream timed out (late, never lost, but ``wait=PROCESSED`` answered DEADLINE_EXCEEDED).

- Each compute worker writes an entry to ``stream.readers`` (compacted) at start: its stream,
  its job (``job@n`` for a version: blue and green are two readers) and its instance. A clean
  stop writes a tombstone; a worker killed keeps its entry, since its job will still read what
  is waiting (``onceflow stream readers --forget`` removes a job that is gone for good).
- The gate follows the topic (:class:`ReaderDirectory`) and names the jobs reading a record's
  stream in ``Envelope.readers``, acking the record with one child edge per reader
  (``acks.reader_edge``). A reader acks its own edge; a job not named passes the record over.
- A job that starts after a record passed the gate is not named in it and does not ack it; one
  named that stops for good leaves its trees to time out (late, not lost: ADR 0022).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from onceflow import streams
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import latest_by_key, partitions_of, read_committed
from onceflow.topology import Topic

log = logging.getLogger(__name__)

SEPARATOR = "\x00"  # never in a stream, job or instance name


@dataclass(frozen=True)
class Reader:
    stream: str  # canonical: "" for the default stream
    job: str  # the job as it runs: `job@n` for a version
    instance: str
    since_ms: int = 0

    @property
    def key(self) -> bytes:
        return reader_key(self.stream, self.job, self.instance)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Reader:
        data = json.loads(value)
        return cls(streams.canonical(str(data["stream"])), str(data["job"]), str(data["instance"]), int(data.get("since_ms", 0)))


def reader_key(stream: str, job: str, instance: str) -> bytes:
    return SEPARATOR.join((streams.canonical(stream), job, instance)).encode()


def readers_topic(common: CommonSettings) -> str:
    return common.topic(Topic.STREAM_READERS)


def _write(common: CommonSettings, entries: Iterable[tuple[bytes, bytes | None]], timeout_s: float = 30.0) -> int:
    producer = clients.idempotent_producer(common, **{"linger.ms": 0})
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    written = 0
    for key, value in entries:
        producer.produce(readers_topic(common), value, key, on_delivery=delivered)
        written += 1
    if producer.flush(timeout_s) or failures:
        raise RuntimeError(f"writing {readers_topic(common)}: {failures[0] if failures else f'not delivered within {timeout_s:.0f} s'}")
    return written


def register(common: CommonSettings, stream: str, job: str, instance: str) -> Reader:
    """Say that ``job`` (this worker, ``instance``) reads ``stream``; idempotent."""
    reader = Reader(streams.canonical(stream), job, instance, int(time.time() * 1000))
    _write(common, [(reader.key, reader.encode())])
    return reader


def unregister(common: CommonSettings, stream: str, job: str, instance: str) -> None:
    """This worker of ``job`` reads ``stream`` no more (a clean stop: bounded, so a worker
    stopping while the broker is away does not hang on it)."""
    _write(common, [(reader_key(stream, job, instance), None)], timeout_s=5.0)


def read_readers(common: CommonSettings, timeout_s: float = 30.0) -> list[Reader]:
    """Every entry, as it stands."""
    records = read_committed(common, readers_topic(common), timeout_s=timeout_s)
    return sorted(
        (Reader.decode(value) for _key, value in latest_by_key(records).items()),
        key=lambda r: (r.stream, r.job, r.instance),
    )


def forget(common: CommonSettings, stream: str, job: str) -> int:
    """Remove every worker's entry of ``job`` on ``stream`` (a job gone for good); how many."""
    stale = [r for r in read_readers(common) if r.stream == streams.canonical(stream) and r.job == job]
    return _write(common, [(r.key, None) for r in stale])


def by_stream(entries: Iterable[Reader]) -> dict[str, tuple[str, ...]]:
    """Each stream's readers: its jobs, each once however many workers it runs, sorted."""
    jobs: dict[str, set[str]] = {}
    for entry in entries:
        jobs.setdefault(entry.stream, set()).add(entry.job)
    return {stream: tuple(sorted(names)) for stream, names in jobs.items()}


class ReaderDirectory:
    """The gate's view of ``stream.readers``: read to its end at :meth:`start`, then followed by
    a thread of its own, so :meth:`readers_of` never waits on the broker."""

    def __init__(self, common: CommonSettings) -> None:
        self._common = common
        self._entries: dict[bytes, Reader] = {}
        self._view: dict[str, tuple[str, ...]] = {}
        self._caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="stream-readers", daemon=True)

    def start(self, wait_s: float = 30.0) -> ReaderDirectory:
        """Start following; wait until the topic is read to its end (or ``wait_s`` passed: then
        the gate starts with what it has, and a tree it forwards meanwhile may end late)."""
        self._thread.start()
        if not self._caught_up.wait(wait_s):
            log.warning("%s not read to its end within %.0f s: records pass with the readers known so far",
                        readers_topic(self._common), wait_s)
        return self

    def readers_of(self, stream: str) -> tuple[str, ...]:
        return self._view.get(streams.canonical(stream), ())

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _follow(self) -> None:
        topic = readers_topic(self._common)
        partitions = partitions_of(self._common, topic)
        if not partitions:
            log.warning("no topic %s (run `onceflow infra topics`): records pass with one edge until it exists", topic)
            self._caught_up.set()
        while not partitions and not self._stop.wait(5.0):
            partitions = partitions_of(self._common, topic)
        if self._stop.is_set():
            return
        consumer = clients.reader(self._common, **{"fetch.wait.max.ms": 500})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition() or 0)
                        if at_end >= set(partitions):
                            self._caught_up.set()
                    else:
                        log.warning("following %s: %s", topic, error)
                    continue
                self._apply(message.key(), message.value())
        finally:
            consumer.close()

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        if value is None:
            self._entries.pop(key, None)
        else:
            try:
                self._entries[key] = Reader.decode(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("an entry of %s that is not a reader (%s): ignored", readers_topic(self._common), exc)
                return
        view = by_stream(self._entries.values())
        if view != self._view:
            log.info("stream readers: %s", {streams.display(s): list(jobs) for s, jobs in sorted(view.items())} or "none")
        self._view = view  # one assignment: the gate's thread reads whole views

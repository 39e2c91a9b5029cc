"""Named streams (docs/decisions/0025): a record belongs to one stream, named by its caller;
the gate writes what it passes to that stream's topic, and a job reads its stream's topic only,
so no job reads, decodes or pays for another stream's records.

- The default stream (named ``default``, or nothing: today's callers) is ``dedup.records``.
- Stream ``orders`` is ``dedup.records.orders``: a copy of ``dedup.records``' declaration (its
  partitions, so ``compute.eventtime`` still records partition n of every stream's topic in its
  partition n; its retention, the history a job version rebuilds from).
- A stream exists once its topic does. Only an operator creates one (``onceflow stream create``):
  a misspelt name in a client or a job is an error, never a new stream.
- A record's identity is its stream and its record_id: order ``17`` and payment ``17`` are two
  records. The gate keys the default stream's records by record_id alone, as before, and a named
  stream's by ``stream NUL record_id`` (:func:`identity`); ingest refuses a record_id holding NUL,
  so no default-stream id can take the place of a named stream's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from onceflow.config import CommonSettings
from onceflow.kafka import clients, inspect, positions, topics
from onceflow.topology import Topic

log = logging.getLogger(__name__)

DEFAULT = "default"
# As job names (topology.JOB_NAME): a stream's name goes into its topic's name; no dot, so that no
# two streams' topics collide in Kafka's metric names ('.' and '_' are one there).
STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")
SEPARATOR = "\x00"  # between a named stream and a record_id in the gate's key (never in either)


def canonical(stream: str) -> str:
    """``""`` for the default stream however it is written, else the name as given."""
    return "" if stream in ("", DEFAULT) else stream


def display(stream: str) -> str:
    return canonical(stream) or DEFAULT


def check_stream_name(stream: str) -> str:
    """The name, or ValueError saying what a name may hold."""
    if stream and not STREAM_NAME.fullmatch(stream):
        raise ValueError(f"stream name {stream!r}: 1 to 100 of A-Z, a-z, 0-9, '_' and '-' (it names the stream's topic)")
    return stream


def topic_of(stream: str) -> str:
    """The stream's topic, before the prefix: ``dedup.records`` or ``dedup.records.<stream>``."""
    name = canonical(stream)
    return f"{Topic.DEDUP_RECORDS.value}.{name}" if name else Topic.DEDUP_RECORDS.value


def stream_of_topic(topic: str) -> str | None:
    """The stream whose topic (before the prefix) is ``topic``; None for any other topic."""
    if topic == Topic.DEDUP_RECORDS.value:
        return DEFAULT
    stem = f"{Topic.DEDUP_RECORDS.value}."
    name = topic[len(stem) :] if topic.startswith(stem) else ""
    return name if STREAM_NAME.fullmatch(name) else None


def identity(stream: str, record_id: str, redrive_job: str = "", redrive_count: int = 0, producer: str = "") -> str:
    """What the gate deduplicates by: the record_id within its stream and its producer's id
    space (docs/decisions/0027); a re-driven compute letter's (``onceflow dlq redrive``) also
    names its job and its redrive count, so it is a record of its own, once per count
    (docs/decisions/0026). Injective: record_ids, stream and producer names hold no NUL, and a
    record_id is never empty, so the forms below cannot meet:
    ``id``, ``s NUL id``, ``s NUL id NUL job NUL n``, ``s NUL NUL p NUL id [NUL job NUL n]``."""
    name = canonical(stream)
    redrive = (redrive_job, str(redrive_count)) if redrive_job else ()
    if producer:
        return SEPARATOR.join((name, "", producer, record_id, *redrive))
    if redrive:
        return SEPARATOR.join((name, record_id, *redrive))
    return f"{name}{SEPARATOR}{record_id}" if name else record_id


def split_identity(key: str) -> tuple[str, str]:
    """(stream, record_id) of a gate key."""
    name, sep, rest = key.partition(SEPARATOR)
    if not sep:
        return DEFAULT, key
    if rest.startswith(SEPARATOR):  # a producer's: s NUL NUL p NUL id ...
        rest = rest[1:].partition(SEPARATOR)[2]
    return display(name), rest.partition(SEPARATOR)[0]


class StreamLookupFailed(RuntimeError):
    """The broker did not say which streams exist: neither "present" nor "absent" is known, so
    a caller retries (the gate's batch, ingest's UNAVAILABLE) rather than refuse a record."""


@dataclass
class StreamDirectory:
    """Which streams exist, from the broker's topic list, cached. The default stream always
    exists (it is one of the pipeline's own topics). A named stream seen present is answered from
    the cache while the last listing is younger than ``ttl_s``, then listed again, so a deleted
    stream is noticed; one absent is listed again at most every ``refresh_s`` (a stream created
    a moment ago is found within that). A listing that fails answers neither: it raises
    StreamLookupFailed. ``list_topics`` returns the prefixed topic names."""

    list_topics: Callable[[], set[str]]
    prefix: str = ""
    refresh_s: float = 1.0
    ttl_s: float = 30.0

    def __post_init__(self) -> None:
        self._known: set[str] = set()
        self._listed_at = float("-inf")  # the last listing that answered
        self._lock = threading.Lock()

    def exists(self, stream: str) -> bool:
        name = canonical(stream)
        if not name:
            return True
        age = time.monotonic() - self._listed_at
        if name in self._known and age < self.ttl_s:
            return True
        with self._lock:
            age = time.monotonic() - self._listed_at
            stale = age >= self.ttl_s if name in self._known else age >= self.refresh_s
            if stale:
                self._refresh()
            return name in self._known

    def _refresh(self) -> None:
        try:
            topics = self.list_topics()
        except Exception as exc:  # noqa: BLE001 - any failure to answer is "unknown", never "absent"
            raise StreamLookupFailed(f"listing the streams' topics: {exc}") from exc
        found = {stream_of_topic(t[len(self.prefix) :]) for t in topics if t.startswith(self.prefix)}
        self._known = {canonical(s) for s in found if s is not None}
        self._listed_at = time.monotonic()


def directory(common: CommonSettings) -> StreamDirectory:
    """The streams of the pipeline ``common`` names, looked up on its broker."""
    admin = clients.admin(common)  # held: a freed admin client never answers (docs/decisions/0024)

    def topics() -> set[str]:
        return set(admin.list_topics(timeout=10).topics)

    return StreamDirectory(topics, common.topic_prefix)


def lookup(common: CommonSettings, stream: str) -> bool:
    """Whether ``stream`` exists; raises (KafkaException) while the broker does not answer, so a
    starting broker is never taken for a missing stream."""
    admin = clients.admin(common)
    topic = common.topic(topic_of(stream))
    metadata = admin.list_topics(timeout=10)
    return topic in metadata.topics and metadata.topics[topic].error is None


def create(common: CommonSettings, stream: str, history_retention_ms: int | None = None) -> bool:
    """Create ``stream``'s topic as ``dedup.records`` is declared (True), or find it (False)."""
    check_stream_name(stream)
    spec = next(s for s in topics.shared_specs() if s.name == Topic.DEDUP_RECORDS)
    if history_retention_ms is not None:
        spec = dataclasses.replace(spec, retention_ms=history_retention_ms)
    named = dataclasses.replace(spec, name=topic_of(stream), doc=f"Records of stream {display(stream)} the gate let through.")
    return bool(topics.ensure_topics(common.kafka_bootstrap, common.topic_prefix, [named]))


def reading(common: CommonSettings, stream: str, group: str) -> str:
    """What a group is about to read of ``stream``: where from, and how many records that is."""
    topic = common.topic(topic_of(stream))
    committed = inspect.committed_offsets(common, group, topic)
    start = positions.group_positions(common, group, topic)
    ahead = positions.behind(common, topic, start, positions.stable_ends(common, topic))
    where = (
        "from its committed offsets" if all(o >= 0 for o in committed.values())
        else "from the start of the stream's retained history" if not any(o >= 0 for o in committed.values())
        else "from its committed offsets, and the start of history where it has none"
    )
    return f"stream {display(stream)} ({topic}, {len(start)} partitions), {where}: {ahead.records}{'' if ahead.exact else '+'} records to read now"


def missing_stream(stream: str) -> str:
    """The reason a record or a job naming an absent stream is refused."""
    return (
        f"no stream {display(stream)!r} (no topic {topic_of(stream)}): an operator creates it with "
        f"`onceflow stream create {display(stream)}`"
    )

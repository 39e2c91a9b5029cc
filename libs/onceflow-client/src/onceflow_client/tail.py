"""Following a result table live: ``ResultsTail`` reads the results topic (read_committed, so
only changes whose transaction committed) and folds each job's changes into a dict, as the
sink folds them into Redis: an UPSERT sets the row, a RETRACT removes it. It yields each
change as it folds it, and can stop and resume where it stopped (``snapshot``). Needs the
``tail`` extra (confluent-kafka)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from onceflow.v1.results_pb2 import ResultChange
from onceflow_client.topics import Topic

RESULTS_TOPIC = str(Topic.COMPUTE_RESULTS)
# Which version of a job its plain name reads (docs/jobs.md#versions-and-bluegreen): the last
# JSON record per job, its `live` the version number (0: none promoted: the plain name's table).
REGISTRY_TOPIC = str(Topic.JOBS_REGISTRY)
# The pipeline's setting, read as the services read it: a tail built with no topic_prefix follows
# the pipeline its environment names, not the unprefixed one (which on a shared broker may be
# someone else's, or empty).
TOPIC_PREFIX_ENV = "ONCEFLOW_TOPIC_PREFIX"
_OPS = {ResultChange.UPSERT: "+", ResultChange.RETRACT: "-"}


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - the extra is not installed
        raise ImportError("ResultsTail reads Kafka: install onceflow-client[tail] (confluent-kafka)") from None
    return confluent_kafka


@dataclass(frozen=True)
class Change:
    op: str  # "+" (the row is now value) or "-" (the row is gone)
    key: str
    value: bytes
    partition: int
    offset: int


@dataclass
class TailSnapshot:
    """Where a tail stopped: the table it had folded and the next offset per partition."""

    table: dict[str, bytes] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    version: str = ""  # the table it folded: `orders@2` (a resumed tail stays on it), or the plain name

    def to_json(self) -> str:
        return json.dumps({
            "table": {key: base64.b64encode(value).decode() for key, value in self.table.items()},
            "positions": {str(p): o for p, o in self.positions.items()},
            "version": self.version,
        })

    @classmethod
    def from_json(cls, text: str) -> TailSnapshot:
        data = json.loads(text)
        return cls(
            {key: base64.b64decode(value) for key, value in data["table"].items()},
            {int(p): int(o) for p, o in data["positions"].items()},
            data.get("version", ""),
        )


class ResultsTail:
    """``job``'s table, kept current from the results topic. ``topic_prefix`` is the pipeline's
    topic prefix; None (the default) reads ONCEFLOW_TOPIC_PREFIX, "" when unset.
    ``kafka_config`` adds librdkafka settings (security, ...).

    A job's plain name follows its live version (``version`` names it: ``orders@2``), also
    across a promotion: the tail reads the new version's table to the end, then hands out the
    difference in one poll (``-`` for a row the new table lacks, ``+`` for one it holds
    otherwise; partition and offset -1), so ``table`` goes from one whole version to the other
    and a consumer that folds ``+`` and ``-`` stays exact. ``orders@2`` follows that version only."""

    def __init__(
        self, bootstrap: str, job: str, topic_prefix: str | None = None, resume: TailSnapshot | None = None,
        kafka_config: Mapping[str, str] | None = None,
    ) -> None:
        kafka = _kafka()
        if topic_prefix is None:
            topic_prefix = os.environ.get(TOPIC_PREFIX_ENV, "")
        self.job = job
        self.topic = f"{topic_prefix}{RESULTS_TOPIC}"
        state = resume or TailSnapshot()
        self.table: dict[str, bytes] = dict(state.table)
        self._positions = dict(state.positions)
        self._consumer = kafka.Consumer(self._consumer_config(bootstrap, kafka_config))
        metadata = self._consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            self._consumer.close()
            raise ValueError(f"no topic {self.topic} on {bootstrap}: is the pipeline's topic prefix {topic_prefix!r}?")
        self.partitions = sorted(topic.partitions)
        self._config = self._consumer_config(bootstrap, kafka_config)
        # A plain name follows the registry: the alias, and every promotion after it.
        self._registry: str | None = None
        self._registry_positions: dict[int, int] = {}
        live = job
        if "@" not in job:
            registry = f"{topic_prefix}{REGISTRY_TOPIC}"
            found = self._consumer.list_topics(registry, timeout=10).topics.get(registry)
            if found is not None and found.error is None and found.partitions:  # else: a pipeline from before versions
                self._registry = registry
                live, self._registry_positions = self._read_registry(sorted(found.partitions))
        self.version = state.version or live
        self._switch_to = live if live != self.version else None  # resumed on a version no longer live
        self._assign()
        self._at_end: set[int] = set()

    @staticmethod
    def _consumer_config(bootstrap: str, kafka_config: Mapping[str, str] | None) -> dict[str, Any]:
        return {
            "bootstrap.servers": bootstrap,
            # Never joins it: partitions are assigned by hand and no offset is committed.
            "group.id": f"onceflow-results-tail-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
            **dict(kafka_config or {}),
        }

    def _assign(self) -> None:
        kafka = _kafka()
        assigned = [kafka.TopicPartition(self.topic, p, self._positions.get(p, kafka.OFFSET_BEGINNING)) for p in self.partitions]
        if self._registry is not None:
            assigned += [kafka.TopicPartition(self._registry, p, o) for p, o in self._registry_positions.items()]
        self._consumer.assign(assigned)

    def _live_name(self, value: bytes | None) -> str:
        live = int(json.loads(value).get("live", 0)) if value else 0
        return f"{self.job}@{live}" if live else self.job

    def _read_registry(self, partitions: list[int]) -> tuple[str, dict[int, int]]:
        """The name the job's plain name reads now, and where the registry ends."""
        kafka = _kafka()
        assert self._registry is not None
        live, positions = self.job, {p: 0 for p in partitions}
        self._consumer.assign([kafka.TopicPartition(self._registry, p, kafka.OFFSET_BEGINNING) for p in partitions])
        open_partitions = set(partitions)
        deadline = time.monotonic() + 30
        while open_partitions and time.monotonic() < deadline:
            for message in self._consumer.consume(num_messages=500, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == kafka.KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                    continue
                positions[message.partition()] = message.offset() + 1
                if message.key() == self.job.encode():
                    live = self._live_name(message.value())
        self._consumer.unassign()
        return live, positions

    def _switch(self, name: str) -> list[Change]:
        """Read ``name``'s table to the end on a consumer of its own, then move to it: the
        difference from the table held, as changes."""
        kafka = _kafka()
        reader = kafka.Consumer(self._config)
        table: dict[str, bytes] = {}
        positions: dict[int, int] = {}
        try:
            reader.assign([kafka.TopicPartition(self.topic, p, kafka.OFFSET_BEGINNING) for p in self.partitions])
            waiting = set(self.partitions)
            while waiting:
                for message in reader.consume(num_messages=1000, timeout=1.0):
                    error = message.error()
                    if error is not None:
                        if error.code() == kafka.KafkaError._PARTITION_EOF:
                            waiting.discard(message.partition())
                            continue
                        raise RuntimeError(f"reading {self.topic}: {error}")
                    positions[message.partition()] = message.offset() + 1
                    _fold(table, ResultChange.FromString(message.value() or b""), name)
        finally:
            reader.close()
        diff = [Change("-", key, b"", -1, -1) for key in self.table if key not in table]
        diff += [Change("+", key, value, -1, -1) for key, value in table.items() if self.table.get(key) != value]
        self.table, self.version, self._positions, self._switch_to = table, name, positions, None
        self._assign()
        return diff

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> ResultsTail:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def snapshot(self) -> TailSnapshot:
        return TailSnapshot(dict(self.table), dict(self._positions), self.version)

    @property
    def caught_up(self) -> bool:
        """Whether the last poll reached the end of every partition's committed changes."""
        return self._at_end >= set(self.partitions)

    def poll(self, timeout_s: float = 1.0, most: int = 1000) -> list[Change]:
        """The changes (of this job) that arrived, folded into ``table``: waits up to
        ``timeout_s`` for a first one, then takes up to ``most`` of those already fetched
        (``consume(most, timeout)`` alone would hold a quiet topic's change back until the
        timeout)."""
        if self._switch_to is not None:
            return self._switch(self._switch_to)
        changes: list[Change] = []
        messages = self._consumer.consume(num_messages=1, timeout=timeout_s)
        if messages and most > 1:
            messages += self._consumer.consume(num_messages=most - 1, timeout=0)
        for message in messages:
            error = message.error()
            if message.topic() == self._registry:
                if error is None:
                    self._registry_positions[message.partition()] = message.offset() + 1
                    if message.key() == self.job.encode() and (live := self._live_name(message.value())) != self.version:
                        # What follows in this batch is in the new table already (read to the end).
                        return changes + self._switch(live)
                continue
            if error is not None:
                if error.code() == _kafka().KafkaError._PARTITION_EOF:
                    self._at_end.add(message.partition())
                    continue
                raise RuntimeError(f"reading {self.topic}: {error}")
            partition, offset = message.partition(), message.offset()
            self._at_end.discard(partition)
            change = ResultChange.FromString(message.value() or b"")
            if _fold(self.table, change, self.version):
                changes.append(Change(_OPS[change.op], change.key, change.value, partition, offset))
            # The position moves only after the fold: a Ctrl-C between the two leaves a snapshot
            # that folds this change again on resume, which sets or removes the same row (a
            # fold is idempotent), never one that skips it.
            self._positions[partition] = offset + 1
        return changes

    def changes(self, idle_timeout_s: float | None = None) -> Iterator[Change]:
        """Each change as it is folded; forever, or until caught up and nothing came for
        ``idle_timeout_s``."""
        quiet = _Quiet(idle_timeout_s)
        while True:
            batch = self.poll(quiet.poll_timeout_s())
            yield from batch
            if quiet.over(bool(batch), self.caught_up):
                return


def _fold(table: dict[str, bytes], change: ResultChange, name: str) -> bool:
    """Fold ``change`` into ``table`` if it is ``name``'s; whether it was."""
    if change.job != name or change.op not in _OPS:
        return False
    if change.op == ResultChange.UPSERT:
        table[change.key] = change.value
    else:
        table.pop(change.key, None)
    return True


class _Quiet:
    """When ``changes(idle_timeout_s)`` ends: caught up, with no change for the whole timeout."""

    def __init__(self, idle_timeout_s: float | None) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.since = time.monotonic()

    def poll_timeout_s(self) -> float:
        return 1.0 if self.idle_timeout_s is None else max(0.01, min(1.0, self.idle_timeout_s))

    def over(self, changed: bool, caught_up: bool) -> bool:
        now = time.monotonic()
        if changed or not caught_up:
            self.since = now
            return False
        return self.idle_timeout_s is not None and now - self.since >= self.idle_timeout_s


class AsyncResultsTail:
    """ResultsTail for asyncio: Kafka is polled on a worker thread, so the loop never blocks.
    ``async with AsyncResultsTail(...) as tail:`` closes it on the way out, like the other clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._tail = ResultsTail(*args, **kwargs)

    async def __aenter__(self) -> AsyncResultsTail:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def table(self) -> dict[str, bytes]:
        return self._tail.table

    @property
    def caught_up(self) -> bool:
        return self._tail.caught_up

    def snapshot(self) -> TailSnapshot:
        return self._tail.snapshot()

    async def close(self) -> None:
        await asyncio.to_thread(self._tail.close)

    async def poll(self, timeout_s: float = 1.0) -> list[Change]:
        return await asyncio.to_thread(self._tail.poll, timeout_s)

    async def changes(self, idle_timeout_s: float | None = None) -> AsyncIterator[Change]:
        quiet = _Quiet(idle_timeout_s)
        while True:
            batch = await self.poll(quiet.poll_timeout_s())
            for change in batch:
                yield change
            if quiet.over(bool(batch), self.caught_up):
                return

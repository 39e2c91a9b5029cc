"""The job registry topic (``jobs.registry``, onceflow.versions): read it, and change it one
command at a time.

Kafka has no compare-and-set, so a change is serialised by the transactional id instead: every
writer uses the one id ``<prefix>onceflow-jobs-registry``. ``init_transactions`` fences any
writer that started before (its commit fails) and waits for its open transaction to end, so the
registry read after it is the latest, and a change based on it commits only if no other writer
started in between.
"""

from __future__ import annotations

import logging
from types import TracebackType

from confluent_kafka import KafkaException, Producer

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import latest_by_key, read_committed
from onceflow.topology import Topic
from onceflow.versions import JobRecord

log = logging.getLogger(__name__)


class ConcurrentChange(RuntimeError):
    """Another registry writer started while this one held the registry."""


def registry_topic(common: CommonSettings) -> str:
    return common.topic(Topic.JOBS_REGISTRY)


def read_registry(common: CommonSettings, timeout_s: float = 30.0) -> dict[str, JobRecord]:
    """Every job's record, as committed (the last one per job)."""
    records = read_committed(common, registry_topic(common), timeout_s=timeout_s)
    return {key.decode(): JobRecord.decode(value) for (_p, key), value in latest_by_key(records).items()}


class RegistryWriter:
    """``with RegistryWriter(common) as registry: registry.records ...; registry.write(record)``:
    the records as they stand once this writer holds the registry, and changes committed
    together when the block ends without an exception."""

    def __init__(self, common: CommonSettings) -> None:
        self._common = common
        self._producer: Producer | None = None
        self.records: dict[str, JobRecord] = {}
        self._pending: list[JobRecord] = []

    def __enter__(self) -> RegistryWriter:
        self._producer = clients.transactional_producer(
            self._common, f"{self._common.topic_prefix}onceflow-jobs-registry", **{"linger.ms": 0}
        )
        self._producer.init_transactions(30)
        self.records = read_registry(self._common)
        return self

    def write(self, record: JobRecord) -> None:
        self._pending.append(record)
        self.records[record.job] = record

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        producer, self._producer = self._producer, None
        if producer is None or kind is not None or not self._pending:
            return
        try:
            producer.begin_transaction()
            for record in self._pending:
                producer.produce(registry_topic(self._common), key=record.job.encode(), value=record.encode())
            producer.commit_transaction(30)
        except KafkaException as error:
            if error.args and getattr(error.args[0], "fatal", lambda: False)():
                raise ConcurrentChange(
                    "another `onceflow job` command changed the registry meanwhile; nothing was changed: run it again"
                ) from error
            raise
        log.info("registry: %s", ", ".join(f"{r.job} (live {r.live_name})" for r in self._pending))

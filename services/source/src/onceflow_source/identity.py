"""The source's identity rules around the loop's intake (a consumer group on the pipeline's
cluster, or ``source.offsets`` for a topic on another cluster):

- every position it stores carries the id of the topic it was read from (``positions.py``);
- at every assignment, and at every resync, each partition resumes where ``positions.resume_at``
  decides, never where librdkafka's ``auto.offset.reset`` would put it (it is ``error``: a position
  that falls out of range while the source runs stops that partition with the error logged, and
  the next start decides);
- before a batch's positions join its transaction, the topic's id is read again. If it is no
  longer the id the batch's records were mapped with, the topic was deleted (and maybe created
  again) since: the source exits for a restart before that transaction commits, and starts
  again under the new id. The records were consumed before the check, so a check that still
  finds the old id proves they are the old topic's;
- while no batch comes (a recreated topic leaves every partition out of range, and
  ``auto.offset.reset=error`` stops them), the id is read every ``IDLE_CHECK_S`` too, so a
  running source restarts under the new id instead of waiting for a restart nobody asks for."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from onceflow.kafka.topic_ids import read_topic_id
from onceflow.txn.driver import Intake, Rebalance
from onceflow.txn.errors import ConsumerStuck
from onceflow.txn.producer import TransactionalProducer
from onceflow_client.kafka_identity import KafkaOrigin

from onceflow_source.positions import PositionRefused, Resume, position_metadata, resume_at

log = logging.getLogger(__name__)
_WATERMARK_TIMEOUT_S = 10.0
IDLE_CHECK_S = 5.0


class TopicRecreated(ConsumerStuck):
    """The topic's id changed under a running source: it exits for a restart (exit 4)."""


class IdentityIntake:
    """``inner`` with the identity rules (module docstring); the loop's ``intake``."""

    def __init__(self, inner: Intake, admin: AdminClient, topic: str, origin: KafkaOrigin) -> None:
        self.inner = inner
        self._admin = admin
        self._topic = topic
        self._origin = origin
        self._metadata = position_metadata(origin.topic_id)
        self._said: set[tuple[int, int, str]] = set()  # (partition, stored, note) already logged
        self.stop = threading.Event()  # the loop's, once it is built
        self._next_idle_check = time.monotonic() + IDLE_CHECK_S

    # -- Intake ----------------------------------------------------------------------------

    def open(self, overrides: dict[str, Any], on_assign: Rebalance, on_revoke: Rebalance) -> Consumer:
        def assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self.check_topic_id()
            resumed = self.committed(consumer, partitions, self.stop)
            on_assign(consumer, partitions if resumed is None else resumed)

        return self.inner.open({**overrides, "auto.offset.reset": "error"}, assign, on_revoke)

    def observe(self, consumer: Consumer) -> None:
        self.inner.observe(consumer)
        now = time.monotonic()
        if now >= self._next_idle_check:
            self._next_idle_check = now + IDLE_CHECK_S
            self.check_topic_id()

    def send(self, producer: TransactionalProducer, consumer: Consumer, offsets: list[TopicPartition]) -> None:
        self.check_topic_id()
        self._next_idle_check = time.monotonic() + IDLE_CHECK_S
        tagged = [TopicPartition(tp.topic, tp.partition, tp.offset, self._metadata) for tp in offsets]
        self.inner.send(producer, consumer, tagged)

    def committed(
        self, consumer: Consumer, partitions: list[TopicPartition], stop: threading.Event
    ) -> list[TopicPartition] | None:
        stored = self.inner.committed(consumer, partitions, stop)
        if stored is None:
            return None
        return [self._resume(consumer, tp) for tp in stored]

    # -- the rules -------------------------------------------------------------------------

    def check_topic_id(self) -> None:
        """Raise TopicRecreated if the topic's id is no longer the one records are mapped with.
        A topic deleted and not created again yet is left to the consumer (it has nothing new
        to read); a broker without topic ids has nothing to compare."""
        if not self._origin.topic_id:
            return
        try:
            now = read_topic_id(self._admin, self._topic)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return
            raise
        if now and now != self._origin.topic_id:
            raise TopicRecreated(f"topic {self._topic} was recreated (id {self._origin.topic_id} -> {now}) while the "
                                 f"source copied it: exiting, to start again under its new identity")

    def _resume(self, consumer: Consumer, tp: TopicPartition) -> TopicPartition:
        low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=_WATERMARK_TIMEOUT_S)
        try:
            resume = resume_at(tp.topic, tp.partition, tp.offset, tp.metadata, self._origin.topic_id, low, high)
        except PositionRefused as exc:
            log.error("source: %s", exc)
            raise ConsumerStuck(str(exc)) from None
        self._say(tp, resume)
        return TopicPartition(tp.topic, tp.partition, resume.offset)

    def _say(self, tp: TopicPartition, resume: Resume) -> None:
        said = (tp.partition, tp.offset, resume.note)
        if resume.note and said not in self._said:  # the loop asks again on resync: say it once
            self._said.add(said)
            log.log(resume.level, "source: %s", resume.note)

"""A consumer group's committed offsets, asked for as every consume/commit cycle needs them
(the shared loop's resync, the sink's assignment and rewind), with one rule for a consumer
that cannot get an answer: ``ConsumerStuck``, which ends the process with exit 4."""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer, KafkaException, TopicPartition

from onceflow.txn.errors import ConsumerStuck

log = logging.getLogger(__name__)

# Tries of 10 s each. Seen after a broker was killed mid-transaction: one consumer timed out on
# every call for minutes while a fresh consumer of the same group answered in 70 ms, so past
# these a new process is the cure (docs/architecture.md, "One transactional hop").
COMMITTED_TRIES = 6
TRY_TIMEOUT_S = 10.0


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], stop: threading.Event, tries: int | None = None,
) -> list[TopicPartition] | None:
    """The group's committed offsets of ``partitions``; None if ``stop`` was set meanwhile.
    Raises ConsumerStuck after ``tries`` (default ``COMMITTED_TRIES``) failed calls."""
    tries = tries or COMMITTED_TRIES
    for attempt in range(1, tries + 1):
        try:
            return consumer.committed(partitions, timeout=TRY_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("fetching committed offsets (try %d of %d): %s", attempt, tries, exc)
            if stop.wait(1.0):
                return None
    raise ConsumerStuck(f"no committed offsets for {sorted(p.partition for p in partitions)} after {tries} tries")

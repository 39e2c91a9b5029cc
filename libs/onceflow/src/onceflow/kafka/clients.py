"""Client factories. Every consumer is read_committed with auto-commit off; every producer
that writes onceflow topics is transactional (hence idempotent), except in the at-least-once
mode that only exists to be measured against."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient

from onceflow.config import CommonSettings

log = logging.getLogger(__name__)


def _recovery(common: CommonSettings) -> dict[str, str]:
    """ONCEFLOW_KAFKA_METADATA_RECOVERY (docs/decisions/0001-kafka-version.md), and the security
    settings (ONCEFLOW_KAFKA_SECURITY_PROTOCOL ...) every client needs."""
    return {"metadata.recovery.strategy": common.kafka_metadata_recovery, **common.kafka_client_config()}


def plain_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """For a client outside the services (infra checks, fault injection, benches) that names
    its brokers itself: the security settings from the environment still apply."""
    return {"bootstrap.servers": bootstrap, **CommonSettings().kafka_client_config(), **overrides}


def _log_error(err: Any) -> None:
    # librdkafka reports transient broker trouble (e.g. a restarting broker) here and retries on
    # its own; it is worth a log line, not an exception.
    log.warning("kafka client: %s", err)


def consumer(common: CommonSettings, group_id: str, **overrides: Any) -> Consumer:
    config: dict[str, Any] = {
        "bootstrap.servers": common.kafka_bootstrap,
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "error_cb": _log_error,
        **_recovery(common),
    }
    config.update(overrides)
    return Consumer(config)


def reader(common: CommonSettings, **overrides: Any) -> Consumer:
    """A group-less read_committed consumer for assign()-style reads (restore, checks). The
    broker answers a fetch with nothing new after ``fetch.wait.max.ms``, and a restore ends on
    the EOFs of those empty answers: 500 ms (the default) per round made restoring an empty
    changelog take 1.5-2 s of every start. A fetch with data returns at once either way."""
    return consumer(
        common,
        group_id="onceflow-reader",
        **{"enable.partition.eof": True, "fetch.wait.max.ms": 50, **overrides},
    )


def consume_ready(consumer: Consumer, most: int, timeout_s: float) -> list[Message]:
    """Up to ``most`` messages: waits up to ``timeout_s`` for a first one, then takes only what
    the consumer already holds. ``consume(most, timeout)`` itself waits until it has ``most`` or
    the timeout passes, which held every idle stream's next message back by the whole timeout
    (ingest's PROCESSED replies waited up to 200 ms for it)."""
    first = consumer.consume(num_messages=1, timeout=timeout_s)
    if not first or most <= 1:
        return first
    return first + consumer.consume(num_messages=most - 1, timeout=0)


# A transaction begun within a millisecond or two of the last commit finds the coordinator still
# writing that commit's markers: it answers AddOffsetsToTxn with CONCURRENT_TRANSACTIONS and
# librdkafka retries after retry.backoff.ms, 100 by default. Back-to-back transactions (a hop
# under load; the sink's one per partition) then waited about 100 ms each in
# send_offsets_to_transaction (58.7% of the sink's wall time at 6,700 records/s), against 2-7 ms
# with 1-5 ms. Backoffs still double on repeated failures, up to retry.backoff.max.ms (1 s).
TRANSACTION_RETRY_BACKOFF_MS = 5


def transactional_producer(common: CommonSettings, transactional_id: str, **overrides: Any) -> Producer:
    config: dict[str, Any] = {
        "bootstrap.servers": common.kafka_bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": common.transaction_timeout_ms,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "retry.backoff.ms": TRANSACTION_RETRY_BACKOFF_MS,
        "error_cb": _log_error,
        **_recovery(common),
    }
    config.update(overrides)
    return Producer(config)


def idempotent_producer(common: CommonSettings, **overrides: Any) -> Producer:
    """No transactions (the at-least-once mode): idempotence still keeps a retried send from
    writing twice, so what differs from exactly-once is only the transaction."""
    config: dict[str, Any] = {
        "bootstrap.servers": common.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "error_cb": _log_error,
        **_recovery(common),
    }
    config.update(overrides)
    return Producer(config)


def admin(common: CommonSettings, **overrides: Any) -> AdminClient:
    # log_level 4: warnings and errors. At 6 every short-lived admin client (a lag check, a
    # command's lookups) printed librdkafka's notice about its background queue as it was freed.
    return AdminClient({"bootstrap.servers": common.kafka_bootstrap, "log_level": 4, **_recovery(common), **overrides})

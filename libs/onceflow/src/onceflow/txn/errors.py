"""The error classes of a Kafka transaction, decided in one place (docs/architecture.md, "One
transactional hop")."""

from __future__ import annotations

import enum

from confluent_kafka import KafkaError, KafkaException


class TxnErrorClass(enum.Enum):
    RETRIABLE = "retriable"  # retry the same call
    ABORTABLE = "abortable"  # abort, drop the overlay, seek back to committed offsets
    FATAL = "fatal"  # fenced or broken: this instance is a zombie, exit non-zero
    INDEFINITE = "indefinite"  # outcome unknown (timeout): recreate the producer


# Codes that mean another instance owns our transactional.id (or group generation) now.
FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class FencedError(RuntimeError):
    """This instance was fenced by a newer one; it must stop without writing anything else."""


# Process exit codes of every service on the shared core.
EXIT_OK = 0
EXIT_FENCED = 3
EXIT_RESTART = 4  # stuck beyond what this process can repair: a supervisor starts a new one


class ConsumerStuck(RuntimeError):
    """The consumer cannot say where its group stands however long it tries: no committed
    offsets (``txn.offsets``: seen after a broker was killed mid-transaction, while a fresh
    consumer of the same group answered at once), or no place in its group (``txn.membership``:
    seen after a broker restart under load). Only a new process recovers; the supervisor
    starts one."""


class IndefiniteOutcome(RuntimeError):
    """A commit or abort whose result cannot be known (it timed out): recreate the producer."""


def kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def classify(exc: BaseException) -> TxnErrorClass:
    err = kafka_error(exc)
    if err is None:
        return TxnErrorClass.ABORTABLE
    if err.code() in FENCED_CODES:
        return TxnErrorClass.FATAL
    if err.fatal():
        # Fatal for this producer object, not a newer owner (e.g. INVALID_TXN_STATE after a
        # broker restart): only a new producer helps, and its init_transactions settles the
        # old transaction. A real zombie still meets a fencing code on its next call.
        return TxnErrorClass.INDEFINITE
    if err.txn_requires_abort():
        return TxnErrorClass.ABORTABLE
    if err.code() == KafkaError._TIMED_OUT:
        return TxnErrorClass.INDEFINITE
    if err.retriable():
        return TxnErrorClass.RETRIABLE
    return TxnErrorClass.ABORTABLE

"""TransactionalProducer.transact: the one ladder from a failed transaction to what happened
(pure logic: the producer's calls are stand-ins)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from onceflow.txn.errors import FencedError, IndefiniteOutcome
from onceflow.txn import producer as producer_module
from onceflow.txn.producer import CallWatchdog, TransactionalProducer, TxnOutcome


class _Calls(TransactionalProducer):
    """The ladder of TransactionalProducer with its Kafka calls recorded, not made."""

    def __init__(self, commit_error: Exception | None = None, abort_error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self._commit_error, self._abort_error = commit_error, abort_error

    def begin(self) -> None:
        self.calls.append("begin")

    def commit(self) -> None:
        self.calls.append("commit")
        if self._commit_error is not None:
            raise self._commit_error

    def abort(self) -> None:
        self.calls.append("abort")
        if self._abort_error is not None:
            raise self._abort_error

    def recreate(self) -> None:
        self.calls.append("recreate")


def _abortable() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "not delivered", txn_requires_abort=True))


def test_a_committed_transaction_returns_the_bodys_value() -> None:
    producer = _Calls()
    result = producer.transact(lambda: 42)
    assert result.committed and result.value == 42 and result.error is None
    assert producer.calls == ["begin", "commit"]


def test_an_abortable_error_in_the_body_aborts_and_never_commits() -> None:
    producer = _Calls()

    def body() -> None:
        raise _abortable()

    result = producer.transact(body)
    assert result.outcome is TxnOutcome.ABORTED and isinstance(result.error, KafkaException)
    assert producer.calls == ["begin", "abort"]


def test_an_unknown_commit_outcome_recreates_the_producer_instead_of_aborting() -> None:
    producer = _Calls(commit_error=IndefiniteOutcome("commit timed out"))
    result = producer.transact(lambda: None)
    assert result.outcome is TxnOutcome.UNKNOWN and not result.committed
    assert producer.calls == ["begin", "commit", "recreate"]


@pytest.mark.parametrize("where", ["commit", "abort"])
def test_a_fence_is_not_an_outcome_it_propagates(where: str) -> None:
    fenced = FencedError("a newer instance owns this transactional.id")
    producer = _Calls(commit_error=fenced if where == "commit" else _abortable(), abort_error=fenced)
    with pytest.raises(FencedError):
        producer.transact(lambda: None)


def _timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to add offsets to transaction: Local: Timed out", retriable=True))


def _fenced() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True))


def _calls(*answers: Exception | None) -> tuple[TransactionalProducer, list[int], Callable[[], None]]:
    """A producer whose call answers with ``answers`` in turn (None: returns)."""
    producer = TransactionalProducer.__new__(TransactionalProducer)
    producer._timeout, producer._watchdog = 1.0, CallWatchdog("test")
    made: list[int] = []

    def call() -> None:
        made.append(1)
        answer = answers[len(made) - 1]
        if answer is not None:
            raise answer

    return producer, made, call


def test_a_zombie_frozen_mid_call_resumes_it_and_hears_it_is_fenced() -> None:
    # Seen in the zombie test: SIGSTOPped inside send_offsets, the call timed out on SIGCONT;
    # taken as an unknown outcome, the zombie recreated its producer and fenced its replacement.
    for ends_transaction in (False, True):
        producer, made, call = _calls(_timed_out(), _fenced())
        with pytest.raises(FencedError):
            producer._call(call, retry=True, indefinite_on_retriable=ends_transaction)
        assert len(made) == 2


def test_a_timeout_is_an_unknown_outcome_only_for_the_calls_that_end_a_transaction() -> None:
    producer, made, call = _calls(_timed_out(), _timed_out())
    with pytest.raises(IndefiniteOutcome):
        producer._call(call, retry=True, indefinite_on_retriable=True)  # commit, abort
    producer, made, call = _calls(_timed_out(), _timed_out())
    with pytest.raises(KafkaException):  # send_offsets: no EndTxn sent, so abortable
        producer._call(call, retry=True)
    producer, made, call = _calls(_timed_out(), None)
    producer._call(call, retry=True)  # resumed, and it went through
    assert len(made) == 2


class _Librdkafka:
    """Stands in for confluent_kafka.Producer: commit_transaction answers with ``answers`` in turn."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers, self.commits = list(answers), 0

    def commit_transaction(self, _timeout: float) -> None:
        self.commits += 1
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer

    def poll(self, _timeout: float) -> int:
        return 0


def _producer_over(librdkafka: _Librdkafka) -> TransactionalProducer:
    producer = TransactionalProducer.__new__(TransactionalProducer)
    producer._timeout, producer._watchdog, producer._stop = 1.0, CallWatchdog("test"), threading.Event()
    producer._producer = librdkafka  # type: ignore[assignment]
    producer.recreated = 0
    return producer


def test_a_commit_that_times_out_is_resumed_until_it_answers_never_replaced_mid_call() -> None:
    # Replacing the producer while its EndTxn was in flight aborted ingest across a broker
    # restart (librdkafka: rd_kafka_enq_once_del_source_return); resumed, the answer is known.
    librdkafka = _Librdkafka(_timed_out(), _timed_out(), _timed_out(), _timed_out(), None)
    producer = _producer_over(librdkafka)
    producer.commit()
    assert librdkafka.commits == 5 and producer.recreated == 0


def test_a_commit_unanswered_past_the_resumes_exits_for_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer_module, "_RESUME_S", 0.0)
    librdkafka = _Librdkafka(*[_timed_out()] * 10)
    producer = _producer_over(librdkafka)

    def give_up(why: str) -> None:
        raise SystemExit(why)

    monkeypatch.setattr(producer._watchdog, "give_up", give_up)
    with pytest.raises(SystemExit, match="commit_transaction still unanswered"):
        producer.commit()
    assert producer.recreated == 0


def test_a_commit_whose_records_timed_out_is_aborted_not_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broker away past transaction.timeout.ms: the records in flight time out and every commit
    # answers at once with the same _TIMED_OUT, which requires an abort. Taken for a call to
    # resume, it spun for 90 s and exited 4 (a broker-restart test: 776,000 resumes).
    undelivered = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "20 message(s) timed out on t.dedup.changelog [2]", txn_requires_abort=True)
    )
    librdkafka = _Librdkafka(*[undelivered] * 10)
    producer = _producer_over(librdkafka)
    monkeypatch.setattr(producer._watchdog, "give_up", lambda why: pytest.fail(f"gave up: {why}"))
    with pytest.raises(KafkaException) as raised:
        producer.commit()
    assert raised.value is undelivered and librdkafka.commits == 1

    aborted = _Calls(commit_error=undelivered)
    assert aborted.transact(lambda: None).outcome is TxnOutcome.ABORTED
    assert aborted.calls == ["begin", "commit", "abort"]


def test_a_commit_refused_outright_is_still_an_unknown_outcome() -> None:
    fatal = KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "broker restarted", fatal=True))
    producer = _producer_over(_Librdkafka(fatal))
    with pytest.raises(IndefiniteOutcome):
        producer.commit()

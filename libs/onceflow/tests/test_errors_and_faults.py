"""Error classification and fault-rule parsing: pure, no broker."""

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow import faults
from onceflow.codec import DecodeError, decode_envelope, encode_envelope, new_id
from onceflow.txn.errors import ConsumerStuck, TxnErrorClass, classify
from onceflow.v1.envelope_pb2 import Envelope

pytestmark = pytest.mark.foundation


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (KafkaError(KafkaError._FENCED, fatal=True), TxnErrorClass.FATAL),
        (KafkaError(KafkaError.PRODUCER_FENCED), TxnErrorClass.FATAL),
        (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH), TxnErrorClass.FATAL),
        # Fatal for the producer object after a broker restart, but nobody fenced us: recreate.
        (KafkaError(KafkaError.INVALID_TXN_STATE, fatal=True), TxnErrorClass.INDEFINITE),
        (KafkaError(KafkaError._STATE, txn_requires_abort=True), TxnErrorClass.ABORTABLE),
        (KafkaError(KafkaError._TIMED_OUT, retriable=True), TxnErrorClass.INDEFINITE),
        (KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True), TxnErrorClass.RETRIABLE),
        (KafkaError(KafkaError.UNKNOWN), TxnErrorClass.ABORTABLE),
    ],
)
def test_classify(error, expected):
    assert classify(KafkaException(error)) is expected


def test_fault_rules_count_hits():
    faults.reload("after_produce@3")
    try:
        assert faults._rules.at_hit == {"after_produce": 3}
        faults.point("after_produce")
        faults.point("after_produce")
        assert faults._rules.hits["after_produce"] == 2
    finally:
        faults.reload("")


def test_fault_stop_action_parses():
    import signal

    faults.reload("after_commit@15:stop,before_produce@2")
    try:
        assert faults._rules.at_hit == {"after_commit": 15, "before_produce": 2}
        assert faults._rules.signal_at == {"after_commit": signal.SIGSTOP, "before_produce": signal.SIGKILL}
    finally:
        faults.reload("")


def test_fault_random_rule_parses_probability_and_seed():
    faults.reload("random@0.25@7")
    try:
        assert faults._rules.probability == 0.25
    finally:
        faults.reload("")


def test_envelope_round_trip_and_poison():
    envelope = Envelope(record_id="r-1", root_id=new_id(), edge_id=new_id(), attempt=1, key=b"k", payload=b"p")
    assert decode_envelope(encode_envelope(envelope)) == envelope
    with pytest.raises(DecodeError):
        decode_envelope(b"\xff\xff not protobuf")
    with pytest.raises(DecodeError):
        decode_envelope(None)
    with pytest.raises(DecodeError):
        decode_envelope(Envelope(payload=b"no id").SerializeToString())


def test_new_id_is_never_zero():
    assert all(new_id() != 0 for _ in range(1000))


class _ConsumerThatNeverAnswers:
    """What a librdkafka consumer did after the broker was killed mid-transaction: every
    committed() timed out, for minutes, while a fresh consumer of the group answered at once."""

    def __init__(self) -> None:
        self.calls = 0

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", 0), TopicPartition("t", 1)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets: Local: Timed out"))


def test_a_consumer_stuck_without_its_committed_offsets_ends_the_loop_for_a_restart(monkeypatch) -> None:
    from onceflow.config import CommonSettings, LoopSettings
    from onceflow.txn import loop as loop_module
    from onceflow.txn import offsets

    monkeypatch.setattr(offsets, "COMMITTED_TRIES", 2)
    hop = loop_module.TransactionalLoop(
        stage=type("Nothing", (), {"name": "nothing", "process": lambda self, batch: None})(),
        common=CommonSettings(), settings=LoopSettings(), input_topic="t", group_id="g", transactional_id="x",
        dlq_topic="d",
    )
    consumer = _ConsumerThatNeverAnswers()
    hop._consumer = consumer  # type: ignore[assignment]
    with pytest.raises(ConsumerStuck, match="after 2 tries"):
        hop._resync()
    assert consumer.calls == 2

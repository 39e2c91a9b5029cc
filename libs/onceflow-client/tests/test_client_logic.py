"""The client's pure parts: what a record may be, how a refusal is reported, what a tail's
snapshot keeps. Against a pipeline: tests/test_client.py."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow.v1.results_pb2 import ResultChange
from onceflow_client import RecordsRejected, ResultsTail, TailSnapshot, to_record
from onceflow_client import tail as tail_module
from onceflow_client.ingest import RetryPolicy, _Retries


def test_a_dict_a_json_record_and_a_protobuf_are_the_same_record() -> None:
    as_dict = {"record_id": "o-1", "key": "u1", "payload": {"user": "u1", "amount": 5}, "event_time_ms": 7, "headers": {"h": "v"}}
    expected = IngestRecord(
        record_id=b"o-1", key=b"u1", payload=b'{"user":"u1","amount":5}', event_time_ms=7, headers={"h": "v"}
    )
    assert to_record(as_dict) == expected
    assert to_record(json.dumps(as_dict).encode()) == expected
    assert to_record(expected) is expected


def test_a_record_is_in_the_clients_stream_unless_it_names_its_own() -> None:
    assert to_record({"record_id": "a"}, "orders").stream == b"orders"
    assert to_record({"record_id": "a", "stream": "payments"}, "orders").stream == b"payments"
    assert to_record({"record_id": "a"}).stream == b""
    proto = IngestRecord(record_id=b"a")
    assert to_record(proto, "orders").stream == b"orders" and proto.stream == b""  # the caller's is left alone
    named = IngestRecord(record_id=b"a", stream=b"payments")
    assert to_record(named, "orders") is named


@given(st.binary(min_size=1, max_size=64), st.binary(max_size=64), st.binary(max_size=256))
def test_bytes_fields_pass_through_unchanged(record_id: bytes, key: bytes, payload: bytes) -> None:
    record = to_record({"record_id": record_id, "key": key, "payload": payload})
    assert (record.record_id, record.key, record.payload) == (record_id, key, payload)


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        ({"key": "u1"}, ValueError, "record_id: missing"),
        ({"record_id": "a", "colour": "red"}, ValueError, "unknown record fields ['colour']"),
        ({"record_id": 5}, TypeError, "record_id: want str or bytes"),
        ({"record_id": "a", "event_time_ms": "soon"}, TypeError, "event_time_ms: want an int"),
        ({"record_id": "a", "headers": {"h": 1}}, TypeError, "headers: want a dict of str to str"),
        (b"[1, 2]", ValueError, "a JSON record is an object"),
        (b"{not json", ValueError, "not a JSON record"),
        (42, TypeError, "a record is an IngestRecord, a dict or JSON bytes"),
    ],
)
def test_a_malformed_record_is_refused_naming_its_field(value: object, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=None) as raised:
        to_record(value)  # type: ignore[arg-type]
    assert says in str(raised.value)


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


def test_an_invalid_argument_names_the_record_and_is_not_retried() -> None:
    records = [IngestRecord(record_id=b"ok"), IngestRecord(record_id=b"x" * 300)]
    failure = _Failure(grpc.StatusCode.INVALID_ARGUMENT, "records[1].record_id: 300 bytes, at most 256")
    with pytest.raises(RecordsRejected) as raised:
        _Retries(RetryPolicy()).next_wait(failure, records)
    [rejection] = raised.value.rejections
    assert (rejection.index, rejection.field, rejection.record_id) == (1, "record_id", b"x" * 300)
    assert rejection.message == "300 bytes, at most 256"


def test_retriable_codes_back_off_honour_retry_after_and_give_up() -> None:
    retries = _Retries(RetryPolicy(max_attempts=3, backoff_s=0.1, max_backoff_s=0.15))
    busy = _Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", (("retry-after-ms", "500"),))
    assert retries.next_wait(busy, []) == 0.5
    assert retries.next_wait(_Failure(grpc.StatusCode.UNAVAILABLE, "restarting"), []) == 0.15
    with pytest.raises(grpc.RpcError):
        retries.next_wait(_Failure(grpc.StatusCode.UNAVAILABLE, "restarting"), [])
    with pytest.raises(grpc.RpcError):
        _Retries(RetryPolicy()).next_wait(_Failure(grpc.StatusCode.PERMISSION_DENIED, "no"), [])


def test_a_tail_snapshot_survives_json() -> None:
    snapshot = TailSnapshot({"u1": b'{"total":5}', "<b>": b"\x00\xff"}, {0: 12, 3: 7})
    assert TailSnapshot.from_json(snapshot.to_json()) == snapshot


class _Message:
    def __init__(self, partition: int, offset: int, change: ResultChange) -> None:
        self._partition, self._offset, self._value = partition, offset, change.SerializeToString()

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "compute.results"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class _Interrupted(Exception):
    pass


def _tail_over(messages: list[_Message], interrupt_at: int | None = None) -> ResultsTail:
    """A ResultsTail whose consumer hands out ``messages`` once; with ``interrupt_at``, a Ctrl-C
    arrives as the table takes that change (the fold is where it can land)."""
    tail = ResultsTail.__new__(ResultsTail)
    tail.job, tail.version, tail.topic, tail.partitions = "j", "j", "compute.results", [0]
    tail._registry, tail._switch_to = None, None
    tail._positions, tail._at_end = {}, set()

    class Table(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: str, value: bytes) -> None:
            if interrupt_at is not None and len(tail._positions) and tail._positions[0] == interrupt_at:
                raise _Interrupted
            super().__setitem__(key, value)

    tail.table = Table()
    tail._consumer = type("C", (), {"consume": lambda _self, num_messages, timeout: messages})()
    return tail


def test_a_tail_interrupted_mid_fold_resumes_without_skipping_the_change() -> None:
    upsert = ResultChange.UPSERT
    messages = [_Message(0, o, ResultChange(job="j", key=f"k{o}", value=b"v", op=upsert)) for o in range(3)]
    tail = _tail_over(messages, interrupt_at=1)
    with pytest.raises(_Interrupted):
        tail.poll()
    snapshot = TailSnapshot(dict(tail.table), dict(tail._positions))
    assert snapshot.positions == {0: 1} and set(snapshot.table) == {"k0"}  # k1 is read again on resume


def test_changes_ends_only_after_the_whole_idle_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000))
    monkeypatch.setattr(tail_module.time, "monotonic", lambda: float(next(clock)))
    tail = _tail_over([])
    tail._at_end = {0}
    polls: list[float] = []
    monkeypatch.setattr(tail, "poll", lambda timeout_s: polls.append(timeout_s) or [])
    assert list(tail.changes(idle_timeout_s=5)) == []
    assert len(polls) == 5  # one fake second per poll: five polls before five quiet seconds


class _FakeKafka:
    """confluent_kafka as ResultsTail's constructor uses it, over a broker holding ``topics``
    (each with one partition); records which topic was assigned and whether it was closed."""

    OFFSET_BEGINNING = -2

    def __init__(self, *topics: str) -> None:
        self.topics, self.assigned, self.closed = topics, [], False
        fake = self

        class Consumer:
            def __init__(self, _config: dict[str, str]) -> None:
                pass

            def list_topics(self, name: str, timeout: float) -> object:
                found = {name: type("T", (), {"error": None, "partitions": {0: None}})()} if name in fake.topics else {}
                return type("M", (), {"topics": found})()

            def assign(self, partitions: list[tuple[str, int, int]]) -> None:
                fake.assigned = partitions

            def close(self) -> None:
                fake.closed = True

        self.Consumer = Consumer

    @staticmethod
    def TopicPartition(topic: str, partition: int, offset: int) -> tuple[str, int, int]:  # noqa: N802 - confluent_kafka's name
        return topic, partition, offset


def test_a_tail_with_no_prefix_given_follows_onceflow_topic_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 45: a tail built like the docs' example, on a pipeline run with a prefix, read the
    # unprefixed topic and saw 0 changes, quietly.
    kafka = _FakeKafka("run7.compute.results", "compute.results")
    monkeypatch.setattr(tail_module, "_kafka", lambda: kafka)
    monkeypatch.setenv("ONCEFLOW_TOPIC_PREFIX", "run7.")
    with ResultsTail("broker:9092", "j") as tail:
        assert tail.topic == "run7.compute.results"
        assert kafka.assigned == [("run7.compute.results", 0, _FakeKafka.OFFSET_BEGINNING)]
    # An explicit prefix still wins over the environment, "" included.
    assert ResultsTail("broker:9092", "j", topic_prefix="").topic == "compute.results"
    monkeypatch.delenv("ONCEFLOW_TOPIC_PREFIX")
    assert ResultsTail("broker:9092", "j").topic == "compute.results"


def test_an_async_tail_is_an_async_context_manager_that_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = _FakeKafka("compute.results")
    monkeypatch.setattr(tail_module, "_kafka", lambda: kafka)
    monkeypatch.delenv("ONCEFLOW_TOPIC_PREFIX", raising=False)

    async def use() -> bool:
        async with tail_module.AsyncResultsTail("broker:9092", "j") as tail:
            assert tail.table == {}
            return kafka.closed

    assert asyncio.run(use()) is False  # open inside the block
    assert kafka.closed


def test_a_client_given_no_address_finds_its_service_in_the_services_file(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from onceflow_client import IngestClient, QueryClient
    from onceflow_client.addresses import SERVICES_CONFIG_ENV

    monkeypatch.delenv(SERVICES_CONFIG_ENV, raising=False)
    with IngestClient() as ingest, QueryClient() as query:
        assert (ingest.address, query.address) == ("127.0.0.1:15051", "127.0.0.1:15055")
    config = tmp_path / "services.toml"
    config.write_text('[[service]]\nname = "ingest"\naddress = "10.0.0.7:25051"\n\n[[service]]\nname = "sink"\naddress = "10.0.0.8:25055"\n')
    monkeypatch.setenv(SERVICES_CONFIG_ENV, str(config))
    with IngestClient() as ingest, QueryClient() as query, IngestClient("h:1") as named:
        assert (ingest.address, query.address, named.address) == ("10.0.0.7:25051", "10.0.0.8:25055", "h:1")


def test_a_servers_retry_after_hint_is_bounded_and_a_bad_one_ignored() -> None:
    """Issue 39: the client obeyed any retry-after-ms, so a server could park it for hours."""
    retries = _Retries(RetryPolicy(backoff_s=0.1, max_retry_after_s=30))
    assert retries.next_wait(_Failure(grpc.StatusCode.UNAVAILABLE, "x", (("retry-after-ms", str(10**9)),)), []) == 30
    assert retries.next_wait(_Failure(grpc.StatusCode.UNAVAILABLE, "x", (("retry-after-ms", "soon"),)), []) == 0.2
    assert retries.next_wait(_Failure(grpc.StatusCode.UNAVAILABLE, "x", (("retry-after-ms", "-5"),)), []) == 0.4

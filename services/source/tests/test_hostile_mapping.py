"""A poison record never stalls the source (issue 39, item 10): whatever bytes a record holds,
the mapping maps it or raises an ``Unmappable`` with the reason, which the stage dead-letters;
no other exception escapes to fail (and retry) the whole batch forever."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.spout import Limits
from onceflow.txn.batch import Batch
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow_source import mapping as mapping_module
from onceflow_source.mapping import Mapping, MappingFailed, SourceRecord, Unmappable, Unparsable, map_record
from onceflow_source.stage import SourceStage

from .test_stage import FakeMessage

pytestmark = [pytest.mark.source, pytest.mark.hostile]

LIMITS = Limits(max_payload_bytes=1_000_000, max_key_bytes=100)
BY_FIELD = Mapping(LIMITS, id_field="a.b")
DEEP = b"[" * 100_000


def _record(value: bytes | None, key: bytes | None = b"k", headers: list[tuple[str, bytes | None]] | None = None) -> SourceRecord:
    return SourceRecord(topic="orders", partition=0, offset=7, key=key, value=value, headers=headers or [])


def test_a_nesting_bomb_is_unparsable_not_a_recursion_error() -> None:
    with pytest.raises(Unparsable, match="not JSON"):
        map_record(_record(DEEP), BY_FIELD)
    with pytest.raises(Unparsable):
        map_record(_record(b'{"a": ' * 50_000), BY_FIELD)


json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    value=st.none() | st.binary(max_size=300) | json_ish.map(lambda v: repr(v).encode()) | st.integers(1, 3000).map(lambda n: b"[" * n),
    key=st.none() | st.binary(max_size=120),
    headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
    by_field=st.booleans(),
)
def test_any_bytes_map_or_give_a_reason(value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes | None]],
                                        by_field: bool) -> None:
    try:
        map_record(_record(value, key, headers), BY_FIELD if by_field else Mapping(LIMITS))
    except Unmappable as exc:
        assert str(exc)


def test_any_other_failure_in_the_mapping_is_a_dead_letter_and_the_batch_goes_on() -> None:
    messages = [FakeMessage(DEEP, 0), FakeMessage(b'{"a": {"b": "x"}}', 1), FakeMessage(b'{"a": {"b": "boom"}}', 2),
                FakeMessage(b'{"a": {"b": "y"}}', 3)]
    real = mapping_module.check_record

    def fails_on_boom(*args: object, **kwargs: object) -> object:
        if args[1].record_id == b"boom":  # type: ignore[attr-defined]
            raise ArithmeticError("a bug of the mapping's own, on one record")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    batch = Batch(messages, None, "p.source.dlq", "source", "p.acker.acks", 4)  # type: ignore[arg-type]
    with mock.patch.object(mapping_module, "check_record", fails_on_boom):
        SourceStage(BY_FIELD, "p.ingest.records", tree_timeout_ms=None).process(batch)
    assert [r.record.record_id for r in batch.new_roots] == [b"x", b"y"]
    letters = [DeadLetter.FromString(out.value or b"") for out in batch.outputs]
    assert [(d.source_offset, d.error_class) for d in letters] == [(0, "Unparsable"), (2, MappingFailed.__name__)]
    assert letters[1].message.startswith("ArithmeticError: a bug")

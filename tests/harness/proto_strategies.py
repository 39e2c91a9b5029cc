"""Hypothesis strategies built from protobuf descriptors: any message of any wire contract, with
field values that reach the edges (empty, huge, NUL, far-future times, negative counts), so a
fuzzer needs no hand-written strategy per message and follows the protos as they change."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

_T = FieldDescriptor
_INT_RANGES = {
    _T.TYPE_INT32: (-(2**31), 2**31 - 1), _T.TYPE_SINT32: (-(2**31), 2**31 - 1), _T.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _T.TYPE_INT64: (-(2**63), 2**63 - 1), _T.TYPE_SINT64: (-(2**63), 2**63 - 1), _T.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _T.TYPE_UINT32: (0, 2**32 - 1), _T.TYPE_FIXED32: (0, 2**32 - 1),
    _T.TYPE_UINT64: (0, 2**64 - 1), _T.TYPE_FIXED64: (0, 2**64 - 1),
}
# Protobuf strings are UTF-8: no lone surrogates. NUL and the separators onceflow uses are in.
_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.sampled_from(["", "default", "\x00", "a\x00b", "x" * 300, "usersum", "usersum@1", "../..", "dedup.records", "*"]),
)
_BYTES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"{}", b'{"user": "u", "amount": 1}', b"\xff\xfe", b"x" * 70_000, b"\x00" * 10]),
    _TEXT.map(str.encode),
)


def _edges(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(low, high), st.sampled_from(sorted({low, high, 0, 1, max(low, -1), min(high, 2**31)})))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INT_RANGES:
        return _edges(*_INT_RANGES[kind])
    if kind == _T.TYPE_STRING:
        return _TEXT
    if kind == _T.TYPE_BYTES:
        return _BYTES
    if kind == _T.TYPE_BOOL:
        return st.booleans()
    if kind in (_T.TYPE_DOUBLE, _T.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if kind == _T.TYPE_DOUBLE else 32)
    if kind == _T.TYPE_ENUM:
        known = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 1000))  # proto3 enums are open
    raise TypeError(f"no strategy for {field.full_name} (type {kind})")


def messages(descriptor: Descriptor, depth: int = 3) -> st.SearchStrategy[Message]:
    """Any ``descriptor`` message: each field set or not, repeated fields of 0 to 6 values,
    nested messages down to ``depth``."""
    cls = GetMessageClass(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            target = getattr(message, field.name)
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if is_map:
                key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
                for key in draw(st.lists(_scalar(key_field), max_size=4)):
                    if value_field.message_type is None:
                        target[key] = draw(_scalar(value_field))
                    elif depth > 0:
                        target[key].CopyFrom(draw(messages(value_field.message_type, depth - 1)))
            elif field.is_repeated:
                if field.message_type is None:
                    target.extend(draw(st.lists(_scalar(field), max_size=6)))
                elif depth > 0:
                    target.extend(draw(st.lists(messages(field.message_type, depth - 1), max_size=6)))
            elif field.message_type is not None:
                if depth > 0:
                    target.CopyFrom(draw(messages(field.message_type, depth - 1)))
            else:
                setattr(message, field.name, draw(_scalar(field)))
        return message

    return build()

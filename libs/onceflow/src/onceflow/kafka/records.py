"""What a consumed or delivered record always has, typed so.

confluent_kafka types a message's partition, offset and key as optional, since one that carries
an error (an end-of-partition event) may lack them. A record the driver hands on, or a delivery
report without an error, has its partition and offset; a changelog record has its key. These
say so once, and fail loudly if librdkafka ever disagreed.
"""

from __future__ import annotations

from confluent_kafka import Message


def partition_of(message: Message) -> int:
    partition = message.partition()
    if partition is None:
        raise ValueError(f"a record of {message.topic()} without a partition (error: {message.error()})")
    return partition


def offset_of(message: Message) -> int:
    offset = message.offset()
    if offset is None:
        raise ValueError(f"a record of {message.topic()}[{message.partition()}] without an offset")
    return offset


def headers_of(message: Message) -> tuple[tuple[str, bytes | None], ...]:
    """A record's headers as (name, value) pairs; a value may be null. (A consumed record's
    come as such pairs already; the typing allows a dict and str values, as produce takes.)"""
    headers = message.headers() or ()
    pairs = headers.items() if isinstance(headers, dict) else headers
    return tuple((name, value.encode() if isinstance(value, str) else value) for name, value in pairs)


def key_of(message: Message) -> bytes:
    """The key of a record that must have one (a changelog record: the state key)."""
    key = message.key()
    if key is None:
        raise ValueError(f"a record of {message.topic()}[{message.partition()}]@{message.offset()} without a key")
    return key

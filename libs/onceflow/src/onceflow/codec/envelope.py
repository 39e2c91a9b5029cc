"""The record envelope on the wire (proto/onceflow/v1/envelope.proto)."""

from __future__ import annotations

import os
import random
import time

from google.protobuf.message import DecodeError as _ProtoDecodeError

from onceflow.faults import CLOCK_SKEW_ENV
from onceflow.v1.envelope_pb2 import Envelope


class DecodeError(ValueError):
    """A value on a onceflow topic is not an envelope: a poison record."""


# Ids must be unique, not secret: a generator seeded from the OS per process is ~15x cheaper
# than secrets/urandom per call, which matters at one or two ids per record.
_ids = random.Random(os.urandom(32))


def new_id() -> int:
    """A random non-zero uint64: root ids and edge ids. Zero is reserved because XOR with 0 is a no-op."""
    while True:
        value = _ids.getrandbits(64)
        if value:
            return value


# A host clock set wrong on purpose (a test-only switch, refused without the allow setting):
# what a skewed ingest or source host writes as ingest time.
_CLOCK_SKEW_MS = int(os.environ.get(CLOCK_SKEW_ENV, "0") or 0)


def now_ms() -> int:
    """This host's wall clock: good for ingest time and timers, never trusted across hosts (the
    dedup gate's horizon follows the broker's log-append time instead)."""
    return time.time_ns() // 1_000_000 + _CLOCK_SKEW_MS


def encode_envelope(envelope: Envelope) -> bytes:
    return envelope.SerializeToString(deterministic=True)


def decode_envelope(data: bytes | None) -> Envelope:
    if not data:
        raise DecodeError("empty value")
    envelope = Envelope()
    try:
        envelope.ParseFromString(data)
    except _ProtoDecodeError as exc:
        raise DecodeError(f"not an Envelope: {exc}") from exc
    if not envelope.record_id:
        raise DecodeError("envelope without record_id")
    return envelope

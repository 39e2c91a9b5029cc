"""Envelope encoding and the ids that make up a tuple tree."""

from onceflow.codec.envelope import (
    DecodeError,
    decode_envelope,
    encode_envelope,
    new_id,
    now_ms,
)

__all__ = ["DecodeError", "decode_envelope", "encode_envelope", "new_id", "now_ms"]

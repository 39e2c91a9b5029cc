"""The one way a stage talks to the acker. Every message is produced inside the stage's own
transaction, so an ack exists exactly when the processing it reports committed.

- the spout (ingest) sends INIT: the XOR of the edges it emitted, and where the record lives;
- a stage that consumed an envelope sends ACK: its input edge XOR the edges it emitted;
- a stage that gives up on a record sends FAIL with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.codec import now_ms
from onceflow.v1.acker_pb2 import AckerMessage, RecordRef

ACKS_TOPIC = "acker.acks"
EVENTS_TOPIC = "acker.events"

_MASK = (1 << 64) - 1


def root_key(root_id: int) -> bytes:
    """The Kafka key of every acker message and event of a tree: all land in one partition."""
    return root_id.to_bytes(8, "big")


def xor_all(edges: Iterable[int]) -> int:
    value = 0
    for edge in edges:
        value ^= edge
    return value


def next_root_id(root_id: int, attempt: int) -> int:
    """The root id of the replay of ``root_id`` as attempt ``attempt``: derived, not random, so
    whoever saw the old tree time out can follow the record to its next tree (splitmix64)."""
    z = (root_id + 0x9E3779B97F4A7C15 * attempt) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) or 1


def init(root_id: int, edges: Iterable[int], origin: RecordRef, attempt: int, timeout_ms: int) -> tuple[bytes, bytes]:
    message = AckerMessage(
        kind=AckerMessage.INIT, root_id=root_id, xor_value=xor_all(edges), sent_at_ms=now_ms(),
        origin=origin, attempt=attempt, timeout_ms=timeout_ms, stage="ingest",
    )
    return root_key(root_id), message.SerializeToString()


def ack(root_id: int, input_edge: int, child_edges: Iterable[int], stage: str) -> tuple[bytes, bytes]:
    message = AckerMessage(
        kind=AckerMessage.ACK, root_id=root_id, xor_value=input_edge ^ xor_all(child_edges), stage=stage,
        sent_at_ms=now_ms(),
    )
    return root_key(root_id), message.SerializeToString()


def fail(root_id: int, stage: str, reason: str) -> tuple[bytes, bytes]:
    message = AckerMessage(kind=AckerMessage.FAIL, root_id=root_id, stage=stage, reason=reason, sent_at_ms=now_ms())
    return root_key(root_id), message.SerializeToString()

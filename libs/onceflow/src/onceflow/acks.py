"""The one way a stage talks to the acker. Every message is produced inside the stage's own
transaction, so an ack exists exactly when the processing it reports committed.

- the spout (ingest) sends INIT: the XOR of the edges it emitted, and where the record lives;
- a stage that consumed an envelope sends ACK: its input edge XOR the edges it emitted;
- a stage that gives up on a record sends FAIL with the reason.

A tree lives in partition ``root_id mod partitions`` of acker.acks. A transaction's messages
are grouped by that partition into one ``AckerBatch`` record each (``AckBuffer``).
"""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.codec import now_ms
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, RecordRef

_MASK = (1 << 64) - 1


def root_key(root_id: int) -> bytes:
    """The key of a tree in the acker's changelog and of its events."""
    return root_id.to_bytes(8, "big")


def partition_of(root_id: int, partitions: int) -> int:
    """The acker.acks partition (and acker instance) that owns a tree."""
    return root_id % partitions


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


def init(root_id: int, edges: Iterable[int], origin: RecordRef, attempt: int, timeout_ms: int) -> AckerMessage:
    return AckerMessage(
        kind=AckerMessage.INIT, root_id=root_id, xor_value=xor_all(edges), sent_at_ms=now_ms(),
        origin=origin, attempt=attempt, timeout_ms=timeout_ms, stage="ingest",
    )


def ack(root_id: int, input_edge: int, child_edges: Iterable[int], stage: str) -> AckerMessage:
    return AckerMessage(
        kind=AckerMessage.ACK, root_id=root_id, xor_value=input_edge ^ xor_all(child_edges), stage=stage,
        sent_at_ms=now_ms(),
    )


def fail(root_id: int, stage: str, reason: str) -> AckerMessage:
    return AckerMessage(kind=AckerMessage.FAIL, root_id=root_id, stage=stage, reason=reason, sent_at_ms=now_ms())


class AckBuffer:
    """One transaction's acker messages, in order, until they are sealed into one AckerBatch
    record per acker.acks partition."""

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"acker.acks needs at least one partition, got {partitions}")
        self.partitions = partitions
        self.messages: list[AckerMessage] = []

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, message: AckerMessage) -> None:
        self.messages.append(message)

    def truncate(self, length: int) -> None:
        del self.messages[length:]

    def seal(self) -> list[tuple[int, bytes]]:
        """(partition, serialized AckerBatch) per partition with messages; empties the buffer."""
        grouped: dict[int, list[AckerMessage]] = {}
        for message in self.messages:
            grouped.setdefault(message.root_id % self.partitions, []).append(message)
        self.messages = []
        return [(p, AckerBatch(messages=msgs).SerializeToString()) for p, msgs in sorted(grouped.items())]

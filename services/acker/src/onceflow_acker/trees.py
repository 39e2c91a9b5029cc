"""Storm's acker as pure functions over one tree's record. No Kafka, no clock of its own.

A tree is one ingest attempt of a record. Its ``ack_val`` is the XOR of every edge id that has
been emitted or acked so far: INIT adds the edges the spout emitted, each ACK adds the input
edge it consumed and the child edges it emitted. Every edge appears exactly twice (emitted,
acked), so ``ack_val`` returns to 0 exactly when all are acked; a missing ack leaves it non-zero
with probability 1 - 2^-64. XOR commutes, so ACKs may arrive before their INIT; a tree is only
complete once its INIT has been seen.

A group (docs/decisions/0016) is kept the same way: its GROUP message plays the INIT, its value
is the XOR of its outputs' edges, and it lists its members (the trees, or upstream groups, it
continues). When it completes, the acker acks the group id on each member (``Tree.members``).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from onceflow.v1.acker_pb2 import AckerMessage

# ack_val, started_ms, deadline_ms, origin offset, attempt, origin partition, flags; then the
# record_id's UTF-8 bytes (so operators can find a tree by record and see what is stuck), or for
# a group its members' ids, 8 bytes each.
_LAYOUT = struct.Struct("<QqqqIiB")
_INIT_SEEN = 1
_FAILED = 2
_GROUP = 4
_MEMBER = struct.Struct("<Q")
_ACK_VAL = struct.Struct("<Q")
_FLAGS_AT = 40


class Outcome(enum.Enum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"


@dataclass(slots=True)
class Tree:
    ack_val: int = 0
    started_ms: int = 0
    deadline_ms: int = 0
    origin_offset: int = -1
    attempt: int = 0
    origin_partition: int = -1
    init_seen: bool = False
    failed: bool = False
    record_id: str = ""
    group: bool = False
    members: tuple[int, ...] = ()

    def encode(self) -> bytes:
        """41 bytes plus the record_id (or a group's members): a pending tree's whole state, as
        stored and as written to the changelog."""
        flags = (_INIT_SEEN if self.init_seen else 0) | (_FAILED if self.failed else 0) | (_GROUP if self.group else 0)
        header = _LAYOUT.pack(
            self.ack_val, self.started_ms, self.deadline_ms, self.origin_offset, self.attempt, self.origin_partition, flags
        )
        if self.group:
            return header + struct.pack(f"<{len(self.members)}Q", *self.members)
        return header + self.record_id.encode()

    @classmethod
    def decode(cls, data: bytes) -> Tree:
        ack_val, started, deadline, offset, attempt, partition, flags = _LAYOUT.unpack_from(data)
        tail = data[_LAYOUT.size :]
        if flags & _GROUP:
            members = tuple(m for (m,) in _MEMBER.iter_unpack(tail))
            return cls(ack_val, started, deadline, offset, attempt, partition, bool(flags & _INIT_SEEN), False, "", True, members)
        return cls(
            ack_val, started, deadline, offset, attempt, partition, bool(flags & _INIT_SEEN), bool(flags & _FAILED),
            tail.decode(),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    tree: Tree
    reason: str = ""


def apply(
    tree: Tree | None, message: AckerMessage, now_ms: int, default_timeout_ms: int, appended_ms: int = 0,
) -> tuple[Tree | None, Decision | None]:
    """One acker message applied to its tree. Returns the new tree (None once decided) and the
    decision, if this message decided it. ``appended_ms``: the broker's log-append time of the
    message's record, the clock a tree's deadline counts on (0: the writer's ``sent_at_ms``)."""
    if tree is None:
        # The deadline counts from the first message seen; INIT moves it to its own timeout.
        tree = Tree(started_ms=now_ms, deadline_ms=now_ms + default_timeout_ms)
    kind = message.kind
    if kind == AckerMessage.INIT:
        tree.ack_val ^= message.xor_value
        tree.init_seen = True
        tree.started_ms = appended_ms or message.sent_at_ms or tree.started_ms
        tree.deadline_ms = tree.started_ms + (message.timeout_ms or default_timeout_ms)
        tree.attempt = message.attempt
        tree.origin_partition = message.origin.partition
        tree.origin_offset = message.origin.offset
        tree.record_id = message.origin.record_id
    elif kind == AckerMessage.ACK:
        tree.ack_val ^= message.xor_value
    elif kind == AckerMessage.GROUP:
        tree.ack_val ^= message.xor_value
        tree.init_seen = True
        tree.group = True
        tree.members = tuple(message.members)
        tree.started_ms = appended_ms or message.sent_at_ms or tree.started_ms
        tree.deadline_ms = tree.started_ms + (message.timeout_ms or default_timeout_ms)
    elif kind == AckerMessage.FAIL:
        tree.failed = True
        if tree.init_seen:
            return None, Decision(Outcome.FAILED, tree, message.reason or f"failed in {message.stage or 'a stage'}")
        # Without INIT we do not know the origin yet: hold the failure until INIT arrives.
        return tree, None
    else:
        raise ValueError(f"unknown acker message kind {kind}")
    return decide(tree)


def encode_new_init(message: AckerMessage, now_ms: int, default_timeout_ms: int, appended_ms: int = 0) -> bytes | None:
    """The hot path of an INIT for a tree not seen before: the encoding ``apply`` would
    produce, without building a Tree. None when the INIT decides the tree by itself (no
    edges), which ``apply`` must handle."""
    if not message.xor_value:
        return None
    started = appended_ms or message.sent_at_ms or now_ms
    origin = message.origin
    return _LAYOUT.pack(
        message.xor_value, started, started + (message.timeout_ms or default_timeout_ms), origin.offset,
        message.attempt, origin.partition, _INIT_SEEN,
    ) + origin.record_id.encode()


def xor_pending(encoded: bytes, xor_value: int) -> bytes | None:
    """The hot path of an ACK on a stored tree: XOR straight into the encoding. Returns None
    when the ACK may decide the tree (then ``apply`` on the decoded tree must run)."""
    ack_val = _ACK_VAL.unpack_from(encoded)[0] ^ xor_value
    if ack_val == 0 and encoded[_FLAGS_AT] & _INIT_SEEN:
        return None
    return _ACK_VAL.pack(ack_val) + encoded[8:]


def is_group(encoded: bytes) -> bool:
    """A stored group, not a tree (the admin calls and the pending count skip groups)."""
    return bool(encoded[_FLAGS_AT] & _GROUP)


def decide(tree: Tree) -> tuple[Tree | None, Decision | None]:
    if not tree.init_seen:
        return tree, None
    if tree.failed:
        return None, Decision(Outcome.FAILED, tree, "failed before its INIT arrived")
    if tree.ack_val == 0:
        return None, Decision(Outcome.COMPLETED, tree)
    return tree, None


def expired(tree: Tree, now_ms: int) -> Decision | None:
    """The timeout sweep: processing time, so a tree with no further messages still times out."""
    if now_ms < tree.deadline_ms:
        return None
    return Decision(Outcome.TIMED_OUT, tree, f"not fully acked within {tree.deadline_ms - tree.started_ms} ms")


class SweepClock:
    """The "now" the timeout sweep judges a partition's trees by. Processing time while the
    acker has read its input to the end; while it is behind (a backlog after a restart or an
    outage), the send time of the newest message read from that partition. A tree's acks all
    live in its own partition, so a tree is only timed out once the acker has read past its
    deadline: acks waiting unread in the backlog cannot be timed out (and replayed for nothing)
    before they are seen."""

    def __init__(self) -> None:
        self._read_up_to: dict[int, int] = {}

    def observe(self, partition: int, sent_at_ms: int) -> None:
        if sent_at_ms > self._read_up_to.get(partition, 0):
            self._read_up_to[partition] = sent_at_ms

    def forget(self, partitions: list[int]) -> None:
        for partition in partitions:
            self._read_up_to.pop(partition, None)

    def now(self, partition: int, wall_ms: int, caught_up: bool) -> int:
        if caught_up:
            return wall_ms
        return min(wall_ms, self._read_up_to.get(partition, 0))

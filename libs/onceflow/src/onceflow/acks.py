"""The one way a stage talks to the acker. Every message is produced inside the stage's own
transaction, so an ack exists exactly when the processing it reports committed.

- the spout (ingest) sends INIT: the XOR of the edges it emitted, and where the record lives;
- a stage that consumed an envelope sends ACK: its input edge XOR the edges it emitted;
- a stage that gives up on a record sends FAIL with the reason;
- a stage whose outputs fold many inputs (compute's two hops) makes them one GROUP
  (``Anchoring``): each output carries an ``Anchor`` (the group and its own edge), and the hop
  that consumes it acks that edge. A tree thus ends where its effect is visible: at the sink
  (docs/decisions/0016).

A tree lives in partition ``root_id mod partitions`` of acker.acks; a group has a copy on each
partition its anchors name. A transaction's messages are grouped by partition into one
``AckerBatch`` record each (``AckBuffer``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

from onceflow.codec import new_id, now_ms
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, Anchor, RecordRef
from onceflow.v1.envelope_pb2 import Envelope

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


@functools.lru_cache(maxsize=4096)
def _reader_salt(reader: str) -> int:
    return int.from_bytes(hashlib.blake2b(reader.encode(), digest_size=8).digest(), "big")


def reader_edge(edge: int, reader: str) -> int:
    """The edge one reader of a forwarded record acks (docs/decisions/0028): the gate acks the
    record with one per reader of its stream, so the tree ends once each has acked its own.
    Mixed, not just salted, so no two readers' edges of one record XOR to a constant."""
    return next_root_id(edge ^ _reader_salt(reader), 1)


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


def group(group_id: int, edges: int, members: Iterable[int], stage: str) -> AckerMessage:
    return AckerMessage(
        kind=AckerMessage.GROUP, root_id=group_id, xor_value=edges, members=members, stage=stage, sent_at_ms=now_ms()
    )


class AckBuffer:
    """One transaction's acker messages, in order per partition, until they are sealed into one
    AckerBatch record per acker.acks partition.

    Messages are built in place in their partition's AckerBatch (``add_ack``, the per-record
    path): a message built on its own and added is copied, which cost about as much as building
    it (docs/performance.md, "Per-record cost")."""

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"acker.acks needs at least one partition, got {partitions}")
        self.partitions = partitions
        self._batches: dict[int, AckerBatch] = {}
        # The partition of every message, in the order added: a savepoint is a length of it.
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, message: AckerMessage, partition: int | None = None) -> None:
        """``message`` at ``partition``; by default the partition of its tree (a group's copies
        live where its anchors say)."""
        if partition is None:
            partition = message.root_id % self.partitions
        elif not 0 <= partition < self.partitions:
            raise ValueError(f"acker.acks has {self.partitions} partitions, not partition {partition}")
        self._batch(partition).messages.append(message)
        self._order.append(partition)

    def add_ack(self, root_id: int, xor_value: int, stage: str, sent_at_ms: int) -> None:
        """An ACK of ``root_id``'s tree: ``ack()`` built in place."""
        partition = root_id % self.partitions
        self._batch(partition).messages.add(
            kind=AckerMessage.ACK, root_id=root_id, xor_value=xor_value, stage=stage, sent_at_ms=sent_at_ms
        )
        self._order.append(partition)

    def truncate(self, length: int) -> None:
        dropped: dict[int, int] = {}
        for partition in self._order[length:]:
            dropped[partition] = dropped.get(partition, 0) + 1
        del self._order[length:]
        for partition, count in dropped.items():
            del self._batches[partition].messages[-count:]

    def seal(self) -> list[tuple[int, bytes]]:
        """(partition, serialized AckerBatch) per partition with messages, each in the order
        added; empties the buffer."""
        sealed = [(p, batch.SerializeToString()) for p, batch in sorted(self._batches.items()) if batch.messages]
        self._batches, self._order = {}, []
        return sealed

    def _batch(self, partition: int) -> AckerBatch:
        batch = self._batches.get(partition)
        if batch is None:
            batch = self._batches[partition] = AckerBatch()
        return batch


def check_anchor(anchor: Anchor, partitions: int) -> tuple[int, ...]:
    """The anchor's acker.acks partitions, distinct; ValueError for an anchor that names no
    group or no partition, or a partition this acker.acks does not have (written for more
    partitions than there are, or corrupt)."""
    where = tuple(sorted(set(anchor.acker_partitions)))
    if not anchor.group_id or not anchor.edge_id or not where:
        raise ValueError(f"anchor without a group, an edge or a partition: {anchor}")
    if where[-1] >= partitions:
        raise ValueError(f"anchor names acker.acks partition {where[-1]}, which has {partitions} partitions")
    return where


class Anchoring:
    """One transaction's group (docs/decisions/0016): what its outputs came from, and the anchors
    they carry.

    Its members are the trees of the envelopes a stage read (``roots``: compute's map hop) or the
    groups behind the anchored outputs it consumed (``consumed``: the merge hop, the sink). Each
    output gets an anchor (``anchor``): the group id and a fresh edge. At ``seal`` the members are
    acked with the group id as their child edge and the group is opened with the XOR of its
    outputs' edges, on every partition its anchors name; a transaction that anchored no output
    acks its members without children, so their trees end here.

    A group's copies live on its roots' partitions when it has roots only; once it consumed
    anchors it lives on every partition, because the anchors must name its partitions before the
    transaction has read all it will consume."""

    def __init__(self, partitions: int, stage: str) -> None:
        self.partitions = partitions
        self._stage = stage
        self._everywhere = tuple(range(partitions))  # where a group that consumed anchors lives
        self.group_id = new_id()
        self._roots: list[Envelope] = []
        # Upstream group -> (XOR of its edges consumed here, the partitions holding it).
        self._upstream: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._edges: list[int] = []
        self._where: tuple[int, ...] | None = None

    def __len__(self) -> int:
        """The outputs anchored so far (a savepoint's mark)."""
        return len(self._edges)

    @property
    def has_members(self) -> bool:
        return bool(self._roots or self._upstream)

    def truncate(self, length: int) -> None:
        """Forget the anchors of outputs rolled back. Members stay: a consumed input is settled
        whether its output was kept or it went to the DLQ."""
        del self._edges[length:]

    def roots(self, envelopes: Iterable[Envelope]) -> None:
        """These inputs' trees continue as this transaction's outputs (or end here, if none).
        Envelopes without a root (acking off) are left out."""
        added = [e for e in envelopes if e.root_id]
        if self._where is not None and any(e.root_id % self.partitions not in self._where for e in added):
            raise RuntimeError("roots added after the first anchor must live where the group already does")
        self._roots.extend(added)

    def consumed(self, anchor: Anchor) -> None:
        """An anchored output was consumed: its edge is acked at ``seal``. ValueError, before
        anything is kept, for an anchor this acker.acks cannot hold (the caller dead-letters
        the record: a poison anchor must not fail the whole transaction at ``seal``)."""
        where = check_anchor(anchor, self.partitions)
        if self._where is not None and self._where != self._everywhere:
            raise RuntimeError("a group anchored to its roots' partitions cannot take upstream groups afterwards")
        edges, _where = self._upstream.get(anchor.group_id, (0, where))
        self._upstream[anchor.group_id] = (edges ^ anchor.edge_id, where)

    def anchor(self) -> Anchor | None:
        """The anchor of a new output; None when nothing this transaction read is tracked."""
        if self._where is None:
            if self._upstream:
                self._where = self._everywhere
            elif self._roots:
                self._where = tuple(sorted({e.root_id % self.partitions for e in self._roots}))
            else:
                return None
        edge = new_id()
        self._edges.append(edge)
        return Anchor(group_id=self.group_id, edge_id=edge, acker_partitions=self._where)

    def seal(self, buffer: AckBuffer) -> None:
        """The members' acks and the group's GROUP messages, into ``buffer``."""
        stage, group_id = self._stage, self.group_id
        child = (group_id,) if self._edges else ()
        continued: set[int] = set()
        sent_at, child_edge = now_ms(), group_id if child else 0
        for envelope in self._roots:
            # A root read twice in one transaction gets the group as its child once: twice
            # would XOR it out of the tree, which would then complete before the group.
            root_id = envelope.root_id
            if root_id in continued:
                buffer.add_ack(root_id, envelope.edge_id, stage, sent_at)
            else:
                continued.add(root_id)
                buffer.add_ack(root_id, envelope.edge_id ^ child_edge, stage, sent_at)
        for upstream, (edges, where) in self._upstream.items():
            message = AckerMessage(
                kind=AckerMessage.ACK, root_id=upstream, xor_value=edges ^ (group_id if child else 0), stage=stage,
                sent_at_ms=now_ms(),
            )
            for partition in where:
                buffer.add(message, partition)
        if child:
            assert self._where is not None  # set by the first anchor
            edges = xor_all(self._edges)
            for partition in self._where:
                members = [root for root in continued if root % self.partitions == partition]
                members += [upstream for upstream, (_, where) in self._upstream.items() if partition in where]
                buffer.add(group(group_id, edges, members, stage), partition)
        self._roots, self._upstream, self._edges = [], {}, []

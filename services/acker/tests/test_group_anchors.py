"""Group anchors (docs/decisions/0016) in pure logic: the hops' ``Anchoring`` as the shared batch
seals it, and the acker's stage deciding from what they wrote. Roots go through a map hop that
folds them into partials, a merge hop that folds partials into result changes and a sink that
acks the changes it applied, each cut into random transactions over random acker partitions.
A root must complete exactly when the last sink batch its effect depends on has acked, not one
batch earlier, and exactly once."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow import acks
from onceflow.codec import new_id, now_ms
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, Anchor, RecordRef, TreeEvent
from onceflow.v1.envelope_pb2 import Envelope

from onceflow_acker.stage import AckerStage, AckerStats
from onceflow_acker.trees import Tree

ACKS, EVENTS = "acker.acks", "acker.events"


class _Record:
    def __init__(self, partition: int, value: bytes) -> None:
        self._partition, self._value = partition, value

    def partition(self) -> int:
        return self._partition

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_000

    def topic(self) -> str:
        return ACKS

    def offset(self) -> int:
        return 0

    def key(self) -> None:
        return None


class _Stores(dict[int, MemoryStore]):
    @property
    def partitions(self) -> list[int]:
        return sorted(self)


class Acker:
    """The stage over one store per partition, committing each batch's state as the loop does."""

    def __init__(self, partitions: int) -> None:
        self.stores = _Stores({p: MemoryStore() for p in range(partitions)})
        self.stage = AckerStage(EVENTS, "ingest.records", 60_000, AckerStats())
        self.completed: list[int] = []

    def read(self, sealed: Iterable[tuple[int, bytes]]) -> set[int]:
        """One transaction's acker records in; the roots it completed out."""
        batch: Batch[MemoryStore] = Batch([_Record(p, v) for p, v in sealed], self.stores, "acker.dlq", "acker")  # type: ignore[arg-type]
        self.stage.process(batch)
        assert batch.dead_letters == 0
        for partition, overlay in batch.overlays.items():
            self.stores[partition].apply(overlay.changes, None)
        done = [TreeEvent.FromString(o.value or b"") for o in batch.outputs if o.topic == EVENTS]
        assert all(e.outcome == TreeEvent.COMPLETED for e in done)
        self.completed += [e.root_id for e in done]
        return {e.root_id for e in done}

    def sweep(self, at_ms: int) -> list[tuple[int, int]]:
        """The timeout sweep as of ``at_ms``: (root, outcome) of the events it wrote."""
        batch: Batch[MemoryStore] = Batch([], self.stores, "acker.dlq", "acker")  # type: ignore[arg-type]
        batch.now_ms = at_ms
        self.stage.punctuate(batch)
        for partition, overlay in batch.overlays.items():
            self.stores[partition].apply(overlay.changes, None)
        events = [TreeEvent.FromString(o.value or b"") for o in batch.outputs if o.topic == EVENTS]
        return [(e.root_id, e.outcome) for e in events]

    def entries(self) -> int:
        return sum(len(store) for store in self.stores.values())


def hop(partitions: int, stage: str) -> Batch[MemoryStore]:
    return Batch([], None, "dlq", stage, ACKS, partitions)


def sealed(batch: Batch[MemoryStore]) -> list[tuple[int, bytes]]:
    batch.seal()
    return [(o.partition, o.value or b"") for o in batch.outputs if o.topic == ACKS]  # type: ignore[misc]


def split(rng: random.Random, items: list, parts: int) -> list[list]:
    rng.shuffle(items)
    cuts = sorted(rng.randint(0, len(items)) for _ in range(parts - 1))
    return [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32), partitions=st.integers(1, 4), roots=st.integers(1, 40),
    map_batches=st.integers(1, 5), merge_batches=st.integers(1, 5), sink_batches=st.integers(1, 5),
)
def test_a_root_completes_when_the_last_sink_batch_its_effect_reached_has_acked(
    seed: int, partitions: int, roots: int, map_batches: int, merge_batches: int, sink_batches: int
) -> None:
    rng = random.Random(seed)
    acker = Acker(partitions)
    envelopes = [Envelope(root_id=new_id(), edge_id=new_id(), record_id=f"r{i}") for i in range(roots)]
    inits = acks.AckBuffer(partitions)
    for envelope in envelopes:
        inits.add(acks.init(envelope.root_id, [envelope.edge_id], RecordRef(record_id=envelope.record_id), 1, 60_000))
    assert acker.read(inits.seal()) == set()

    # The map hop: each transaction folds its roots into 0-3 partials.
    partial_of_root: dict[int, list[int]] = {}
    partials: list[Anchor] = []
    map_acks = []
    for part in split(rng, list(envelopes), map_batches):
        batch = hop(partitions, "compute")
        batch.anchor_roots(part)
        anchors = [batch.anchor() for _ in range(rng.randint(0, 3) if part else 0)]
        assert all(a is not None for a in anchors)
        partials += anchors  # type: ignore[arg-type]
        for envelope in part:
            partial_of_root[envelope.root_id] = [a.edge_id for a in anchors]  # type: ignore[union-attr]
        map_acks.append(sealed(batch))
    # The merge hop: each transaction consumes some partials and emits 0-3 changes.
    changes_of_partial: dict[int, list[int]] = {}
    changes: list[Anchor] = []
    merge_acks = []
    for part in split(rng, list(partials), merge_batches):
        batch = hop(partitions, "compute-merge")
        for anchor in part:
            batch.consumed(anchor)
        emitted = [batch.anchor() for _ in range(rng.randint(0, 3) if part else 0)]
        changes += emitted  # type: ignore[arg-type]
        for anchor in part:
            changes_of_partial[anchor.edge_id] = [c.edge_id for c in emitted]  # type: ignore[union-attr]
        merge_acks.append(sealed(batch))
    # The sink: each batch acks the changes it applied.
    sink_of_change: dict[int, int] = {}
    sink_acks = []
    for number, part in enumerate(split(rng, list(changes), sink_batches)):
        anchoring, buffer = acks.Anchoring(partitions, "sink"), acks.AckBuffer(partitions)
        for anchor in part:
            anchoring.consumed(anchor)
            sink_of_change[anchor.edge_id] = number
        anchoring.seal(buffer)
        sink_acks.append(buffer.seal())

    # A root needs every sink batch holding a change of a merge transaction that consumed one of
    # its map transaction's partials (coarse by design: a group waits for all of its outputs).
    needs = {
        root: {sink_of_change[c] for p in partial_edges for c in changes_of_partial[p]}
        for root, partial_edges in partial_of_root.items()
    }
    for sealed_acks in map_acks:
        acker.read(sealed_acks)
    for sealed_acks in merge_acks:
        acker.read(sealed_acks)
    done_before_sink = set(acker.completed)
    assert done_before_sink == {root for root, sinks in needs.items() if not sinks}
    for number, sealed_acks in enumerate(sink_acks):
        acker.read(sealed_acks)
        expected = {root for root, sinks in needs.items() if max(sinks, default=-1) <= number}
        assert set(acker.completed) == expected, f"after sink batch {number}"
    assert sorted(acker.completed) == sorted(e.root_id for e in envelopes)  # each exactly once
    assert acker.entries() == 0  # every group's copies are gone too


def one_root_through_map_and_merge(acker: Acker, partitions: int, tree_timeout_ms: int) -> tuple[Envelope, Anchor]:
    """A root's INIT, a map transaction with one partial, a merge transaction with one change
    (the change's anchor is returned: the sink's to ack)."""
    envelope = Envelope(root_id=new_id(), edge_id=new_id(), record_id="r")
    inits = acks.AckBuffer(partitions)
    inits.add(acks.init(envelope.root_id, [envelope.edge_id], RecordRef(record_id="r"), 1, tree_timeout_ms))
    acker.read(inits.seal())
    mapped = hop(partitions, "compute")
    mapped.anchor_roots([envelope])
    partial = mapped.anchor()
    acker.read(sealed(mapped))
    merged = hop(partitions, "compute-merge")
    assert partial is not None
    merged.consumed(partial)
    change = merged.anchor()
    assert change is not None
    acker.read(sealed(merged))
    return envelope, change


def test_a_lost_sink_ack_leaves_its_tree_pending_until_it_times_out() -> None:
    acker = Acker(2)
    envelope, change = one_root_through_map_and_merge(acker, 2, 60_000)
    assert list(change.acker_partitions) == [0, 1]  # a merge group lives everywhere
    assert acker.completed == []
    # The root's tree is pending; the groups beside it are not trees.
    stored = [Tree.decode(v) for s in acker.stores.values() for _k, v in s.items()]
    assert sum(not t.group for t in stored) == 1 and sum(t.group for t in stored) >= 2
    assert acker.sweep(at_ms=now_ms() + 61_000) == [(envelope.root_id, TreeEvent.TIMED_OUT)]
    assert acker.entries() == 0  # the groups are dropped with it, without events


def test_a_transaction_that_anchors_nothing_ends_its_members_trees() -> None:
    batch = hop(3, "compute")
    roots = [Envelope(root_id=new_id(), edge_id=new_id()) for _ in range(5)]
    batch.anchor_roots(roots)
    messages = [m for _p, v in sealed(batch) for m in AckerBatch.FromString(v).messages]
    assert {m.kind for m in messages} == {AckerMessage.ACK}
    assert {(m.root_id, m.xor_value) for m in messages} == {(e.root_id, e.edge_id) for e in roots}


def test_a_rolled_back_output_gives_its_anchor_back() -> None:
    batch = hop(2, "compute-merge")
    batch.consumed(Anchor(group_id=7, edge_id=11, acker_partitions=[0, 1]))
    kept = batch.anchor()
    savepoint = batch.savepoint()
    batch.anchor()
    batch.rollback_to(savepoint)
    messages = [m for _p, v in sealed(batch) for m in AckerBatch.FromString(v).messages]
    [group] = {m.xor_value for m in messages if m.kind == AckerMessage.GROUP}
    assert kept is not None and group == kept.edge_id  # only the kept output's edge
    upstream = [m for m in messages if m.kind == AckerMessage.ACK]
    assert len(upstream) == 2 and {m.xor_value for m in upstream} == {11 ^ kept.group_id}


def test_a_group_waits_as_long_as_the_trees_it_continues() -> None:
    acker = Acker(1)  # the acker's own default: 60 s
    envelope, _change = one_root_through_map_and_merge(acker, 1, 600_000)
    stored = {int.from_bytes(k, "big"): Tree.decode(v) for k, v in acker.stores[0].items()}
    root = stored.pop(envelope.root_id)
    assert len(stored) == 2 and all(t.group and t.deadline_ms == root.deadline_ms for t in stored.values())
    assert acker.sweep(at_ms=now_ms() + 120_000) == []  # past the acker's default: all still wait


def test_a_root_read_twice_in_one_transaction_still_waits_for_the_group() -> None:
    acker = Acker(1)
    envelope = Envelope(root_id=new_id(), edge_id=new_id(), record_id="r")
    inits = acks.AckBuffer(1)
    inits.add(acks.init(envelope.root_id, [envelope.edge_id], RecordRef(record_id="r"), 1, 60_000))
    acker.read(inits.seal())
    again = Envelope(root_id=envelope.root_id, edge_id=new_id(), record_id="r")
    mapped = hop(1, "compute")
    mapped.anchor_roots([envelope, again])
    mapped.anchor()
    # The copy's edge, as if an earlier hop had emitted it: only the group may be left.
    mapped.ack(Envelope(root_id=envelope.root_id, edge_id=0), [again.edge_id])
    assert acker.read(sealed(mapped)) == set()  # not before the group's output is consumed


def test_an_anchor_this_acker_cannot_hold_is_refused_before_it_is_kept() -> None:
    anchoring = acks.Anchoring(2, "compute-merge")
    for bad in (
        Anchor(group_id=1, edge_id=2, acker_partitions=[2]),
        Anchor(group_id=0, edge_id=2, acker_partitions=[0]),
        Anchor(group_id=1, edge_id=2),
    ):
        with pytest.raises(ValueError):
            anchoring.consumed(bad)
    assert not anchoring.has_members
    anchoring.consumed(Anchor(group_id=1, edge_id=2, acker_partitions=[1, 1]))  # duplicates: one copy each
    buffer = acks.AckBuffer(2)
    anchoring.seal(buffer)
    assert [p for p, _v in buffer.seal()] == [1]

"""Compute's two hops on onceflow.testing.StageDriver, no broker and no JVM (the pandas engine):
the map hop's partials shuffled into the merge hop give the exact table, folded from the result
changes, through poison, an aborted merge batch and a restore of the merge state from its
changelog; each job's changelog holds its own keys and its state fingerprint; the event-time
hops (a join, a windowed aggregation, the map hop's event time) keep what they cache in memory
in step with committed state across aborts and restores."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

import pyarrow as pa
import pytest

from onceflow import topology
from onceflow.codec import new_id
from onceflow.state.store import MemoryStore
from onceflow.testing import Record, StageDriver, Transaction
from onceflow.topology import Topic, job_topic
from onceflow.v1.compute_pb2 import JoinRow, PartialAggregate, SourceWatermark
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, Count, Join, JoinKind, Sum, Tumbling
from onceflow_compute.engine import BUCKET, KEY, partial_columns
from onceflow_compute.engine.pandas_engine import PandasEngine
from onceflow_compute.jobs.usersum import job as USERSUM
from onceflow_compute.lifecycle import fingerprint_key
from onceflow_compute.map.eventtime import EventTimeGate
from onceflow_compute.map.stage import MapStage
from onceflow_compute.merge.aggregation import MergeStage
from onceflow_compute.merge.joined import JoinMergeStage
from onceflow_compute.merge.windowed import WindowedMergeStage
from onceflow_compute.results import state_key

pytestmark = pytest.mark.compute

RESULTS, LATE = Topic.COMPUTE_RESULTS.value, Topic.COMPUTE_LATE.value
USERCOUNT = Aggregation(name="usercount", schema=USERSUM.schema, key="user", aggregates=(Count("payments"),))


def partials_of(job: str) -> str:
    return job_topic(Topic.COMPUTE_PARTIALS, job)


def merge_driver(stage: MergeStage | JoinMergeStage | WindowedMergeStage) -> StageDriver[MemoryStore]:
    return StageDriver.for_hop(topology.COMPUTE_MERGE, stage, job=stage.job.name, store=lambda _partition: MemoryStore())


def payment(index: int, payload: object) -> Record:
    """A record of dedup.records, as the gate forwards it (keyed by the grouping key)."""
    user = payload.get("user", "") if isinstance(payload, dict) else ""
    envelope = Envelope(
        record_id=f"p{index}", root_id=new_id(), edge_id=new_id(), attempt=1, key=str(user).encode(),
        payload=json.dumps(payload).encode(),
    )
    return Record.of(envelope, key=str(user).encode())


def shuffled(done: Transaction[MemoryStore], topic: str) -> list[Record]:
    """A map transaction's partials as the merge hop reads them (one partition here)."""
    return [Record(record.value, record.key) for record in done.topic(topic)]


def fold(changes: Iterable[ResultChange], table: dict[str, dict[str, object]]) -> None:
    """compute.results folded in order, as the sink applies it: a retraction withdraws the row
    as it stands, and no row is upserted twice without one."""
    for change in changes:
        row = json.loads(change.value)
        if change.op == ResultChange.RETRACT:
            assert table.pop(change.key) == row, f"retracted {change.key} is not the row in place"
        else:
            assert change.key not in table, f"{change.key} upserted twice"
            table[change.key] = row


def test_map_then_merge_is_exact_through_poison_an_aborted_merge_and_a_restore() -> None:
    rng = random.Random(4)
    payloads: list[object] = []
    amounts: dict[str, list[int]] = {}  # of the valid payments, per user
    poison: list[int] = []
    for index in range(600):
        user = f"u{rng.randrange(30)}"
        if rng.random() < 0.02:
            payloads.append(rng.choice([{"user": user, "amount": "ten"}, {"amount": 5}, [user]]))
            poison.append(index)
        else:
            amount = rng.randrange(1, 1000)
            payloads.append({"user": user, "amount": amount})
            amounts.setdefault(user, []).append(amount)
    expected = {
        user: {"user": user, "total": sum(a), "count": len(a), "smallest": min(a), "largest": max(a)} for user, a in amounts.items()
    }
    mapper = StageDriver.for_hop(topology.COMPUTE_MAP, MapStage(USERSUM, PandasEngine(), partials_of("usersum"), RESULTS,
                                                                stats.JobCounts()), job="usersum")
    merger = merge_driver(MergeStage(USERSUM, RESULTS, stats.JobCounts()))
    table: dict[str, dict[str, object]] = {}
    letters = []
    for step, start in enumerate(range(0, len(payloads), 100)):
        mapped = mapper.process([payment(i, payloads[i]) for i in range(start, start + 100)])
        letters += mapped.dead_letters()
        partials = shuffled(mapped, partials_of("usersum"))
        if step == 2:  # the merge transaction aborts; its partials are read again
            before = len(merger.topic(RESULTS))
            aborted = merger.process(partials, abort=True)
            assert aborted.topic(RESULTS) and len(merger.topic(RESULTS)) == before
        if step == 4:  # a new owner of the merge partition, from the changelog
            merger.restore()
        fold(merger.process(partials).decode(RESULTS, ResultChange), table)
    assert table == expected
    assert sorted(letter.source_offset for letter in letters) == poison and poison
    assert all(letter.job == "usersum" and letter.message for letter in letters)


def test_each_jobs_changelog_holds_its_own_keys_and_fingerprint_and_a_restore_brings_back_only_them() -> None:
    """Two aggregations over one stream: their own partials, their own changelogs."""
    records = [payment(i, {"user": f"u{i % 3}", "amount": i}) for i in range(12)]
    tables = {}
    for job in (USERSUM, USERCOUNT):
        topic = partials_of(job.name)
        mapped = StageDriver.for_hop(topology.COMPUTE_MAP, MapStage(job, PandasEngine(), topic, RESULTS, stats.JobCounts()),
                                     job=job.name).process(records)
        merger = merge_driver(MergeStage(job, RESULTS, stats.JobCounts()))
        merger.process(shuffled(mapped, topic))
        assert {r.key for r in merger.changelog()} == {state_key(job.name, f"u{u}") for u in range(3)} | {fingerprint_key(job.name)}
        merger.restore()
        tables[job.name] = merger.table()
    assert set(tables["usercount"]) == {state_key("usercount", f"u{u}") for u in range(3)} | {fingerprint_key("usercount")}
    assert json.loads(tables["usercount"][state_key("usercount", "u0")]) == [4]
    assert json.loads(tables["usersum"][state_key("usersum", "u0")])[0] == sum(range(0, 12, 3))


def test_a_poison_partial_is_dead_lettered_and_leaves_its_key_as_it_was() -> None:
    merger = merge_driver(MergeStage(USERCOUNT, RESULTS, stats.JobCounts()))
    merger.process([Record.of(PartialAggregate(job="usercount", key="u", partials=b"[2]"))])
    bad = PartialAggregate(job="usercount", key="u", partials=b"[1, 2]")
    done = merger.process([Record.of(bad), Record.of(PartialAggregate(job="usercount", key="v", partials=b"[1]"))])
    (letter,) = done.dead_letters()
    assert "expected 1 values" in letter.message and letter.source_offset == 1
    assert json.loads(merger.table()[state_key("usercount", "u")]) == [2]
    assert [(c.key, c.op) for c in done.decode(RESULTS, ResultChange)] == [("v", ResultChange.UPSERT)]


PAIRS = Join(
    name="pairs", schema=pa.schema([pa.field("k", pa.string())]), left=lambda df: df, right=lambda df: df, on="k",
    left_id="id", right_id="id", how=JoinKind.FULL,
)


def side(side: JoinRow.Side, row_id: str, key: str = "k1") -> Record:
    row = JoinRow(side=side, row=json.dumps({"id": row_id, "k": key}).encode(), event_time_ms=1)
    return Record.of(PartialAggregate(job="pairs", key=key, join_row=row))


def test_a_join_forgets_an_aborted_row_and_a_new_owner_restores_the_committed_ones() -> None:
    """The join's rows are a cache of committed state: without ``on_rollback`` an aborted left row
    would stay, and the right row below would join it twice."""
    merger = merge_driver(JoinMergeStage(PAIRS, RESULTS, stats.JobCounts()))
    table: dict[str, dict[str, object]] = {}
    aborted = merger.process([side(JoinRow.LEFT, "L1")], abort=True)
    assert [c.key for c in aborted.decode(RESULTS, ResultChange)] == ["L1|"]
    fold(merger.process(aborted.records).decode(RESULTS, ResultChange), table)
    merger.restore()
    fold(merger.process([side(JoinRow.RIGHT, "R1")]).decode(RESULTS, ResultChange), table)
    assert table == {"L1|R1": {"left": {"id": "L1", "k": "k1"}, "right": {"id": "R1", "k": "k1"}}}


WINDOWED = Aggregation(
    name="tens", schema=pa.schema([pa.field("user", pa.string()), pa.field("amount", pa.int64()), pa.field("t", pa.int64())]),
    key="user", aggregates=(Sum("amount", name="total"),), window=Tumbling(10_000), time_column="t",
)


def pane(amount: int, bucket_ms: int) -> Record:
    return Record.of(PartialAggregate(job="tens", key="u", partials=json.dumps([amount]).encode(), bucket_ms=bucket_ms))


def watermark(mark: int) -> Record:
    return Record.of(PartialAggregate(job="tens", watermark=SourceWatermark(partition=0, watermark_ms=mark, partitions=1)))


def test_a_windowed_merge_fires_the_committed_panes_after_an_abort_and_a_restore() -> None:
    merger = merge_driver(WindowedMergeStage(WINDOWED, RESULTS, stats.JobCounts()))
    assert merger.process([watermark(0), pane(5, 1_000), pane(2, 2_000)]).topic(RESULTS) == []  # the window is open
    merger.process([pane(100, 3_000)], abort=True)
    merger.process([pane(1, 4_000)])  # persists the key's panes: the aborted one must not be among them
    merger.restore()
    (fired,) = merger.process([watermark(10_000)]).decode(RESULTS, ResultChange)
    assert (fired.key, fired.op, json.loads(fired.value)["total"]) == ("u@0-10000", ResultChange.UPSERT, 8)


class NoPartials:
    """An engine whose job emits nothing: the map hop's event-time rules are under test here,
    not the job (the pandas engine runs no windowed job, and Spark is not needed for this)."""

    name = "none"

    def partials(self, job: Aggregation, table: pa.Table) -> pa.Table:
        columns = {KEY: pa.array([], pa.string()), BUCKET: pa.array([], pa.int64())}
        return pa.table(columns | {name: pa.array([], pa.int64()) for name in partial_columns(job)})


def timed(index: int, t: int) -> Record:
    return payment(index, {"user": "u", "amount": 1, "t": t})


def test_the_map_hops_event_time_survives_a_restore_and_an_aborted_batch_does_not_move_it() -> None:
    gate = EventTimeGate(WINDOWED, 1_000, LATE, partials_of("tens"), 1, 1)
    stage = MapStage(WINDOWED, NoPartials(), partials_of("tens"), RESULTS, stats.JobCounts(), event_time=gate)  # type: ignore[arg-type]
    mapper = StageDriver.for_hop(topology.COMPUTE_MAP, stage, job="tens", store=lambda _partition: MemoryStore())
    mapper.process([timed(0, 50_000)])
    mapper.process([timed(1, 90_000)], abort=True)  # would put the watermark at 89 s
    mapper.restore()
    assert mapper.process([timed(2, 40_000)]).dead_letters(LATE) == []  # 40 s is not late against 49 s
    (late,) = mapper.process([timed(3, 30_000)]).dead_letters(LATE)
    assert "the watermark of partition 0 was 49000" in late.message

"""The checker of a verify campaign, after Kafka's ``transactions_test.py`` and Jepsen's Kafka
checks. It reads every topic back after the run and says, per record_id and overall:

- **lost**: accepted by ingest (every generated id is: the clients retry until it is), but never
  through the gate (``dedup.records``, read_committed) and in no dead-letter topic;
- **duplicated**: through the gate more than once (the gate's output is where exactly-once must
  already hold; every later hop's effect is checked through the sink's table);
- **aborted reads**: a committed record that could only have come from an aborted one. A
  write of an aborted transaction (read_uncommitted minus read_committed, by offset) has ids of
  its own: an ingest envelope's ``root_id`` (a client's retry gets a new one), each envelope's
  ``edge_id`` and the edge each reader it names acks (``acks.reader_edge``). None of them may show up committed downstream: no gate output with an aborted
  ingest root, no ack (acker.acks, read_committed) of an aborted edge;
- **hanging transactions**: a partition of any pipeline topic whose last stable offset stays
  below its high watermark past the transaction timeout;
- **sink vs batch**: the table the sink serves from Redis equals the same job run by Spark over
  the generated events as one bounded input, judged only on a drained pipeline (``undrained``:
  every consumer group has read to the end of its input and the sink has applied the last
  result), so copies still in flight cannot hide behind an early match;
- **dedup store vs changelog**: the exact ids Redis holds for each partition equal the fold of
  ``dedup.changelog``, its truth (after Redis lost or rolled back state, they were rebuilt);
- acker trees completed, dead letters and late records, for the accounting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow import streams, topology
from onceflow.acks import reader_edge
from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import (
    TopicRecord,
    consumed_everything,
    end_offsets,
    hanging_transactions,
    latest_by_key,
    partitions_of,
    read_committed,
    read_uncommitted,
)
from onceflow.redis_client import connect
from onceflow.topology import Topic, job_topic
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow_tools.workloads import ResultTable

DLQ_TOPICS = topology.DLQS
PIPELINE_TOPICS = (
    Topic.INGEST_RECORDS, Topic.ACKER_ACKS, Topic.ACKER_EVENTS, Topic.ACKER_CHANGELOG, Topic.DEDUP_RECORDS, Topic.DEDUP_CHANGELOG,
    Topic.COMPUTE_PARTIALS, Topic.COMPUTE_RESULTS, Topic.COMPUTE_CHANGELOG, Topic.COMPUTE_LATE, *DLQ_TOPICS,
)


def pipeline_topics(job: str, stream: str = "") -> list[str]:
    """Every pipeline topic ``job`` uses (its own partials and changelog, its stream's topic),
    before the prefix."""
    named = [streams.topic_of(stream)] if streams.canonical(stream) else []
    return [job_topic(t, job) for t in PIPELINE_TOPICS] + named


def _hop_input(hop: topology.Hop, job: str, stream: str) -> str:
    """What ``hop`` reads for ``job`` (before the prefix): a map hop reads the job's stream."""
    assert hop.input is not None
    return streams.topic_of(stream) if hop is topology.COMPUTE_MAP else job_topic(hop.input, job)


_SHOWN = 20  # ids listed per problem in the report


@dataclass
class Verdict:
    records: int
    distinct: int
    faults_injected: dict[str, int]
    lost: int
    duplicated: int
    aborted_reads: int
    hanging_transactions: int
    sink_matches_batch: bool
    dlq: int
    late: int
    unknown: int = 0
    aborted_writes: int = 0  # records of aborted transactions in ingest.records and dedup.records
    dropped_duplicates: int = 0
    ingest_replays: int = 0
    trees_completed: int = 0
    records_without_completed_tree: int = 0
    sink_rows: int = 0
    sink_rows_wrong: int = 0
    dedup_store_matches_changelog: bool = True
    dedup_store_ids_wrong: int = 0
    undrained: list[str] = field(default_factory=list)  # what had not read to the end at the check
    # The Kafka output topic (--sink kafka; -1 rows: none was written): folded, equal to the batch
    # answer, and no compute.results change in it twice.
    output_topic_rows: int = -1
    output_topic_matches_batch: bool = True
    output_duplicates: int = 0
    redis_repairs: int = 0  # partition stores rebuilt from Kafka (the services' logs)
    late_resends: int = 0
    zombie_exits: list[int | None] = field(default_factory=list)
    unexpected_restarts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.lost == self.duplicated == self.aborted_reads == self.hanging_transactions == self.unknown == 0
            and self.sink_matches_batch and self.dedup_store_matches_changelog and not self.undrained
            and self.output_topic_matches_batch and self.output_duplicates == 0
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass
class _Aborted:
    """The ids of aborted writes of one topic: those no committed write carries."""

    roots: set[int]
    edges: set[int]
    count: int


def _aborted(committed: list[TopicRecord], everything: list[TopicRecord]) -> _Aborted:
    kept = {(r.partition, r.offset) for r in committed}
    aborted = [decode_envelope(r.value) for r in everything if (r.partition, r.offset) not in kept and r.value]
    live = [decode_envelope(r.value) for r in committed]
    return _Aborted(
        roots={e.root_id for e in aborted} - {e.root_id for e in live},
        edges=_edges(aborted) - _edges(live),
        count=len(aborted),
    )


def _edges(envelopes: list[Envelope]) -> set[int]:
    """The edges the readers of these envelopes ack: each named reader its own
    (docs/decisions/0028), or the one edge when the gate named none."""
    edges = {e.edge_id for e in envelopes}
    edges.update(reader_edge(e.edge_id, reader) for e in envelopes for reader in e.readers)
    return edges


def _dead_letter_ids(records: Iterable[TopicRecord]) -> list[str]:
    ids = []
    for record in records:
        letter = DeadLetter.FromString(record.value or b"")
        try:
            ids.append(Envelope.FromString(letter.original).record_id)
        except Exception:  # noqa: BLE001 - a sink dead letter holds a result change, not an envelope
            ids.append("")
    return ids


def undrained(common: CommonSettings, job: str, stream: str = "", sink_store: str = "redis") -> list[str]:
    """What is still in flight (empty: drained). Drained means quiet, not only "read to the
    end": every group has read its input to the end, the sink has applied the last result, the
    acker holds no undecided tree (one could still time out and be replayed), no transaction is
    open, and no pipeline topic grew while all that was being looked at. A replay written after
    the gate's group was looked at would otherwise be judged half-written (CI once counted the
    1,000 edges of a replay batch still in its transaction as aborted reads)."""
    from onceflow_sink.stores import open_store  # the store's layout lives with its service

    prefix, topic = common.topic_prefix, common.topic
    ends_before = _pipeline_ends(common, job, stream)
    open_txns = _open_transactions(ends_before)
    if open_txns:
        return [f"open transaction on {name} {parts}" for name, parts in open_txns.items()]
    behind = [
        f"{hop.group_id(prefix, job)} on {_hop_input(hop, job, stream)}"
        for hop in topology.HOPS
        if hop.input is not None and hop.offsets_in_kafka  # the sink's offsets: checked below
        and not consumed_everything(common, hop.group_id(prefix, job), topic(_hop_input(hop, job, stream)))
    ]
    if behind:
        return behind
    pending_trees = len(latest_by_key(read_committed(common, topic(Topic.ACKER_CHANGELOG))))
    if pending_trees:
        return [f"acker: {pending_trees} trees undecided"]
    store = open_store(common, sink_store)
    try:
        results = topic(Topic.COMPUTE_RESULTS)
        applied = {p: store.applied_offset(p) for p in partitions_of(common, results)}
    finally:
        store.close()
    pending = read_committed(common, results, start={p: offset + 1 for p, offset in applied.items()})
    if pending:
        return [f"sink: {len(pending)} results not applied"]
    grown = sorted(name for name, ends in _pipeline_ends(common, job, stream).items() if ends != ends_before[name])
    return [f"still being written: {', '.join(grown)}"] if grown else []


def _pipeline_ends(common: CommonSettings, job: str, stream: str = "") -> dict[str, dict[int, tuple[int, int]]]:
    """topic -> partition -> (last stable offset, high watermark), for every pipeline topic."""
    return {name: end_offsets(common, common.topic(name)) for name in pipeline_topics(job, stream)}


def _open_transactions(ends: dict[str, dict[int, tuple[int, int]]]) -> dict[str, list[int]]:
    return {
        name: stuck
        for name, partitions in ends.items()
        if (stuck := [p for p, (lso, hw) in sorted(partitions.items()) if lso < hw])
    }


def dedup_store_diff(common: CommonSettings) -> list[str]:
    """The record_ids where Redis' exact store and the fold of dedup.changelog disagree."""
    from onceflow_dedup.store import StoreKeys  # the key layout lives with its service

    changelog = common.topic(Topic.DEDUP_CHANGELOG)
    truth: dict[int, dict[bytes, bytes]] = {p: {} for p in partitions_of(common, changelog)}
    for (partition, key), value in latest_by_key(read_committed(common, changelog)).items():
        truth[partition][key] = value
    client = connect(common.redis_url)
    try:
        wrong = []
        for partition, ids in truth.items():
            held = dict(client.hscan_iter(StoreKeys.of(common.topic_prefix, partition).ids, count=5000))
            wrong += [f"{partition}:{k.decode()}" for k in set(ids) | set(held) if ids.get(k) != held.get(k)]
        return sorted(wrong)
    finally:
        client.close()


def check(
    common: CommonSettings,
    job: str,
    expected_ids: set[str],
    sink_rows: ResultTable,
    batch_rows: ResultTable,
    faults_injected: dict[str, int],
    hanging_wait_s: float = 30.0,
    still_undrained: list[str] | None = None,
) -> Verdict:
    topic = common.topic
    # Every topic read at once: each read is mostly waiting on the broker (a consumer's start,
    # offsets, fetches), so thirteen reads in turn took most of a check's time.
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="check-read") as pool:
        committed = {
            name: pool.submit(read_committed, common, topic(name))
            for name in (Topic.INGEST_RECORDS, Topic.DEDUP_RECORDS, Topic.ACKER_ACKS, Topic.ACKER_EVENTS, Topic.COMPUTE_LATE, *DLQ_TOPICS)
        }
        uncommitted = {
            name: pool.submit(read_uncommitted, common, topic(name)) for name in (Topic.INGEST_RECORDS, Topic.DEDUP_RECORDS)
        }
        read = {name: future.result() for name, future in committed.items()}
        read_all = {name: future.result() for name, future in uncommitted.items()}
    ingest_committed, gate_committed = read[Topic.INGEST_RECORDS], read[Topic.DEDUP_RECORDS]
    ingest_aborted = _aborted(ingest_committed, read_all[Topic.INGEST_RECORDS])
    gate_aborted = _aborted(gate_committed, read_all[Topic.DEDUP_RECORDS])

    passed = [decode_envelope(r.value) for r in gate_committed]
    through_gate = Counter(e.record_id for e in passed)
    dead = [rid for name in DLQ_TOPICS for rid in _dead_letter_ids(read[name])]
    late = _dead_letter_ids(read[Topic.COMPUTE_LATE])
    accounted = set(through_gate) | set(dead)
    lost = sorted(expected_ids - accounted)
    duplicated = sorted(rid for rid, n in through_gate.items() if n > 1)
    unknown = sorted(set(through_gate) - expected_ids)

    # Aborted reads: a gate output of an aborted ingest write, an ack of an aborted edge.
    aborted_edges = ingest_aborted.edges | gate_aborted.edges
    read_aborted = [f"dedup.records: {e.record_id} of aborted root {e.root_id}" for e in passed if e.root_id in ingest_aborted.roots]
    for record in read[Topic.ACKER_ACKS]:
        messages = AckerBatch.FromString(record.value or b"").messages
        # A hop that anchors its outputs acks each input as its edge XOR its group's id, and the
        # group's GROUP message shares the record (the group lives on its roots' partitions).
        groups = [0, *(m.root_id for m in messages if m.kind == AckerMessage.GROUP)]
        for message in messages:
            if message.kind != AckerMessage.ACK:
                continue
            edge = next((message.xor_value ^ g for g in groups if message.xor_value ^ g in aborted_edges), None)
            if edge is not None:
                read_aborted.append(f"acker.acks: {message.stage} acked the aborted edge {edge}")

    completed = {
        event.origin.record_id
        for event in (TreeEvent.FromString(r.value) for r in read[Topic.ACKER_EVENTS] if r.value)
        if event.outcome == TreeEvent.COMPLETED
    }
    hanging = hanging_transactions(common, [topic(t) for t in pipeline_topics(job)], wait_s=hanging_wait_s)
    wrong = sorted({k for k in batch_rows if sink_rows.get(k) != batch_rows[k]} | (set(sink_rows) - set(batch_rows)))
    ingested = [decode_envelope(r.value) for r in ingest_committed]
    store_wrong = dedup_store_diff(common)
    return Verdict(
        records=len(expected_ids),
        distinct=len(through_gate),
        faults_injected=dict(faults_injected),
        lost=len(lost),
        duplicated=len(duplicated),
        aborted_reads=len(read_aborted),
        hanging_transactions=sum(len(p) for p in hanging.values()),
        sink_matches_batch=not wrong and bool(batch_rows),
        dlq=len(dead),
        late=len(late),
        unknown=len(unknown),
        aborted_writes=ingest_aborted.count + gate_aborted.count,
        dropped_duplicates=len(ingested) - len(passed),
        ingest_replays=sum(e.attempt > 1 for e in ingested),
        trees_completed=len(completed & expected_ids),
        records_without_completed_tree=len(expected_ids - completed - set(dead)),
        sink_rows=len(sink_rows),
        sink_rows_wrong=len(wrong),
        dedup_store_matches_changelog=not store_wrong,
        dedup_store_ids_wrong=len(store_wrong),
        undrained=list(still_undrained or []),
        examples={
            name: values[:_SHOWN]
            for name, values in {
                "lost": lost, "duplicated": duplicated, "unknown": unknown, "aborted_reads": read_aborted,
                "sink_rows_wrong": wrong, "dedup_store_ids_wrong": store_wrong, "hanging": [f"{t}:{p}" for t, ps in hanging.items() for p in ps],
            }.items()
            if values
        },
    )

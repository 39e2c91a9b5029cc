"""`python -m onceflow_sink.kafka_output`: one job's result table as a changelog stream in a Kafka
topic of the user's, exactly once (docs/services/sink.md, "A Kafka output topic").

It is a hop on the shared transactional loop: it reads `compute.results` read_committed, keeps
the changes of one job, and writes each as a record of the output topic (key: the row key; value:
the row's JSON, or a tombstone for a retraction; header `onceflow-results`: where the change was
read). The outputs commit in one Kafka transaction with what was read:

- on the pipeline's cluster, with the consumer group's offsets (send_offsets_to_transaction);
- on another cluster, a transaction cannot hold the pipeline cluster's group offsets, so the
  positions are records of `sink.kafka.offsets` on the output's cluster, in the outputs'
  transaction, and the consumer assigns compute.results' partitions itself at the positions read
  back after init_transactions (`onceflow.txn.external`, as the source does: ADR 0017, mirrored).

One owner per job, output topic and target cluster: its transactional.id names those three, so a
new instance fences any other.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from onceflow import service_main, topology
from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.kafka.records import offset_of, partition_of
from onceflow.runner import run_loop_service
from onceflow.service_main import EXIT_USAGE
from onceflow.state.store import KeyValueStore
from onceflow.topology import Topic
from onceflow.txn import TransactionalLoop
from onceflow.txn.batch import Batch
from onceflow.txn.external import ExternalIntake, ExternalTopic
from onceflow.v1.results_pb2 import ResultChange

from onceflow_sink.kafka_output_config import KafkaOutputSettings
from onceflow_sink.kafka_output_topics import POSITIONS_TOPIC, Clusters, OutputRefused, prepare, resolve

log = logging.getLogger(__name__)
NAME = "sink-kafka"
# On every output record: `<partition>/<offset>` of the compute.results record it came from.
HEADER = "onceflow-results"


class Unwritable(Exception):
    """A change of the job that cannot be written in the output's format: a dead letter."""


@dataclass
class OutputCounts:
    upserts: int = 0
    tombstones: int = 0
    other_jobs: int = 0
    dead_lettered: int = 0


class OutputStage:
    """Each change of ``job`` becomes one output record; other jobs' changes are passed over."""

    name = NAME

    def __init__(self, job: str, topic: str) -> None:
        self.job = job
        self.topic = topic
        self.counts = OutputCounts()

    def process(self, batch: Batch[KeyValueStore]) -> None:
        seen = OutputCounts()
        for message in batch.records:
            try:
                change = ResultChange.FromString(message.value() or b"")
            except DecodeError as exc:  # whose it is cannot be told: every reader of it says so
                batch.job = ""
                batch.dead_letter(message, Unwritable(f"not a ResultChange: {exc}"))
                seen.dead_lettered += 1
                continue
            if change.job != self.job:
                seen.other_jobs += 1
                continue
            batch.job = self.job
            try:
                value = row_value(change)
            except Unwritable as exc:
                batch.dead_letter(message, exc)
                seen.dead_lettered += 1
                continue
            where = f"{partition_of(message)}/{offset_of(message)}".encode()
            batch.emit(self.topic, value, change.key.encode(), headers=[(HEADER, where)])
            if value is None:
                seen.tombstones += 1
            else:
                seen.upserts += 1

        def count() -> None:  # once committed: what the progress line and Status show
            for name in ("upserts", "tombstones", "other_jobs", "dead_lettered"):
                setattr(self.counts, name, getattr(self.counts, name) + getattr(seen, name))

        batch.after_commit.append(count)


def row_value(change: ResultChange) -> bytes | None:
    """The output value of a change (`--format json`): the row's JSON as compute wrote it, or
    None (a tombstone) for a retraction."""
    if change.op == ResultChange.RETRACT:
        return None
    if change.op != ResultChange.UPSERT:
        raise Unwritable(f"change of {change.key!r}: unknown op {change.op}")
    try:
        row = json.loads(change.value)
    except ValueError as exc:
        raise Unwritable(f"row {change.key!r} is not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise Unwritable(f"row {change.key!r} is not a JSON object but {type(row).__name__}")
    return change.value


@dataclass(frozen=True)
class ResultsPositions(ExternalTopic):
    """compute.results seen from the output's cluster: its positions are keyed by the job and
    output topic too, so every output to that cluster can share one positions topic."""

    job: str = field(default="")
    output: str = field(default="")

    def position_key(self, partition: int) -> bytes:
        # Neither job names nor topic names can hold '/': the key is unambiguous.
        return f"{self.cluster_id}/{self.topic}/{self.job}/{self.output}/{partition}".encode()


def group_id(settings: KafkaOutputSettings) -> str:
    """The consumer group on the pipeline's cluster (an output to another cluster joins none)."""
    return f"{settings.common.topic_prefix}onceflow-{NAME}/{settings.job}/{settings.topic}"


def transactional_id(settings: KafkaOutputSettings, clusters: Clusters) -> str:
    """One owner per job, output topic and target cluster, whatever the instance's name."""
    return f"{group_id(settings)}/{clusters.target_id}"


def check(settings: KafkaOutputSettings) -> Clusters:
    """Refuse what cannot start, before anything is written; create the topics written to."""
    if not settings.job:
        raise OutputRefused("ONCEFLOW_SINK_KAFKA_JOB is required: the job whose table is written")
    try:
        topology.split(settings.job)
    except ValueError as exc:
        raise OutputRefused(f"ONCEFLOW_SINK_KAFKA_JOB: {exc}") from None
    if not settings.topic:
        raise OutputRefused("ONCEFLOW_SINK_KAFKA_TOPIC is required: the topic to write to")
    clusters = resolve(settings.common, settings.bootstrap)
    prepare(clusters, settings.topic)
    return clusters


def build(settings: KafkaOutputSettings, clusters: Clusters) -> tuple[TransactionalLoop[KeyValueStore], ServiceServer, OutputStage]:
    common, target = settings.common, clusters.target
    results = common.topic(Topic.COMPUTE_RESULTS)
    stage = OutputStage(settings.job, settings.topic)
    intake = None  # the pipeline's cluster: a consumer group, offsets in the transaction
    if clusters.external:
        where = ResultsPositions(common.kafka_bootstrap, results, clusters.pipeline_id, settings.job, settings.topic)
        intake = ExternalIntake(target, where, target.topic(POSITIONS_TOPIC))
    # The loop's producer is the target cluster's: outputs, dead letters and positions share it.
    loop: TransactionalLoop[KeyValueStore] = TransactionalLoop(
        stage=stage, common=target, settings=settings.loop, input_topic=results, group_id=group_id(settings),
        transactional_id=transactional_id(settings, clusters), dlq_topic=target.topic(Topic.SINK_DLQ), intake=intake,
    )
    # This hop acks nothing (trees end at the sink): its start need not wait for acker.acks,
    # which the target cluster of an output elsewhere does not hold.
    loop.acking = False

    def gauges() -> dict[str, float]:
        counts = stage.counts
        return {"upserts": float(counts.upserts), "tombstones": float(counts.tombstones),
                "other_jobs": float(counts.other_jobs), "dead_lettered": float(counts.dead_lettered)}

    server = ServiceServer.for_service(NAME, settings, LoopControls(loop, gauges))
    return loop, server, stage


def describe(settings: KafkaOutputSettings, clusters: Clusters, transactional: str) -> str:
    where = f"cluster {clusters.target_id} ({settings.bootstrap})" if clusters.external else "the pipeline's cluster"
    positions = (f"positions in {clusters.target.topic(POSITIONS_TOPIC)} there" if clusters.external
                 else "offsets in the transaction")
    return (f"writing job {settings.job}'s changes from {settings.common.topic(Topic.COMPUTE_RESULTS)} to {settings.topic} "
            f"on {where} ({positions}) as {transactional}")


def run(settings: KafkaOutputSettings) -> int:
    try:
        clusters = check(settings)
    except OutputRefused as exc:
        print(f"onceflow-{NAME}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loop, server, _stage = build(settings, clusters)
    log.info("%s", describe(settings, clusters, loop.transactional_id))
    return run_loop_service(loop, server, settings.metrics_port, settings.host)


def main() -> None:
    service_main.main(
        NAME, "Write one job's result table to a Kafka topic as a changelog stream, exactly once.",
        KafkaOutputSettings, run,
    )


if __name__ == "__main__":
    main()

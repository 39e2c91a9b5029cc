"""The windowed merge hop without a broker: partials and source watermarks in, panes out, and
early panes fired by processing time alone (punctuation), with no partial arriving."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Message

from onceflow.state.store import MemoryStore
from onceflow.topology import Topic, job_topic
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate, SourceWatermark
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, Sum, Trigger, Tumbling
from onceflow_compute.merge.windowed import WindowedMergeStage

pytestmark = [pytest.mark.compute, pytest.mark.dataflow]

JOB = Aggregation(
    name="early",
    schema=pa.schema([pa.field("user", pa.string()), pa.field("amount", pa.int64()), pa.field("t", pa.int64())]),
    key="user",
    aggregates=(Sum("amount", name="total"),),
    window=Tumbling(10_000),
    trigger=Trigger(early_every_ms=1_000),
    time_column="t",
)
PARTIALS = job_topic(Topic.COMPUTE_PARTIALS, JOB.name)


class Stores(dict):
    """What the stage reads of the loop's PartitionStores: one store per partition."""


def stage_with_one_partition() -> tuple[WindowedMergeStage, Stores]:
    stage = WindowedMergeStage(JOB, Topic.COMPUTE_RESULTS, stats.JobCounts())
    stores = Stores({0: MemoryStore()})
    stage.on_assign([0], stores)
    return stage, stores


def partial(offset: int, user: str, amount: int, bucket_ms: int) -> Message:
    value = PartialAggregate(job=JOB.name, key=user, partials=json.dumps([amount]).encode(), bucket_ms=bucket_ms)
    return Message(topic=PARTIALS, partition=0, offset=offset, value=value.SerializeToString())


def watermark(offset: int, mark: int) -> Message:
    value = PartialAggregate(job=JOB.name, watermark=SourceWatermark(partition=0, watermark_ms=mark, partitions=1))
    return Message(topic=PARTIALS, partition=0, offset=offset, value=value.SerializeToString())


def upserts(batch: Batch) -> list[dict]:
    changes = [ResultChange.FromString(out.value) for out in batch.outputs if out.topic == Topic.COMPUTE_RESULTS]
    return [json.loads(c.value) for c in changes if c.op == ResultChange.UPSERT]


def test_an_early_pane_fires_by_processing_time_with_no_input() -> None:
    stage, stores = stage_with_one_partition()
    first = Batch([watermark(0, 0), partial(1, "u", 5, 1_000)], stores, Topic.COMPUTE_DLQ, "compute-merge")
    stage.process(first)
    assert [row["total"] for row in upserts(first)] == [5]  # the first early pane: at once

    second = Batch([partial(2, "u", 2, 2_000)], stores, Topic.COMPUTE_DLQ, "compute-merge")
    second.now_ms = first.now_ms + 100
    stage.process(second)
    assert upserts(second) == []  # within early_every_ms of the last early pane: not yet

    quiet = Batch([], stores, Topic.COMPUTE_DLQ, "compute-merge")
    quiet.now_ms = first.now_ms + 1_500
    stage.punctuate(quiet)
    assert [row["total"] for row in upserts(quiet)] == [7]  # no partial arrived: processing time fired it

    again = Batch([], stores, Topic.COMPUTE_DLQ, "compute-merge")
    again.now_ms = first.now_ms + 3_000
    stage.punctuate(again)
    assert upserts(again) == []  # nothing new since: no pane repeats its row


def test_a_job_without_early_firings_does_nothing_on_punctuation() -> None:
    stage = WindowedMergeStage(
        Aggregation(
            name="plain", schema=JOB.schema, key="user", aggregates=JOB.aggregates, window=Tumbling(10_000), time_column="t"
        ),
        Topic.COMPUTE_RESULTS,
        stats.JobCounts(),
    )
    stores = Stores({0: MemoryStore()})
    stage.on_assign([0], stores)
    batch = Batch([], stores, Topic.COMPUTE_DLQ, "compute-merge")
    stage.punctuate(batch)
    assert batch.outputs == [] and not batch.after_commit

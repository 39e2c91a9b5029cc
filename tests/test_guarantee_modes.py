"""The processing-guarantee switch of the shared loop (what ``onceflow bench`` compares).

at_least_once must really drop the transactions (otherwise the bench's ratio measures nothing)
and must still lose nothing through a kill -9; exactly_once must keep its transactions. A topic
written in transactions holds a commit marker per transaction per partition, so its high
watermark exceeds its record count; a topic written without them does not."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets
from onceflow.topology import Topic
from onceflow.txn.producer import AtLeastOnceProducer
from tests.conftest import Pipeline, eventually
from tests.harness import checker
from tests.harness.workload import items, produce_envelopes

pytestmark = [pytest.mark.verify, pytest.mark.integration]

WORKER = "tests.harness.workers.keyed_counter"


def _outputs(pipe: Pipeline) -> list[checker.TopicRecord]:
    return checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_RECORDS))


def _markers(pipe: Pipeline, records: int) -> int:
    return sum(high for _lso, high in end_offsets(pipe.common, pipe.topic(Topic.DEDUP_RECORDS)).values()) - records


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_the_guarantee_switch_decides_whether_hops_use_transactions(pipeline: Pipeline, guarantee: str) -> None:
    inputs = items(f"mode-{guarantee}", 2000)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs)
    worker = pipeline.process(
        "counter", WORKER, COUNTER_INSTANCE="a", ONCEFLOW_PROCESSING_GUARANTEE=guarantee, ONCEFLOW_LOOP_MAX_BATCH_RECORDS="200",
        # at_least_once: a crash after the outputs were produced, before their offsets were committed
        ONCEFLOW_FAULT="after_produce@4" if guarantee == "at_least_once" else "",
    ).start()
    if guarantee == "at_least_once":
        assert worker.wait_exit(90) == -9, worker.log_tail()
        worker.start({"ONCEFLOW_FAULT": ""})
    eventually(lambda: len({checker.record_id(r) for r in _outputs(pipeline)}) >= len(inputs), 120, "every input processed")
    assert worker.terminate() == 0, worker.log_tail()
    outputs, ids = _outputs(pipeline), [i.record_id for i in inputs]
    if guarantee == "exactly_once":
        checker.DeliveryReport.of(outputs, ids).assert_exactly_once()
        assert _markers(pipeline, len(outputs)) > 0, "exactly_once wrote no transaction markers"
    else:
        # The crash may re-deliver any batch since the last offset commit: duplicates are allowed.
        checker.DeliveryReport.of(outputs, ids, allowed_duplicates=ids).assert_at_least_once()
        assert _markers(pipeline, len(outputs)) == 0, "at_least_once still wrote in transactions"


def test_at_least_once_never_commits_past_a_record_the_broker_refused(pipeline: Pipeline) -> None:
    """Without a transaction nothing aborts on its own: a refused record must fail the flush
    that precedes the offset commit, or the batch's offsets would be committed and it lost."""
    topic = pipeline.topic("tiny")  # under the test's prefix: deleted with the others
    admin = clients.admin(pipeline.common)
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[topic].result()
    producer = AtLeastOnceProducer(pipeline.common, "unused")
    producer.begin()
    producer.produce(topic, b"fits")
    producer.commit()
    producer.begin()
    producer.produce(topic, b"x" * 20_000)  # the broker refuses it: larger than the topic allows
    with pytest.raises(KafkaException, match="not delivered"):
        producer.commit()

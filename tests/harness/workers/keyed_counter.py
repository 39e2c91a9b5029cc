"""A reference stage for testing the shared loop: counts records per key (state in the
changelog-backed store) and emits one output envelope per input, tagged with its instance.

Run: python -m tests.harness.workers.keyed_counter  (env: ONCEFLOW_TOPIC_PREFIX,
COUNTER_INSTANCE, COUNTER_TRANSACTIONAL_ID, ONCEFLOW_LOOP_* and ONCEFLOW_FAULT)."""

from __future__ import annotations

import os
import signal
import sys

from confluent_kafka import Message

from onceflow import logs
from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.config import CommonSettings, LoopSettings
from onceflow.state.stores import Changelog
from onceflow.topology import Topic
from onceflow.txn import Batch, RecordStage, TransactionalLoop
from onceflow.v1.envelope_pb2 import Envelope

INPUT, OUTPUT, CHANGELOG, DLQ = Topic.INGEST_RECORDS, Topic.DEDUP_RECORDS, Topic.DEDUP_CHANGELOG, Topic.DEDUP_DLQ


class KeyedCounter(RecordStage):
    name = "counter"

    def __init__(self, output_topic: str, instance: str) -> None:
        self._output = output_topic
        self._instance = instance.encode()

    def process_record(self, record: Message, batch: Batch) -> None:
        envelope = decode_envelope(record.value())
        state = batch.state(record.partition())
        count = int(state.get(envelope.key) or b"0") + 1
        state.put(envelope.key, str(count).encode())
        out = Envelope(
            record_id=envelope.record_id,
            root_id=envelope.root_id,
            edge_id=new_id(),
            attempt=envelope.attempt,
            event_time_ms=envelope.event_time_ms,
            ingest_time_ms=envelope.ingest_time_ms,
            key=envelope.key,
            payload=str(count).encode(),
        )
        batch.emit(self._output, encode_envelope(out), key=envelope.key, headers=[("instance", self._instance)])


def main() -> None:
    common = CommonSettings()
    instance = os.environ.get("COUNTER_INSTANCE", "counter-0")
    logs.setup("counter", instance, common.log_level)
    loop = TransactionalLoop(
        stage=KeyedCounter(common.topic(OUTPUT), instance),
        common=common,
        settings=LoopSettings(),
        input_topic=common.topic(INPUT),
        group_id=common.topic("test-counter"),
        transactional_id=os.environ.get("COUNTER_TRANSACTIONAL_ID", common.topic(f"counter-{instance}")),
        dlq_topic=common.topic(DLQ),
        changelog=Changelog.in_memory(common.topic(CHANGELOG)),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop())
    sys.exit(loop.run())


if __name__ == "__main__":
    main()

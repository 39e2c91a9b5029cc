"""Test bolts that ack through the shared helper, as every real stage will.

- ``fanout``: ingest.records -> dedup.records, 1-3 children per record (decided by the
  record_id), acks its input with the children's edges. ``BOLT_DROP_PER_MILLE`` drops that
  share of first attempts without acking (they must time out and be replayed).
- ``leaf``: dedup.records -> nothing, acks each child.

Run: python -m tests.harness.workers.bolts fanout|leaf
"""

from __future__ import annotations

import os
import signal
import sys
import zlib

from onceflow import logs
from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.config import CommonSettings, LoopSettings
from onceflow.topology import Topic
from onceflow.txn import Batch, TransactionalLoop
from onceflow.v1.envelope_pb2 import Envelope


def fan_out_of(record_id: str) -> int:
    return 1 + zlib.crc32(record_id.encode()) % 3


def dropped(record_id: str, per_mille: int) -> bool:
    return zlib.crc32(b"drop:" + record_id.encode()) % 1000 < per_mille


class FanoutBolt:
    name = "fanout"

    def __init__(self, output: str, drop_per_mille: int) -> None:
        self._output = output
        self._drop = drop_per_mille

    def process(self, batch: Batch) -> None:
        for record in batch.records:
            envelope = decode_envelope(record.value())
            if envelope.attempt == 1 and dropped(envelope.record_id, self._drop):
                continue  # lost in a bolt: never acked
            children = []
            for index in range(fan_out_of(envelope.record_id)):
                child = Envelope(
                    record_id=envelope.record_id, root_id=envelope.root_id, edge_id=new_id(), attempt=envelope.attempt,
                    event_time_ms=envelope.event_time_ms, ingest_time_ms=envelope.ingest_time_ms,
                    key=envelope.key, payload=str(index).encode(),
                )
                children.append(child.edge_id)
                batch.emit(self._output, encode_envelope(child), key=envelope.key)
            batch.ack(envelope, children)


class LeafBolt:
    name = "leaf"

    def process(self, batch: Batch) -> None:
        for record in batch.records:
            batch.ack(decode_envelope(record.value()))


def main() -> None:
    role = sys.argv[1]
    common = CommonSettings()
    logs.setup(role, os.environ.get("BOLT_INSTANCE", "0"), common.log_level)
    if role == "fanout":
        stage, source = FanoutBolt(common.topic(Topic.DEDUP_RECORDS), int(os.environ.get("BOLT_DROP_PER_MILLE", "0"))), Topic.INGEST_RECORDS
    else:
        stage, source = LeafBolt(), Topic.DEDUP_RECORDS
    loop = TransactionalLoop(
        stage=stage,
        common=common,
        settings=LoopSettings(),
        input_topic=common.topic(source),
        group_id=common.topic(f"test-{role}"),
        transactional_id=common.topic(f"test-{role}-{os.environ.get('BOLT_INSTANCE', '0')}"),
        dlq_topic=common.topic(Topic.DEDUP_DLQ),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop())
    sys.exit(loop.run())


if __name__ == "__main__":
    main()

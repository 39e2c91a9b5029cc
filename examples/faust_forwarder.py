"""A Faust app that forwards a Kafka topic into onceflow (docs/client.md, "From a Faust app").

    pip install 'onceflow-client[faust]'
    FORWARD_TOPIC=orders python -m faust -A faust_forwarder worker -l info   # from examples/

The topic's messages are sent as they are: the key as the record's key, the value as its
payload, under the record id `kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>`,
with both ids read once at start (with confluent-kafka: `pip install 'onceflow-client[tail]'`;
without it, the ids' unknown parts are `-` and the forwarder says so). Configured by the environment:
ONCEFLOW_KAFKA_BOOTSTRAP (the topic's cluster), FORWARD_TOPIC, FORWARD_APP_ID (the Faust app id,
so its consumer group), ONCEFLOW_INGEST_ADDRESS, FORWARD_WAIT (committed or processed) and
FORWARD_BATCH.
"""

from __future__ import annotations

import os

import faust

from onceflow_client import AsyncIngestClient
from onceflow_client.faust import NO_ORIGIN, Origin, forward

BOOTSTRAP = os.environ.get("ONCEFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
TOPIC = os.environ.get("FORWARD_TOPIC", "orders")


def read_origin() -> Origin:
    """The cluster's id and the topic's id, which Faust's own client cannot read."""
    try:
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return NO_ORIGIN
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    cluster_id = admin.list_topics(timeout=15).cluster_id or ""
    topic_id = admin.describe_topics(TopicCollection([TOPIC]))[TOPIC].result(15).topic_id
    topic_id = "" if topic_id is None or str(topic_id) == "AAAAAAAAAAAAAAAAAAAAAA" else str(topic_id)  # none: an old broker
    return Origin(cluster_id, {TOPIC: topic_id})


app = faust.App(
    os.environ.get("FORWARD_APP_ID", "onceflow-forwarder"),
    broker=f"kafka://{BOOTSTRAP}",
    web_enabled=False,  # no HTTP port: several forwarders may share a host
    store="memory://",  # it keeps no tables
    consumer_auto_offset_reset="earliest",
    # A killed worker's partitions move to its successor once this passes (Faust's default: 60 s).
    broker_session_timeout=10.0,
    broker_heartbeat_interval=2.0,
)
source = app.topic(TOPIC, key_serializer="raw", value_serializer="raw")
ORIGIN = read_origin()


@app.agent(source)
async def forward_to_onceflow(stream: faust.StreamT) -> None:
    async with AsyncIngestClient(os.environ.get("ONCEFLOW_INGEST_ADDRESS", "127.0.0.1:15051")) as ingest:
        await forward(stream, ingest, origin=ORIGIN, batch=int(os.environ.get("FORWARD_BATCH", "200")),
                      wait="processed" if os.environ.get("FORWARD_WAIT") == "processed" else "committed")

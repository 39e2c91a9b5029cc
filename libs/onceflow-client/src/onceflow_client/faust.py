"""Forward a Faust agent's stream into onceflow (the `faust` extra: faust-streaming).

    app = faust.App("orders-forwarder", broker="kafka://127.0.0.1:19092", web_enabled=False)
    orders = app.topic("orders", key_serializer="raw", value_serializer="raw")

    # The cluster's id and the topic's id (kafka-topics.sh --describe prints both): read once.
    ORIGIN = Origin("MkU3OEVBNTcwNTJENDM2Qk", {"orders": "pN1uCbZfRYyfUvK2Hfu9Xw"})

    @app.agent(orders)
    async def forward_orders(stream):
        async with AsyncIngestClient("127.0.0.1:15051") as ingest:
            await forward(stream, ingest, origin=ORIGIN)

Faust is at-least-once: it commits a consumer offset some time after the events before it were
acknowledged, so a worker killed in between reads those events again when it restarts. Each
event is sent under a record id made from where it lives in the world,
``kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>`` (the Kafka source's default,
``onceflow_client.kafka_identity``), the same on every read, so onceflow's dedup gate drops the
second copy. Together that is exactly-once from the Faust topic to the result table, for copies
that arrive within the gate's horizon (`ONCEFLOW_DEDUP_HORIZON_MS`, 1 h by default) —
docs/client.md says where that stops holding.

Faust's Kafka client (aiokafka) cannot read topic ids, so the forwarder is given them: an
``Origin`` with the cluster id and each forwarded topic's id. Without one (or for a topic it does
not name) the unknown parts are written ``-``: such ids still never equal a complete id, but a
topic deleted and created again under its name, or a same-named topic of another cluster, would
collide with the old one's ids, and ``forward`` says so once with a WARNING.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from faust.streams import Stream
from faust.types import EventT

from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.ingest import AsyncIngestClient, RecordsRejected, Rejection, Wait
from onceflow_client.kafka_identity import KafkaOrigin, kafka_record_id
from onceflow_client.records import RecordLike
from onceflow_client.records import to_record as as_ingest_record

log = logging.getLogger(__name__)

Event = EventT[Any]  # a consumed message with its key, value and position
ToRecord = Callable[[Event], RecordLike]
OnRejected = Callable[[Event, Rejection], Awaitable[None] | None]


@dataclass(frozen=True)
class Origin:
    """The forwarded topics' cluster id, and each topic's id (``kafka-topics.sh --describe``
    prints it as ``TopicId``; it changes when a topic is deleted and created again)."""

    cluster_id: str
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def of(self, topic: str) -> KafkaOrigin:
        return KafkaOrigin(self.cluster_id, self.topic_ids.get(topic, ""))


NO_ORIGIN = Origin("")


def record_id(event: Event, origin: Origin = NO_ORIGIN) -> str:
    """Where the event lives in the world: the same id every time Faust reads it again."""
    message = event.message
    return kafka_record_id(origin.of(message.topic), message.topic, message.partition, message.offset)


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"a {type(value).__name__} key or value: give `to_record` for it, or use the raw serializer")


def raw_record(event: Event, origin: Origin = NO_ORIGIN) -> IngestRecord:
    """The default mapping: the message's key and value as they are (a topic read with
    ``key_serializer="raw", value_serializer="raw"``), under its place's record id."""
    return IngestRecord(record_id=record_id(event, origin).encode(), key=_as_bytes(event.key), payload=_as_bytes(event.value))


async def _log_rejection(event: Event, rejection: Rejection) -> None:
    log.error("onceflow refused %s (%s: %s); it is left out: pass on_rejected to keep such events elsewhere",
              rejection.record_id.decode(errors="replace") or record_id(event), rejection.field, rejection.message)


async def send_events(
    events: Sequence[Event],
    ingest: AsyncIngestClient,
    to_record: ToRecord | None = None,
    wait: Wait = "committed",
    on_rejected: OnRejected = _log_rejection,
    origin: Origin = NO_ORIGIN,
) -> int:
    """Send ``events`` (one call, retried by the client with the same records) and return how
    many ingest accepted. An event ``to_record`` (default: ``raw_record`` under ``origin``)
    cannot map, or whose record ingest refuses (INVALID_ARGUMENT), goes to ``on_rejected`` with
    the reason, and the rest are sent: one bad event never blocks the stream, and never silently
    disappears. A ``to_record`` of yours gives its own record ids: they are sent as they are."""
    mapping: ToRecord = to_record or (lambda event: raw_record(event, origin))
    pending: list[tuple[Event, IngestRecord]] = []
    for index, event in enumerate(events):
        try:
            pending.append((event, as_ingest_record(mapping(event))))
        except (TypeError, ValueError) as exc:
            await _reject(on_rejected, event, Rejection(index, "to_record", str(exc), record_id(event, origin).encode()))
    while pending:
        try:
            reply = await ingest.ingest([record for _event, record in pending], wait=wait)
            return int(reply.accepted)
        except RecordsRejected as refused:
            bad = {rejection.index for rejection in refused.rejections}
            if not bad:
                raise
            for rejection in refused.rejections:
                await _reject(on_rejected, pending[rejection.index][0], rejection)
            pending = [entry for index, entry in enumerate(pending) if index not in bad]
    return 0


async def _reject(on_rejected: OnRejected, event: Event, rejection: Rejection) -> None:
    outcome = on_rejected(event, rejection)
    if inspect.isawaitable(outcome):
        await outcome


async def forward(
    stream: Stream[Any],
    ingest: AsyncIngestClient,
    *,
    origin: Origin = NO_ORIGIN,
    to_record: ToRecord | None = None,
    batch: int = 500,
    within_s: float = 0.2,
    wait: Wait = "committed",
    on_rejected: OnRejected = _log_rejection,
) -> None:
    """An agent's body: take up to ``batch`` events (or what came within ``within_s``), send
    them, and only then let Faust acknowledge them, so that an offset is committed only behind
    events onceflow holds. Runs until the stream ends. ``origin``: the cluster id and the
    topics' ids in the default record ids (the module's docstring)."""
    forwarded = 0
    warned: set[str] = set()
    async for events in stream.take_events(batch, within=within_s):
        if to_record is None:
            _warn_incomplete(origin, {event.message.topic for event in events} - warned)
            warned.update(event.message.topic for event in events)
        forwarded += await send_events(events, ingest, to_record, wait, on_rejected, origin)
        log.info("forwarded %d events (%d in all)", len(events), forwarded)


def _warn_incomplete(origin: Origin, topics: set[str]) -> None:
    for topic in sorted(topics):
        if not origin.of(topic).complete:
            log.warning("forwarding %s without its %s: record ids fall back to %s, which a recreated topic or a "
                        "same-named topic of another cluster would repeat (pass origin=Origin(...))",
                        topic, "cluster id and topic id" if not origin.cluster_id else "topic id",
                        kafka_record_id(origin.of(topic), topic, 0, 0).removesuffix("/0/0") + "/<partition>/<offset>")

"""Forward a Faust agent's stream into onceflow (the `faust` extra: faust-streaming).

    app = faust.App("orders-forwarder", broker="kafka://127.0.0.1:19092", web_enabled=False)
    orders = app.topic("orders", key_serializer="raw", value_serializer="raw")

    @app.agent(orders)
    async def forward_orders(stream):
        async with AsyncIngestClient("127.0.0.1:15051") as ingest:
            await forward(stream, ingest)

Faust is at-least-once: it commits a consumer offset some time after the events before it were
acknowledged, so a worker killed in between reads those events again when it restarts. Each
event is sent under a record id made from where it lives (`topic/partition/offset`), the same
on every read, so onceflow's dedup gate drops the second copy. Together that is exactly-once
from the Faust topic to the result table, for copies that arrive within the gate's horizon
(`ONCEFLOW_DEDUP_HORIZON_MS`, 1 h by default) — docs/client.md says where that stops holding.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faust.streams import Stream
from faust.types import EventT

from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.ingest import AsyncIngestClient, RecordsRejected, Rejection, Wait
from onceflow_client.records import RecordLike
from onceflow_client.records import to_record as as_ingest_record

log = logging.getLogger(__name__)

Event = EventT[Any]  # a consumed message with its key, value and position
ToRecord = Callable[[Event], RecordLike]
OnRejected = Callable[[Event, Rejection], Awaitable[None] | None]


def record_id(event: Event) -> str:
    """Where the event lives: the same id every time Faust reads it again."""
    message = event.message
    return f"{message.topic}/{message.partition}/{message.offset}"


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"a {type(value).__name__} key or value: give `to_record` for it, or use the raw serializer")


def raw_record(event: Event) -> IngestRecord:
    """The default mapping: the message's key and value as they are (a topic read with
    ``key_serializer="raw", value_serializer="raw"``), under its position's record id."""
    return IngestRecord(record_id=record_id(event).encode(), key=_as_bytes(event.key), payload=_as_bytes(event.value))


async def _log_rejection(event: Event, rejection: Rejection) -> None:
    log.error("onceflow refused %s (%s: %s); it is left out: pass on_rejected to keep such events elsewhere",
              record_id(event), rejection.field, rejection.message)


async def send_events(
    events: Sequence[Event],
    ingest: AsyncIngestClient,
    to_record: ToRecord = raw_record,
    wait: Wait = "committed",
    on_rejected: OnRejected = _log_rejection,
) -> int:
    """Send ``events`` (one call, retried by the client with the same records) and return how
    many ingest accepted. An event ``to_record`` cannot map, or whose record ingest refuses
    (INVALID_ARGUMENT), goes to ``on_rejected`` with the reason, and the rest are sent: one bad
    event never blocks the stream, and never silently disappears."""
    pending: list[tuple[Event, IngestRecord]] = []
    for index, event in enumerate(events):
        try:
            pending.append((event, as_ingest_record(to_record(event))))
        except (TypeError, ValueError) as exc:
            await _reject(on_rejected, event, Rejection(index, "to_record", str(exc), record_id(event).encode()))
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
    to_record: ToRecord = raw_record,
    batch: int = 500,
    within_s: float = 0.2,
    wait: Wait = "committed",
    on_rejected: OnRejected = _log_rejection,
) -> None:
    """An agent's body: take up to ``batch`` events (or what came within ``within_s``), send
    them, and only then let Faust acknowledge them, so that an offset is committed only behind
    events onceflow holds. Runs until the stream ends."""
    forwarded = 0
    async for events in stream.take_events(batch, within=within_s):
        forwarded += await send_events(events, ingest, to_record, wait, on_rejected)
        log.info("forwarded %d events (%d in all)", len(events), forwarded)

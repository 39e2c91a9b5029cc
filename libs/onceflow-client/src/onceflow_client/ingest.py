"""Sending records to ingest, the way onceflow expects: a failed call is sent again with the
same records and the same record_ids until ingest says they are committed (or processed). A
re-send can leave a record twice in ingest.records (a lost reply, an unknown commit outcome);
the dedup gate drops the copy. Codes that cannot succeed on a re-send raise at once."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import grpc

from onceflow.v1 import ingest_pb2, ingest_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.addresses import default_address
from onceflow_client.records import RecordLike, to_record
from onceflow_client.tls import ClientTLS, aio_channel, bearer, sync_channel

log = logging.getLogger(__name__)

Wait = Literal["committed", "processed"]
_WAIT = {"committed": ingest_pb2.WAIT_FOR_COMMITTED, "processed": ingest_pb2.WAIT_FOR_PROCESSED}
# Worth sending again, with the same records: ingest or its broker was busy, restarting or slow.
RETRIABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})
# Ingest names the refused record: "records[3].record_id: ...".
_FIELD = re.compile(r"^records\[(\d+)\]\.(\w+): (.*)$", re.S)


@dataclass(frozen=True)
class Rejection:
    """One record ingest refused: its position in what was sent, the field and why."""

    index: int
    field: str
    message: str
    record_id: bytes = b""

    def __str__(self) -> str:
        return f"records[{self.index}].{self.field} ({self.record_id!r}): {self.message}"


class RecordsRejected(ValueError):
    """Ingest refused records (INVALID_ARGUMENT): sending them again cannot help. With a unary
    call nothing of the batch was written; with a stream, every other record was."""

    def __init__(self, rejections: Sequence[Rejection], detail: str = "") -> None:
        self.rejections = list(rejections)
        super().__init__("; ".join(map(str, self.rejections)) or detail)


@dataclass
class RetryPolicy:
    max_attempts: int = 50
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    call_timeout_s: float = 60.0
    # The most a server's retry-after-ms hint may make the client wait (issue 39): a hostile or
    # broken server cannot park the client for hours.
    max_retry_after_s: float = 30.0


@dataclass
class _Retries:
    """One call's retry schedule: which failures are worth another attempt, and how long to wait."""

    policy: RetryPolicy
    attempt: int = 0
    backoff_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.backoff_s = self.policy.backoff_s

    def next_wait(self, exc: grpc.RpcError, records: Sequence[IngestRecord]) -> float:
        """Seconds to wait before the next attempt; raises what the caller should see instead."""
        self.attempt += 1
        code = exc.code()
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise _rejected(exc, records) from None
        if code not in RETRIABLE or self.attempt >= self.policy.max_attempts:
            raise exc
        log.debug("ingest attempt %d: %s %s; sending again", self.attempt, code.name, exc.details())
        wait = max(min(_retry_after_s(exc), self.policy.max_retry_after_s), self.backoff_s)
        self.backoff_s = min(self.backoff_s * 2, self.policy.max_backoff_s)
        return wait


def _rejected(exc: grpc.RpcError, records: Sequence[IngestRecord]) -> RecordsRejected:
    details = exc.details() or ""
    match = _FIELD.match(details)
    if match is None:
        return RecordsRejected([], details)
    index = int(match[1])
    record_id = records[index].record_id if index < len(records) else b""
    return RecordsRejected([Rejection(index, match[2], match[3], record_id)], details)


def _retry_after_s(exc: grpc.RpcError) -> float:
    # (key, value) pairs: a tuple of them from a blocking call, an aio.Metadata that iterates as
    # them from an asyncio one (the stubs type neither so).
    trailers: Iterable[object] = exc.trailing_metadata() or ()
    for entry in trailers:
        if isinstance(entry, tuple) and entry[0] == "retry-after-ms":
            try:
                return max(0, int(entry[1])) / 1000
            except ValueError:
                return 0.0  # not a number: no hint
    return 0.0


def _request(records: Iterable[RecordLike], wait: Wait, stream: str = "") -> ingest_pb2.IngestRequest:
    if wait not in _WAIT:
        raise ValueError(f"wait: {wait!r}, want 'committed' or 'processed'")
    return ingest_pb2.IngestRequest(records=[to_record(r, stream) for r in records], wait=_WAIT[wait])


def _stream_result(reply: ingest_pb2.IngestReply, sent: Sequence[IngestRecord]) -> ingest_pb2.IngestReply:
    if reply.rejected:
        raise RecordsRejected(
            [Rejection(r.index, r.field.rsplit(".", 1)[-1], r.message, sent[r.index].record_id if r.index < len(sent) else b"")
             for r in reply.rejected]
        )
    return reply


class IngestClient:
    """Blocking. ``ingest`` sends one batch (one transaction); ``stream`` sends many batches on
    one call. Both retry retriable failures with the same records."""

    def __init__(
        self, address: str | None = None, policy: RetryPolicy | None = None, tls: ClientTLS | None = None, stream: str = "",
        token: str = "",
    ) -> None:
        # None: ingest's first instance in ONCEFLOW_SERVICES_CONFIG, else 127.0.0.1:15051.
        address = address or default_address("ingest")
        self.address = address
        # The producer's token (docs/decisions/0027): its record_ids are its own.
        self._metadata = bearer(token)
        # The named stream records belong to unless one names its own (docs/decisions/0025).
        self.record_stream = stream
        self.policy = policy or RetryPolicy()
        self._channel = sync_channel(address, tls)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)
        self.retries = 0

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def ingest(self, records: Iterable[RecordLike], wait: Wait = "committed") -> ingest_pb2.IngestReply:
        """Returns once every record is committed to ingest.records, or with ``wait="processed"``
        once each one's tuple tree completed. Raises RecordsRejected for invalid records (nothing
        written), else the last grpc.RpcError when attempts run out or a code is not retriable."""
        request = _request(records, wait, self.record_stream)
        retries = _Retries(self.policy)
        while True:
            try:
                reply: ingest_pb2.IngestReply = self._stub.Ingest(request, timeout=self.policy.call_timeout_s, metadata=self._metadata)
                return reply
            except grpc.RpcError as exc:
                pause = retries.next_wait(exc, request.records)
                self.retries += 1
                time.sleep(pause)

    def stream(self, batches: Iterable[Iterable[RecordLike]]) -> ingest_pb2.IngestReply:
        """Many batches on one call (each committed as ingest batches it). The batches are held
        so that a failed stream can be sent again whole; the gate drops what the first try wrote.
        Invalid records are refused one by one (RecordsRejected, raised after the rest committed)."""
        requests = [_request(batch, "committed", self.record_stream) for batch in batches]
        sent = [record for request in requests for record in request.records]
        retries = _Retries(self.policy)
        while True:
            try:
                return _stream_result(self._stub.IngestStream(iter(requests), timeout=self.policy.call_timeout_s, metadata=self._metadata), sent)
            except grpc.RpcError as exc:
                pause = retries.next_wait(exc, sent)
                self.retries += 1
                time.sleep(pause)


class AsyncIngestClient:
    """The same for asyncio (grpc.aio): ``await client.ingest(records)``; many calls may be in
    flight on one client."""

    def __init__(
        self, address: str | None = None, policy: RetryPolicy | None = None, tls: ClientTLS | None = None, stream: str = "",
        token: str = "",
    ) -> None:
        # None: ingest's first instance in ONCEFLOW_SERVICES_CONFIG, else 127.0.0.1:15051.
        address = address or default_address("ingest")
        self.address = address
        # The producer's token (docs/decisions/0027): its record_ids are its own.
        self._metadata = bearer(token)
        # The named stream records belong to unless one names its own (docs/decisions/0025).
        self.record_stream = stream
        self.policy = policy or RetryPolicy()
        self._channel = aio_channel(address, tls)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)
        self.retries = 0

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncIngestClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def ingest(self, records: Iterable[RecordLike], wait: Wait = "committed") -> ingest_pb2.IngestReply:
        request = _request(records, wait, self.record_stream)
        retries = _Retries(self.policy)
        while True:
            try:
                reply: ingest_pb2.IngestReply = await self._stub.Ingest(request, timeout=self.policy.call_timeout_s, metadata=self._metadata)
                return reply
            except grpc.RpcError as exc:
                pause = retries.next_wait(exc, request.records)
                self.retries += 1
                await asyncio.sleep(pause)

    async def stream(self, batches: Iterable[Iterable[RecordLike]] | AsyncIterable[Iterable[RecordLike]]) -> ingest_pb2.IngestReply:
        """As IngestClient.stream; an async iterable of batches is read whole first."""
        if isinstance(batches, AsyncIterable):
            batches = [batch async for batch in batches]
        requests = [_request(batch, "committed", self.record_stream) for batch in batches]
        sent = [record for request in requests for record in request.records]
        retries = _Retries(self.policy)
        while True:
            try:
                reply = await self._stub.IngestStream(iter(requests), timeout=self.policy.call_timeout_s, metadata=self._metadata)
                return _stream_result(reply, sent)
            except grpc.RpcError as exc:
                pause = retries.next_wait(exc, sent)
                self.retries += 1
                await asyncio.sleep(pause)

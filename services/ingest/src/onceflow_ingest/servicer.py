"""The gRPC Ingest service: validate at the boundary, then hand records to the group committer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

import grpc

from onceflow import metrics, streams
from onceflow.admin import CallSlots
from onceflow.codec import now_ms
from onceflow.producers import Producers
from onceflow.spout import Invalid, Limits, NewRecord, check_record, new_record
from onceflow.streams import StreamDirectory, StreamLookupFailed
from onceflow.trees import Waiter
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc

from onceflow_ingest.committer import GroupCommitter, NotCommitted, OutcomeUnknown, Overloaded
from onceflow_ingest.config import IngestSettings

log = logging.getLogger(__name__)

COMMIT_WAIT_S = 60.0
STREAM_BACKPRESSURE_WAIT_S = 30.0


class IngestServicer(ingest_pb2_grpc.IngestServicer):
    def __init__(
        self, settings: IngestSettings, committer: GroupCommitter, streams: StreamDirectory | None = None,
        producers: Producers | None = None,
    ) -> None:
        self._settings = settings
        # Who may send (docs/decisions/0027): None takes anonymous callers, unless required.
        self._producers = producers
        self._require_producer = settings.producer_required
        # None (unit tests of the servicer alone): every well-formed stream name is taken.
        self._streams = streams
        self._committer = committer
        self._limits = Limits(
            settings.max_payload_bytes, settings.max_key_bytes, settings.max_headers, settings.max_header_key_bytes,
            settings.max_header_value_bytes, settings.max_record_bytes, settings.common.event_time_max_ahead_ms,
        )
        self.accepted = 0
        self._slots = CallSlots(settings.max_concurrent_calls, settings.retry_after_ms)
        # Cleared by Admin Pause/Drain: calls then get UNAVAILABLE, nothing is queued.
        self.accepting = threading.Event()
        self.accepting.set()

    def Ingest(self, request: ingest_pb2.IngestRequest, context: grpc.ServicerContext) -> ingest_pb2.IngestReply:
        with self._slots.take(context, "Ingest"):
            return self._ingest(request, context)

    def _stream_exists(self, context: grpc.ServicerContext) -> Callable[[str], bool] | None:
        """The stream check for check_record: a broker that does not answer which streams exist
        is UNAVAILABLE (retried by clients), never a refusal of a record that may be valid."""
        directory = self._streams
        if directory is None:
            return None

        def exists(stream: str) -> bool:
            try:
                return directory.exists(stream)
            except StreamLookupFailed as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot tell which streams exist now ({exc}); retry")
                raise  # abort raises; this is for the type checker

        return exists

    def _producer(self, context: grpc.ServicerContext) -> str:
        """The caller's producer name, from its bearer token, else from the client certificate
        mutual TLS verified (an entry's ``certificate_cn``); "" for an anonymous caller where
        anonymous callers are taken. Refused (UNAUTHENTICATED) otherwise."""
        value = dict(context.invocation_metadata() or ()).get("authorization", "")
        presented = value if isinstance(value, str) else value.decode(errors="replace")
        scheme, _, token = presented.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""  # the scheme in any case, as the admin calls take it
        if not token and self._producers is not None:
            # Only a certificate the server's client CA verified is in the auth context.
            # grpcio gives a list of bytes per property (its stubs say bytes).
            common_names = cast(list[bytes], (context.auth_context() or {}).get("x509_common_name") or [])
            names = [cn.decode(errors="replace") for cn in common_names]
            certified = self._producers.name_of_certificate(names)
            if certified is not None:
                return certified
        if not token:
            if self._require_producer:
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "ingest takes records from known producers only: send `authorization: Bearer <your producer token>`, or "
                    "a client certificate a producer's certificate_cn names (ONCEFLOW_INGEST_PRODUCERS_FILE lists them; "
                    "docs/decisions/0027)",
                )
            return ""
        name = None if self._producers is None else self._producers.name_of(token)
        if name is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is no producer's (ONCEFLOW_INGEST_PRODUCERS_FILE)")
        return name or ""

    def _check_may_write(self, context: grpc.ServicerContext, producer: str, record: ingest_pb2.IngestRecord, where: str) -> None:
        """A producer bound to some streams (its entry's ``streams``) writes those only: the
        whole call is refused, nothing of it written (a stream's messages before stay)."""
        if not producer or self._producers is None:
            return
        stream = record.stream.decode(errors="replace")
        if not self._producers.may_write(producer, stream):
            metrics.REJECTED.labels("ingest", "stream").inc()
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{where}.stream: producer {producer} may write stream(s) {self._producers.streams_of(producer)}, not "
                f"{streams.display(stream)!r} (its entry in ONCEFLOW_INGEST_PRODUCERS_FILE)",
            )

    def _ingest(self, request: ingest_pb2.IngestRequest, context: grpc.ServicerContext) -> ingest_pb2.IngestReply:
        self._check_accepting(context)
        producer = self._producer(context)
        # Fields the record does not declare would pass into the envelope (its bytes are reused):
        # an Envelope field set that way (a producer, a first-append time) is dropped here.
        request.DiscardUnknownFields()
        waiter = None
        if request.wait == ingest_pb2.WAIT_FOR_PROCESSED:
            if not self._settings.acking:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "wait=WAIT_FOR_PROCESSED needs acking (ONCEFLOW_INGEST_ACKING=true) and a running acker",
                )
            waiter = Waiter(remaining=len(request.records))
        records = request.records
        if not records:
            self._reject(context, "empty", "records: empty batch, send at least one record")
        if len(records) > self._settings.max_request_records:
            self._reject(
                context,
                "too_many",
                f"records: {len(records)} records, the limit per request is {self._settings.max_request_records}",
            )
        ingest_time = now_ms()
        for index, record in enumerate(records):
            invalid = check_record(index, record, self._limits, now_ms=ingest_time, stream_exists=self._stream_exists(context))
            if invalid is not None:
                self._reject(context, invalid.kind, str(invalid))
            self._check_may_write(context, producer, record, f"records[{index}]")
        envelopes = _envelopes(records, ingest_time, producer)
        commit_id = self._commit(envelopes, context, block_s=0.0, waiter=waiter)
        if waiter is not None:
            self._wait_processed(waiter, commit_id, context)
        return ingest_pb2.IngestReply(accepted=len(envelopes), commit_ids=[commit_id])

    def _wait_processed(self, waiter: Waiter, commit_id: int, context: grpc.ServicerContext) -> None:
        """Each answer states a guarantee (docs/services/ingest.md): OK, every record settled;
        ABORTED, some record took no effect and never will; DEADLINE_EXCEEDED, committed and
        not known to be processed yet, so a retry with the same record_ids is safe."""
        timeout = context.time_remaining() or self._settings.processed_wait_s
        if not waiter.done.wait(max(0.0, min(timeout, self._settings.processed_wait_s))):
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"committed (commit {commit_id}) but {waiter.remaining} record(s) not yet fully processed; "
                "they are still in flight; retry with the same record_ids to wait again (copies are dropped)",
            )
        if waiter.failures:
            context.abort(grpc.StatusCode.ABORTED, "processing failed, and these records took no effect: "
                          + _first(waiter.failures))
        if waiter.unknown:
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"committed (commit {commit_id}); outcome unknown for {len(waiter.unknown)} record(s) whose trees timed "
                f"out, so they may still take effect: {_first(waiter.unknown)}; retry with the same record_ids "
                "(copies are dropped within the dedup horizon)",
            )

    def IngestStream(
        self, request_iterator: Iterator[ingest_pb2.IngestRequest], context: grpc.ServicerContext
    ) -> ingest_pb2.IngestReply:
        with self._slots.take(context, "IngestStream"):
            return self._ingest_stream(request_iterator, context)

    def _ingest_stream(
        self, request_iterator: Iterator[ingest_pb2.IngestRequest], context: grpc.ServicerContext
    ) -> ingest_pb2.IngestReply:
        reply = ingest_pb2.IngestReply()
        caps = _StreamCaps(self._settings)
        index = 0
        producer = self._producer(context)
        for request in request_iterator:
            self._check_accepting(context)
            request.DiscardUnknownFields()  # as in _ingest
            caps.check_message(context, index, reply.accepted)
            if request.wait == ingest_pb2.WAIT_FOR_PROCESSED:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "wait: WAIT_FOR_PROCESSED is only for unary Ingest")
            if len(request.records) > self._settings.max_request_records:
                before = f" ({reply.accepted} records of this stream were committed before this)" if reply.accepted else ""
                self._reject(
                    context, "too_many",
                    f"stream: a message of {len(request.records)} records, the limit per message is "
                    f"{self._settings.max_request_records}{before}",
                )
            ingest_time = now_ms()
            envelopes: list[NewRecord] = []
            message_start = index
            for record in request.records:
                invalid = check_record(
                    index, record, self._limits, field_prefix="stream", now_ms=ingest_time,
                    stream_exists=self._stream_exists(context),
                )
                if invalid is None:
                    self._check_may_write(context, producer, record, f"stream[{index}]")
                    envelopes.append(new_record(record, ingest_time, producer))
                else:
                    metrics.REJECTED.labels("ingest", invalid.kind).inc()
                    if len(reply.rejected) >= self._settings.stream_max_rejections:
                        self._reject(context, "too_many_rejected", caps.too_many_rejected(invalid, reply, message_start))
                    reply.rejected.append(
                        ingest_pb2.Rejection(index=invalid.index, field=invalid.field, message=invalid.message)
                    )
                index += 1
            if envelopes:
                # Streams block for room instead of failing at once: gRPC flow control then
                # slows the client down, which is what a stream wants.
                reply.commit_ids.append(self._commit(envelopes, context, block_s=STREAM_BACKPRESSURE_WAIT_S, so_far=reply.accepted))
                reply.accepted += len(envelopes)
        return reply

    def _commit(
        self, envelopes: list[NewRecord], context: grpc.ServicerContext, block_s: float, so_far: int = 0,
        waiter: Waiter | None = None,
    ) -> int:
        suffix = f" ({so_far} records of this stream were committed before this)" if so_far else ""
        try:
            submission = self._committer.submit(envelopes, block_s=block_s, waiter=waiter)
        except Overloaded as exc:
            context.set_trailing_metadata((("retry-after-ms", str(self._settings.retry_after_ms)),))
            metrics.REJECTED.labels("ingest", "overloaded").inc(len(envelopes))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{exc}; retry after {self._settings.retry_after_ms} ms{suffix}",
            )
        except NotCommitted as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc}; nothing was written{suffix}")
        try:
            commit_id = submission.wait(COMMIT_WAIT_S)
        except NotCommitted as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc}; nothing was written, retry{suffix}")
        except OutcomeUnknown as exc:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{exc}; retry with the same record_ids (duplicates are dropped downstream){suffix}",
            )
        self.accepted += len(envelopes)
        metrics.RECORDS_IN.labels("ingest").inc(len(envelopes))
        return commit_id

    def _check_accepting(self, context: grpc.ServicerContext) -> None:
        if not self.accepting.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "ingest is paused or drained by an operator; retry later")

    def _reject(self, context: grpc.ServicerContext, reason: str, message: str) -> None:
        metrics.REJECTED.labels("ingest", reason).inc()
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


class _StreamCaps:
    """One IngestStream's caps (issue 39): its messages, its age and (checked by the caller,
    which holds the reply) its rejections. Every refusal says exactly what was committed: the
    valid records before stream index ``index``, none from there on."""

    def __init__(self, settings: IngestSettings) -> None:
        self._settings = settings
        self._opened = time.monotonic()
        self._messages = 0

    def check_message(self, context: grpc.ServicerContext, index: int, accepted: int) -> None:
        self._messages += 1
        if self._messages > self._settings.stream_max_messages:
            self._exhausted(context, f"message {self._messages} is past the limit of "
                                     f"{self._settings.stream_max_messages} messages per stream", index, accepted)
        age_s = time.monotonic() - self._opened
        if age_s > self._settings.stream_max_age_s:
            self._exhausted(context, f"open for {age_s:.0f} s, past the limit of "
                                     f"{self._settings.stream_max_age_s:g} s per stream", index, accepted)

    def _exhausted(self, context: grpc.ServicerContext, why: str, index: int, accepted: int) -> None:
        metrics.REJECTED.labels("ingest", "stream_cap").inc()
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"stream: {why}; {_committed_before(index, accepted)}; send the rest on a new stream",
        )

    def too_many_rejected(self, invalid: Invalid, reply: ingest_pb2.IngestReply, message_start: int) -> str:
        first = reply.rejected[0] if reply.rejected else None
        shown = f"the first: {first.field}: {first.message}; " if first is not None else ""
        return (
            f"stream: more than {self._settings.stream_max_rejections} invalid records, the limit per stream "
            f"({shown}this one: {invalid}); {_committed_before(message_start, reply.accepted)}"
        )


def _committed_before(index: int, accepted: int) -> str:
    return (
        f"the {accepted} valid records before stream index {index} were committed, none from index {index} on"
    )


def _first(reasons: list[str], shown: int = 3) -> str:
    more = f" (and {len(reasons) - shown} more)" if len(reasons) > shown else ""
    return "; ".join(reasons[:shown]) + more


def _envelopes(records: Iterable[ingest_pb2.IngestRecord], ingest_time_ms: int, producer: str = "") -> list[NewRecord]:
    return [new_record(record, ingest_time_ms, producer) for record in records]


__all__ = ["IngestServicer", "Invalid"]

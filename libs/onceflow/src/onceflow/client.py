"""Python clients. For ingest, one that retries the way onceflow expects: the same records, with
the same record_ids, until ingest says they are committed. Retries can duplicate a record in
ingest.records (a lost reply, an unknown commit outcome); the dedup gate drops the copies. For
the sink's Query service, a whole result table read page by page."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from onceflow.admin.tls import ClientTLS, channel
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc, sink_pb2, sink_pb2_grpc

log = logging.getLogger(__name__)

RETRIABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


@dataclass
class RetryPolicy:
    max_attempts: int = 50
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    call_timeout_s: float = 60.0


class IngestClient:
    def __init__(self, address: str, policy: RetryPolicy | None = None, tls: ClientTLS | None = None) -> None:
        self.address = address
        self.policy = policy or RetryPolicy()
        self._channel = channel(address, tls)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)
        self.retries = 0

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def ingest(self, records: Sequence[ingest_pb2.IngestRecord]) -> ingest_pb2.IngestReply:
        """Send one batch; retry retriable failures with the same records. Raises the last
        grpc.RpcError for non-retriable failures (e.g. INVALID_ARGUMENT) or when attempts run out."""
        request = ingest_pb2.IngestRequest(records=records)
        backoff = self.policy.backoff_s
        for attempt in range(1, self.policy.max_attempts + 1):
            try:
                return self._stub.Ingest(request, timeout=self.policy.call_timeout_s)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code not in RETRIABLE or attempt == self.policy.max_attempts:
                    raise
                self.retries += 1
                hint = _retry_after_s(exc)
                log.debug("ingest attempt %d: %s %s; retrying", attempt, code.name, exc.details())  # type: ignore[attr-defined]
                time.sleep(max(hint, backoff))
                backoff = min(backoff * 2, self.policy.max_backoff_s)
        raise AssertionError("unreachable")


def _retry_after_s(exc: grpc.RpcError) -> float:
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "retry-after-ms":
            return int(value) / 1000
    return 0.0


SCAN_PAGE = 10_000  # the Query service's most rows per Scan


def scan_rows(
    stub: sink_pb2_grpc.QueryStub, job: str, prefix: str = "", timeout_s: float = 10.0, most: int | None = None,
) -> dict[str, bytes]:
    """Every row of ``job``'s result table under ``prefix`` (key -> value), or the first
    ``most`` found, page by page with the page token: a table of any size, each row once."""
    rows: dict[str, bytes] = {}
    token = b""
    while most is None or len(rows) < most:
        limit = SCAN_PAGE if most is None else min(SCAN_PAGE, most - len(rows))
        request = sink_pb2.ScanRowsRequest(job=job, prefix=prefix, limit=limit, page_token=token)
        reply = stub.Scan(request, timeout=timeout_s)
        rows.update((row.key, row.value) for row in reply.rows)
        token = reply.next_page_token
        if not token:
            break
    return rows

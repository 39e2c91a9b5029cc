"""Reading a job's result table, which the sink keeps in Redis, through its Query service: one
row, or the whole table a page at a time. Follow the page token and any table can be read
whole: a row present for the whole scan comes at least once (each exactly once when no one
writes meanwhile), one written or deleted meanwhile once, twice or not at all."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow_client.addresses import default_address
from onceflow_client.tls import ClientTLS, aio_channel, bearer, sync_channel

MAX_PAGE = 10_000  # the Query service's most rows per Scan


@dataclass(frozen=True)
class Page:
    rows: list[tuple[str, bytes]]
    next_token: bytes  # empty: the scan is complete


def _scan_request(job: str, prefix: str, limit: int, token: bytes) -> sink_pb2.ScanRowsRequest:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"page_size: {limit}, want 1 to {MAX_PAGE}")
    return sink_pb2.ScanRowsRequest(job=job, prefix=prefix, limit=limit, page_token=token)


def _page(reply: sink_pb2.ScanRowsReply) -> Page:
    return Page([(row.key, row.value) for row in reply.rows], reply.next_page_token)


def decode(value: bytes) -> Any:
    """A row's value as the sink wrote it: JSON."""
    return json.loads(value)


class QueryClient:
    """Blocking. ``token``: the read token, when the services require one (ONCEFLOW_READ_TOKEN)."""

    def __init__(self, address: str | None = None, token: str = "", tls: ClientTLS | None = None, timeout_s: float = 10.0) -> None:
        # None: the sink's first instance in ONCEFLOW_SERVICES_CONFIG, else 127.0.0.1:15055.
        address = address or default_address("sink")
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = bearer(token)
        self._channel = sync_channel(address, tls)
        self._stub = sink_pb2_grpc.QueryStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> QueryClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def get(self, job: str, key: str) -> bytes | None:
        """The row's value, or None when the table has no such key."""
        reply = self._stub.Get(sink_pb2.GetRowRequest(job=job, key=key), timeout=self.timeout_s, metadata=self._metadata)
        return reply.value if reply.found else None

    def page(self, job: str, prefix: str = "", page_size: int = 1000, token: bytes = b"") -> Page:
        """One page: up to ``page_size`` rows (maybe fewer, even none, while the scan goes on)."""
        reply = self._stub.Scan(_scan_request(job, prefix, page_size, token), timeout=self.timeout_s, metadata=self._metadata)
        return _page(reply)

    def scan(self, job: str, prefix: str = "", page_size: int = MAX_PAGE) -> Iterator[tuple[str, bytes]]:
        """Every row whose key starts with ``prefix``, page after page until the last."""
        token = b""
        while True:
            page = self.page(job, prefix, page_size, token)
            yield from page.rows
            token = page.next_token
            if not token:
                return

    def table(self, job: str, prefix: str = "") -> dict[str, bytes]:
        return dict(self.scan(job, prefix))


class AsyncQueryClient:
    """The same for asyncio (grpc.aio)."""

    def __init__(self, address: str | None = None, token: str = "", tls: ClientTLS | None = None, timeout_s: float = 10.0) -> None:
        # None: the sink's first instance in ONCEFLOW_SERVICES_CONFIG, else 127.0.0.1:15055.
        address = address or default_address("sink")
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = bearer(token)
        self._channel = aio_channel(address, tls)
        self._stub = sink_pb2_grpc.QueryStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncQueryClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def get(self, job: str, key: str) -> bytes | None:
        reply = await self._stub.Get(sink_pb2.GetRowRequest(job=job, key=key), timeout=self.timeout_s, metadata=self._metadata)
        return reply.value if reply.found else None

    async def page(self, job: str, prefix: str = "", page_size: int = 1000, token: bytes = b"") -> Page:
        reply = await self._stub.Scan(_scan_request(job, prefix, page_size, token), timeout=self.timeout_s, metadata=self._metadata)
        return _page(reply)

    async def scan(self, job: str, prefix: str = "", page_size: int = MAX_PAGE) -> AsyncIterator[tuple[str, bytes]]:
        token = b""
        while True:
            page = await self.page(job, prefix, page_size, token)
            for row in page.rows:
                yield row
            token = page.next_token
            if not token:
                return

    async def table(self, job: str, prefix: str = "") -> dict[str, bytes]:
        return {key: value async for key, value in self.scan(job, prefix)}

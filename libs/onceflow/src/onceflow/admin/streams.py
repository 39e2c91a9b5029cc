"""Streaming calls run in a pool of their own, under a budget, so no number of open streams can
take the threads that health checks and Admin calls need (issue 39).

A stream can stay open for as long as its client likes, and gRPC Python runs a blocking stream
on one thread for its whole life. Left in the server's main pool, forty idle ``Health/Watch``
or reflection streams, which need no token, took every thread and health checks timed out. So:

- every streaming method (request, response or both) runs in ``StreamBudget.pool``, never in
  the server's main pool, which keeps unary calls (``Health/Check``, Admin, Query) to itself;
- at most ``max_open`` streams are open at once, and at most ``threads`` of them are blocking
  (they hold a thread: reflection, ``IngestStream``). A stream past either is refused at once
  with RESOURCE_EXHAUSTED and a ``retry-after-ms`` hint rather than queued;
- a non-blocking stream (grpc-health's ``Watch``, which answers from a callback) takes a slot
  but no thread, so many watchers cost only memory, and that is bounded by ``max_open``.

A slot is given back when the call ends, however it ends (``context.add_callback``). The pool
has a few threads beyond ``threads`` so that refusals and the moment between a call's end and
its thread's return never wait behind held streams.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

# Threads of the stream pool beyond its blocking streams: refusals run there.
SPARE_THREADS = 4


class _Slot:
    """What one stream holds; released once, whichever of its end paths comes first."""

    def __init__(self, held: list[threading.BoundedSemaphore]) -> None:
        self._held = held
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for semaphore in held:
            semaphore.release()


class StreamBudget(grpc.ServerInterceptor):
    """Moves every streaming method into ``pool`` and caps open and blocking streams."""

    def __init__(self, service: str, *, threads: int, max_open: int, retry_after_ms: int = 1000) -> None:
        if threads < 1 or max_open < threads:
            raise ValueError(f"stream budget: want 1 <= threads ({threads}) <= max_open ({max_open})")
        self.threads = threads
        self.max_open = max_open
        self.pool = futures.ThreadPoolExecutor(threads + SPARE_THREADS, thread_name_prefix=f"{service}-stream")
        self._open = threading.BoundedSemaphore(max_open)
        self._blocking = threading.BoundedSemaphore(threads)
        self._retry_after_ms = retry_after_ms

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        method = handler_call_details.method
        serializers = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self._guarded(handler.stream_stream, method), **serializers)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(self._guarded(handler.stream_unary, method), **serializers)
        return grpc.unary_stream_rpc_method_handler(self._guarded(handler.unary_stream, method), **serializers)

    def _guarded(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        non_blocking = bool(getattr(behavior, "experimental_non_blocking", False))

        def call(request: Any, context: grpc.ServicerContext, *callback: Any) -> Any:
            slot = self._take(context, method, blocking=not non_blocking)
            if not context.add_callback(slot.release):  # the call has ended already
                slot.release()
            return behavior(request, context, *callback)

        call.experimental_thread_pool = self.pool  # type: ignore[attr-defined]
        call.experimental_non_blocking = non_blocking  # type: ignore[attr-defined]
        return call

    def _take(self, context: grpc.ServicerContext, method: str, *, blocking: bool) -> _Slot:
        if not self._open.acquire(blocking=False):
            self._refuse(context, f"{method}: {self.max_open} streams already open on this server, the limit")
        if not blocking:
            return _Slot([self._open])
        if not self._blocking.acquire(blocking=False):
            self._open.release()
            self._refuse(context, f"{method}: {self.threads} blocking streams already open on this server, the limit")
        return _Slot([self._blocking, self._open])

    def _refuse(self, context: grpc.ServicerContext, message: str) -> None:
        context.set_trailing_metadata((("retry-after-ms", str(self._retry_after_ms)),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{message}; retry after {self._retry_after_ms} ms")

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

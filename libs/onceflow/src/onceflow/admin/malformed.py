"""Requests that do not parse are the caller's fault, so they get INVALID_ARGUMENT.

grpcio answers a request its deserializer rejects with INTERNAL ("Exception deserializing
request!"), which reads as a server fault and tells the caller nothing. This interceptor moves
the parse into the handler: the bytes arrive raw, and a parse failure aborts with
INVALID_ARGUMENT naming the method and the parser's reason; a client stream's messages are parsed
one by one as the handler takes them. Every service's server has it.

The handler it builds keeps what the original said about how grpcio should run it: a
non-blocking stream (grpc-health's ``Watch`` answers from a callback and holds no thread) stays
non-blocking, and a handler's own thread pool stays its own. Dropping these made every idle
``Watch`` hold a server thread for its life (issue 39).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class MalformedRequestInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, method = handler.request_deserializer, handler_call_details.method
        if handler.request_streaming:
            return _streamed(handler, parse, method)

        def parsed(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[bytes, grpc.ServicerContext], Any]:
            def call(raw: bytes, context: grpc.ServicerContext, *callback: Any) -> Any:
                try:
                    request = parse(raw)
                except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or anything a parser raises
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request does not parse: {exc}")
                # A non-blocking behavior gets grpcio's send_response_callback as a third argument.
                return behavior(request, context, *callback)

            for how in ("experimental_non_blocking", "experimental_thread_pool"):
                if hasattr(behavior, how):
                    setattr(call, how, getattr(behavior, how))
            return call

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                parsed(handler.unary_stream), response_serializer=handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(parsed(handler.unary_unary), response_serializer=handler.response_serializer)


def _streamed(handler: Any, parse: Callable[[bytes], Any], method: str) -> Any:
    """A client stream (IngestStream, reflection): each message parsed as the handler takes it,
    a bad one aborting the call with INVALID_ARGUMENT and its index (grpcio's own parse answered
    UNKNOWN or INTERNAL)."""

    def parsed(behavior: Callable[..., Any]) -> Callable[..., Any]:
        def call(raw_messages: Any, context: grpc.ServicerContext, *callback: Any) -> Any:
            def requests() -> Any:
                for index, raw in enumerate(raw_messages):
                    try:
                        request = parse(raw)
                    except Exception as exc:  # noqa: BLE001 - as for a single request
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: message {index} does not parse: {exc}")
                    yield request

            return behavior(requests(), context, *callback)

        for how in ("experimental_non_blocking", "experimental_thread_pool"):
            if hasattr(behavior, how):
                setattr(call, how, getattr(behavior, how))
        return call

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(parsed(handler.stream_stream), response_serializer=handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(parsed(handler.stream_unary), response_serializer=handler.response_serializer)

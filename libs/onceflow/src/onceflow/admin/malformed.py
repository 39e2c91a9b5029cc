"""Requests that do not parse are the caller's fault, so they get INVALID_ARGUMENT.

grpcio answers a request its deserializer rejects with INTERNAL ("Exception deserializing
request!"), which reads as a server fault and tells the caller nothing. This interceptor moves
the parse into the handler: the bytes arrive raw, and a parse failure aborts with
INVALID_ARGUMENT naming the method and the parser's reason. Every service's server has it.

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
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler  # client streams (reflection) keep grpcio's own parsing
        parse, method = handler.request_deserializer, handler_call_details.method

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

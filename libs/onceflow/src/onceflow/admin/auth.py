"""Bearer-token auth for mutating admin calls."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

MUTATING_METHODS = frozenset(
    {
        "/onceflow.v1.Admin/Pause",
        "/onceflow.v1.Admin/Resume",
        "/onceflow.v1.Admin/Drain",
        "/onceflow.v1.DedupAdmin/Forget",
    }
)


def _deny(message: str) -> grpc.RpcMethodHandler:
    def handler(_request: Any, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(handler)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Mutating calls need ``authorization: Bearer <token>``. Tokens are compared in constant
    time and never logged."""

    def __init__(self, token: str, mutating: frozenset[str] = MUTATING_METHODS) -> None:
        self._token = token.encode()
        self._mutating = mutating

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method not in self._mutating:
            return continuation(handler_call_details)
        if not self._token:
            log.warning("refused %s: no admin token is configured on this server", method)
            return _deny("mutating admin calls are disabled: set ONCEFLOW_ADMIN_TOKEN on the server")
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = metadata.get("authorization", "")
        scheme, _, token = presented.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self._token):
            log.warning("refused %s: %s bearer token", method, "wrong" if presented else "missing")
            return _deny("missing or wrong bearer token")
        return continuation(handler_call_details)

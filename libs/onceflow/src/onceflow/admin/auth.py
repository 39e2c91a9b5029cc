"""Bearer tokens for the services' gRPC ports (docs/admin.md, "Threat model").

Every method is in one of three classes. Open: health checks and ingest's data plane. Read:
status, stats, lookups, result queries and reflection; they need the read token when one is
set (the admin token is accepted too). Everything else mutates: it needs the admin token, and
is refused outright when none is set. A new RPC is therefore protected by default: it is open
or read-only only once it is listed here."""

from __future__ import annotations

import collections
import enum
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow.config import CommonSettings, secret

log = logging.getLogger(__name__)

# The messages of the method an interceptor passes through, whatever they are.
Request = TypeVar("Request")
Response = TypeVar("Response")

OPEN_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/onceflow.v1.Ingest/Ingest",
        "/onceflow.v1.Ingest/IngestStream",
    }
)
READ_METHODS = frozenset(
    {
        "/onceflow.v1.Admin/Status",
        "/onceflow.v1.AckerAdmin/GetTree",
        "/onceflow.v1.AckerAdmin/ListPending",
        "/onceflow.v1.AckerAdmin/Stats",
        "/onceflow.v1.ComputeAdmin/ListJobs",
        "/onceflow.v1.ComputeAdmin/GetState",
        "/onceflow.v1.ComputeAdmin/Stats",
        "/onceflow.v1.DedupAdmin/Check",
        "/onceflow.v1.DedupAdmin/Stats",
        "/onceflow.v1.Query/Get",
        "/onceflow.v1.Query/Scan",
        "/onceflow.v1.JobAdmin/ListVersions",
        "/onceflow.v1.JobAdmin/VersionStatus",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)


class Access(enum.Enum):
    OPEN = "open"
    READ = "read"
    MUTATING = "mutating"


def access(method: str) -> Access:
    if method in OPEN_METHODS:
        return Access.OPEN
    return Access.READ if method in READ_METHODS else Access.MUTATING


@dataclass(frozen=True)
class Tokens:
    admin: str = ""
    read: str = ""

    @classmethod
    def from_settings(cls, common: CommonSettings) -> Tokens:
        """From ONCEFLOW_ADMIN_TOKEN[_FILE] and ONCEFLOW_READ_TOKEN[_FILE]."""
        return cls(
            secret(common.admin_token, common.admin_token_file, "ONCEFLOW_ADMIN_TOKEN"),
            secret(common.read_token, common.read_token_file, "ONCEFLOW_READ_TOKEN"),
        )


class ClientTokens(BaseSettings):
    """The tokens a client (the CLI, verify, a health probe) sends, from the same variables the
    services read, so one environment configures both ends."""

    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")
    admin_token: str = ""
    admin_token_file: str = ""
    read_token: str = ""
    read_token_file: str = ""

    def admin(self) -> str:
        return secret(self.admin_token, self.admin_token_file, "ONCEFLOW_ADMIN_TOKEN")

    def read(self) -> str:
        return secret(self.read_token, self.read_token_file, "ONCEFLOW_READ_TOKEN")

    def bearer(self) -> str:
        """For calls that bring no token of their own: the read token, else the admin token."""
        return self.read() or self.admin()


def _deny(message: str) -> grpc.RpcMethodHandler[Any, Any]:
    def handler(_request: Any, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(handler)


def _matches(presented: str | bytes, *tokens: str) -> bool:
    if isinstance(presented, bytes):  # only a "-bin" key carries bytes: never a bearer token
        return False
    scheme, _, token = presented.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return any(t and hmac.compare_digest(token.encode(), t.encode()) for t in tokens)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """``authorization: Bearer <token>`` checked per method class. Tokens are compared in
    constant time and never logged."""

    def __init__(self, tokens: Tokens) -> None:
        self._tokens = tokens

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Request, Response] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Request, Response] | None:
        method = handler_call_details.method
        kind = access(method)
        if kind is Access.OPEN or (kind is Access.READ and not self._tokens.read):
            return continuation(handler_call_details)
        if kind is Access.MUTATING and not self._tokens.admin:
            log.warning("refused %s: no admin token is configured on this server", method)
            return _deny("mutating admin calls are disabled: set ONCEFLOW_ADMIN_TOKEN on the server")
        presented = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        accepted = (self._tokens.admin,) if kind is Access.MUTATING else (self._tokens.read, self._tokens.admin)
        if not _matches(presented, *accepted):
            log.warning("refused %s: %s bearer token", method, "wrong" if presented else "missing")
            wanted = "the admin token" if kind is Access.MUTATING else "the read token (or the admin token)"
            return _deny(f"missing or wrong bearer token: {method} needs {wanted}")
        return continuation(handler_call_details)


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class _BearerClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to calls that carry none of their own."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = list(details.metadata or ())
        if any(key == "authorization" for key, _value in metadata):
            return details
        return _CallDetails(
            details.method, details.timeout, [*metadata, self._header], details.credentials,
            details.wait_for_ready, details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)


def with_bearer(channel: grpc.Channel, token: str) -> grpc.Channel:
    """``channel`` sending ``token`` on every call that does not bring its own (a read token for
    Status and Query; a mutating call passes the admin token itself)."""
    return grpc.intercept_channel(channel, _BearerClientInterceptor(token)) if token else channel

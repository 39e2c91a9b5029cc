"""The one client of the services' admin RPCs: `onceflow admin`, the pipeline view (`demo`,
`verify`) and the console reach a service through it. How a channel is opened (TLS, and which
bearer token reads carry), every RPC with its deadline, and what a failed call says are
decided here once; callers decide only what to show.

An RPC is a function of an open channel and a deadline (a mutating one also takes the admin
token it sends), so a caller may keep a channel open (the pipeline view), make one call on a
channel of its own (``call``), or hand it to ``fleet.query`` as the service's own read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from onceflow.admin.auth import ClientTokens
from onceflow.admin.tls import ClientTLS, channel
from onceflow.v1 import (
    acker_pb2,
    acker_pb2_grpc,
    admin_pb2,
    admin_pb2_grpc,
    compute_pb2,
    compute_pb2_grpc,
    dedup_pb2,
    dedup_pb2_grpc,
    sink_pb2,
    sink_pb2_grpc,
)
from onceflow_client.tls import bearer

T = TypeVar("T")
R = TypeVar("R", bound=Message)

# The token a channel sends on calls that bring none of their own. A function, read when the
# channel opens, so that an unreadable token file fails the call like an unreadable TLS file.
Bearer = Callable[[], str]


def env_token() -> str:
    """ONCEFLOW_READ_TOKEN, else ONCEFLOW_ADMIN_TOKEN (or their _FILEs): the CLI's reads."""
    return ClientTokens().bearer()


def read_token() -> str:
    """ONCEFLOW_READ_TOKEN only: the console never lends its environment's admin token."""
    return ClientTokens().read()


def no_token() -> str:
    """No token at all: the pipeline view's reads of the services demo and verify start."""
    return ""


def open_channel(address: str, tls: ClientTLS | None, reads: Bearer = env_token) -> grpc.Channel:
    """TLS when ``tls`` is given; calls that bring no token of their own carry ``reads()``.
    Raises ValueError when a TLS or token file cannot be read."""
    return channel(address, tls, bearer=reads())


# The code of a call that got no channel: a TLS (or token) file could not be read.
NO_CHANNEL = "TLS"


@dataclass(frozen=True)
class CallFailed(Exception):
    """A call that did not succeed: which service, the status (or NO_CHANNEL) and why."""

    address: str
    code: str
    details: str

    def __str__(self) -> str:
        return f"{self.address}: {self.code}: {self.details}"


def call(address: str, tls: ClientTLS | None, fn: Callable[[grpc.Channel], T], reads: Bearer = env_token) -> T:
    """``fn`` on a channel of its own (``open_channel``), closed after; a failure is a CallFailed."""
    try:
        chan = open_channel(address, tls, reads)
    except ValueError as exc:
        raise CallFailed(address, NO_CHANNEL, str(exc)) from None
    with chan:
        try:
            return fn(chan)
        except grpc.RpcError as exc:
            raise CallFailed(address, exc.code().name, exc.details() or "") from None


def as_dict(reply: Message) -> dict[str, Any]:
    """A reply as JSON: the proto's field names, and every field, also those at their default."""
    return MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def reply(kind: type[R], answer: object) -> R:
    """A stub's answer as the ``kind`` of reply it is. grpcio-tools writes no types for the
    ``*_pb2_grpc`` stubs, so each call's result is checked here, where it enters typed code."""
    if not isinstance(answer, kind):
        raise TypeError(f"expected a {kind.__name__}, got a {type(answer).__name__}")
    return answer


# Every service's Admin. Mutations need the admin token; ``token`` empty sends the channel's.


def status(chan: grpc.Channel, timeout_s: float) -> admin_pb2.StatusReply:
    answer = admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=timeout_s)
    return reply(admin_pb2.StatusReply, answer)


def pause(chan: grpc.Channel, timeout_s: float, token: str) -> admin_pb2.PauseReply:
    answer = admin_pb2_grpc.AdminStub(chan).Pause(admin_pb2.PauseRequest(), timeout=timeout_s, metadata=bearer(token))
    return reply(admin_pb2.PauseReply, answer)


def resume(chan: grpc.Channel, timeout_s: float, token: str) -> admin_pb2.ResumeReply:
    answer = admin_pb2_grpc.AdminStub(chan).Resume(admin_pb2.ResumeRequest(), timeout=timeout_s, metadata=bearer(token))
    return reply(admin_pb2.ResumeReply, answer)


def drain(chan: grpc.Channel, wait_s: int, timeout_s: float, token: str) -> admin_pb2.DrainReply:
    """The service waits up to ``wait_s`` for its in-flight work; the call, ``timeout_s`` more."""
    request = admin_pb2.DrainRequest(timeout_seconds=wait_s)
    answer = admin_pb2_grpc.AdminStub(chan).Drain(request, timeout=wait_s + timeout_s, metadata=bearer(token))
    return reply(admin_pb2.DrainReply, answer)


# The acker's own.


def acker_stats(chan: grpc.Channel, timeout_s: float) -> acker_pb2.AckerStatsReply:
    answer = acker_pb2_grpc.AckerAdminStub(chan).Stats(acker_pb2.AckerStatsRequest(), timeout=timeout_s)
    return reply(acker_pb2.AckerStatsReply, answer)


def get_tree(chan: grpc.Channel, timeout_s: float, *, root_id: int | None = None, record_id: str = "") -> acker_pb2.GetTreeReply:
    """The pending tree ``root_id`` or, without one, ``record_id``'s pending trees."""
    request = acker_pb2.GetTreeRequest(root_id=root_id) if root_id is not None else acker_pb2.GetTreeRequest(record_id=record_id)
    return reply(acker_pb2.GetTreeReply, acker_pb2_grpc.AckerAdminStub(chan).GetTree(request, timeout=timeout_s))


def list_pending(chan: grpc.Channel, timeout_s: float, limit: int, older_than_ms: int) -> acker_pb2.ListPendingReply:
    request = acker_pb2.ListPendingRequest(limit=limit, older_than_ms=older_than_ms)
    return reply(acker_pb2.ListPendingReply, acker_pb2_grpc.AckerAdminStub(chan).ListPending(request, timeout=timeout_s))


# The dedup gate's own.


def dedup_stats(chan: grpc.Channel, timeout_s: float) -> dedup_pb2.DedupStatsReply:
    answer = dedup_pb2_grpc.DedupAdminStub(chan).Stats(dedup_pb2.DedupStatsRequest(), timeout=timeout_s)
    return reply(dedup_pb2.DedupStatsReply, answer)


def dedup_check(chan: grpc.Channel, timeout_s: float, record_id: str, stream: str = "", producer: str = "") -> dedup_pb2.CheckReply:
    request = dedup_pb2.CheckRequest(record_id=record_id, stream=stream, producer=producer)
    return reply(dedup_pb2.CheckReply, dedup_pb2_grpc.DedupAdminStub(chan).Check(request, timeout=timeout_s))


def forget(
    chan: grpc.Channel, timeout_s: float, token: str, record_id: str, stream: str = "", producer: str = ""
) -> dedup_pb2.ForgetReply:
    request = dedup_pb2.ForgetRequest(record_id=record_id, stream=stream, producer=producer)
    answer = dedup_pb2_grpc.DedupAdminStub(chan).Forget(request, timeout=timeout_s, metadata=bearer(token))
    return reply(dedup_pb2.ForgetReply, answer)


# A compute worker's own.


def compute_stats(chan: grpc.Channel, timeout_s: float) -> compute_pb2.ComputeStatsReply:
    answer = compute_pb2_grpc.ComputeAdminStub(chan).Stats(compute_pb2.ComputeStatsRequest(), timeout=timeout_s)
    return reply(compute_pb2.ComputeStatsReply, answer)


def list_jobs(chan: grpc.Channel, timeout_s: float) -> compute_pb2.ListJobsReply:
    answer = compute_pb2_grpc.ComputeAdminStub(chan).ListJobs(compute_pb2.ListJobsRequest(), timeout=timeout_s)
    return reply(compute_pb2.ListJobsReply, answer)


def get_state(chan: grpc.Channel, timeout_s: float, job: str, key: str) -> compute_pb2.GetStateReply:
    request = compute_pb2.GetStateRequest(job=job, key=key)
    return reply(compute_pb2.GetStateReply, compute_pb2_grpc.ComputeAdminStub(chan).GetState(request, timeout=timeout_s))


# The sink's result tables.


def scan_rows(chan: grpc.Channel, timeout_s: float, job: str, prefix: str, limit: int, page_token: bytes) -> sink_pb2.ScanRowsReply:
    request = sink_pb2.ScanRowsRequest(job=job, prefix=prefix, limit=limit, page_token=page_token)
    return reply(sink_pb2.ScanRowsReply, sink_pb2_grpc.QueryStub(chan).Scan(request, timeout=timeout_s))


# A service's own Stats call, where it has one: the read fleet.query makes after Status.
STATS: dict[str, Callable[[grpc.Channel, float], Message]] = {
    "acker": acker_stats,
    "dedup": dedup_stats,
    "compute": compute_stats,
}

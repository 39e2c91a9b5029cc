"""Every gRPC call the console makes beyond the poller's reads: record lookups, result pages and
the operator's actions. Reads carry only the read token (ONCEFLOW_READ_TOKEN), never the admin
token, even when the console's environment has one: an action is authorised by the token the
operator types with it, or refused by the service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

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

T = TypeVar("T")
ACTIONS = ("pause", "resume", "drain")
DRAIN_TIMEOUT_S = 30


def read_bearer() -> str:
    return ClientTokens().read()


def open_channel(address: str, tls: ClientTLS | None) -> grpc.Channel:
    return channel(address, tls, bearer=read_bearer())


@dataclass(frozen=True)
class CallFailed(Exception):
    """A call that did not succeed, as the page says it: which service, the status and why."""

    address: str
    code: str
    details: str

    def __str__(self) -> str:
        return f"{self.address}: {self.code}: {self.details}"


def call(address: str, tls: ClientTLS | None, fn: Callable[[grpc.Channel], T]) -> T:
    try:
        chan = open_channel(address, tls)
    except ValueError as exc:
        raise CallFailed(address, "TLS", str(exc)) from None
    with chan:
        try:
            return fn(chan)
        except grpc.RpcError as exc:
            raise CallFailed(address, exc.code().name, exc.details() or "") from None  # type: ignore[attr-defined]


def _metadata(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def admin_action(address: str, tls: ClientTLS | None, action: str, token: str, timeout_s: float) -> str:
    """Pause, resume or drain one instance; the state it reports after."""
    def run(ch: grpc.Channel) -> str:
        stub = admin_pb2_grpc.AdminStub(ch)
        meta = _metadata(token)
        if action == "pause":
            return stub.Pause(admin_pb2.PauseRequest(), timeout=timeout_s, metadata=meta).state
        if action == "resume":
            return stub.Resume(admin_pb2.ResumeRequest(), timeout=timeout_s, metadata=meta).state
        reply = stub.Drain(
            admin_pb2.DrainRequest(timeout_seconds=DRAIN_TIMEOUT_S), timeout=DRAIN_TIMEOUT_S + timeout_s, metadata=meta
        )
        return reply.state if reply.drained else f"{reply.state} (not drained within {DRAIN_TIMEOUT_S} s)"

    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    return call(address, tls, run)


def forget(address: str, tls: ClientTLS | None, record_id: str, token: str, timeout_s: float) -> dedup_pb2.ForgetReply:
    return call(
        address, tls,
        lambda ch: dedup_pb2_grpc.DedupAdminStub(ch).Forget(
            dedup_pb2.ForgetRequest(record_id=record_id), timeout=timeout_s, metadata=_metadata(token)
        ),
    )


def pending_trees(address: str, tls: ClientTLS | None, record_id: str, timeout_s: float) -> list[acker_pb2.TreeInfo]:
    reply = call(
        address, tls,
        lambda ch: acker_pb2_grpc.AckerAdminStub(ch).GetTree(acker_pb2.GetTreeRequest(record_id=record_id), timeout=timeout_s),
    )
    return list(reply.trees)


def gate_check(address: str, tls: ClientTLS | None, record_id: str, timeout_s: float) -> dedup_pb2.CheckReply:
    return call(
        address, tls,
        lambda ch: dedup_pb2_grpc.DedupAdminStub(ch).Check(dedup_pb2.CheckRequest(record_id=record_id), timeout=timeout_s),
    )


def jobs(address: str, tls: ClientTLS | None, timeout_s: float) -> list[compute_pb2.JobInfo]:
    reply = call(address, tls, lambda ch: compute_pb2_grpc.ComputeAdminStub(ch).ListJobs(compute_pb2.ListJobsRequest(), timeout=timeout_s))
    return list(reply.jobs)


def scan_page(
    address: str, tls: ClientTLS | None, job: str, prefix: str, limit: int, token: bytes, timeout_s: float
) -> sink_pb2.ScanRowsReply:
    request = sink_pb2.ScanRowsRequest(job=job, prefix=prefix, limit=limit, page_token=token)
    return call(address, tls, lambda ch: sink_pb2_grpc.QueryStub(ch).Scan(request, timeout=timeout_s))


def get_row(address: str, tls: ClientTLS | None, job: str, key: str, timeout_s: float) -> sink_pb2.GetRowReply:
    request = sink_pb2.GetRowRequest(job=job, key=key)
    return call(address, tls, lambda ch: sink_pb2_grpc.QueryStub(ch).Get(request, timeout=timeout_s))

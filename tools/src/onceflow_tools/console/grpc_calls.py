"""Every gRPC call the console makes beyond the poller's reads, through `admin_client`: record
lookups, result pages and the operator's actions. Reads carry only the read token
(ONCEFLOW_READ_TOKEN), never the admin token, even when the console's environment has one: an
action is authorised by the token the operator types with it, or refused by the service."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from onceflow.admin.tls import ClientTLS
from onceflow.v1 import acker_pb2, compute_pb2, dedup_pb2, sink_pb2
from onceflow_tools import admin_client

T = TypeVar("T")
ACTIONS = ("pause", "resume", "drain")
DRAIN_TIMEOUT_S = 30


def _call(address: str, tls: ClientTLS | None, fn: Callable[[grpc.Channel], T]) -> T:
    return admin_client.call(address, tls, fn, reads=admin_client.read_token)


def admin_action(address: str, tls: ClientTLS | None, action: str, token: str, timeout_s: float) -> str:
    """Pause, resume or drain one instance; the state it reports after."""
    def run(ch: grpc.Channel) -> str:
        if action == "pause":
            return admin_client.pause(ch, timeout_s, token).state
        if action == "resume":
            return admin_client.resume(ch, timeout_s, token).state
        reply = admin_client.drain(ch, DRAIN_TIMEOUT_S, timeout_s, token)
        return reply.state if reply.drained else f"{reply.state} (not drained within {DRAIN_TIMEOUT_S} s)"

    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    return _call(address, tls, run)


def forget(address: str, tls: ClientTLS | None, record_id: str, token: str, timeout_s: float) -> dedup_pb2.ForgetReply:
    return _call(address, tls, lambda ch: admin_client.forget(ch, timeout_s, token, record_id))


def pending_trees(address: str, tls: ClientTLS | None, record_id: str, timeout_s: float) -> list[acker_pb2.TreeInfo]:
    return list(_call(address, tls, lambda ch: admin_client.get_tree(ch, timeout_s, record_id=record_id)).trees)


def gate_check(address: str, tls: ClientTLS | None, record_id: str, timeout_s: float) -> dedup_pb2.CheckReply:
    return _call(address, tls, lambda ch: admin_client.dedup_check(ch, timeout_s, record_id))


def jobs(address: str, tls: ClientTLS | None, timeout_s: float) -> list[compute_pb2.JobInfo]:
    return list(_call(address, tls, lambda ch: admin_client.list_jobs(ch, timeout_s)).jobs)


def scan_page(
    address: str, tls: ClientTLS | None, job: str, prefix: str, limit: int, token: bytes, timeout_s: float
) -> sink_pb2.ScanRowsReply:
    return _call(address, tls, lambda ch: admin_client.scan_rows(ch, timeout_s, job, prefix, limit, token))

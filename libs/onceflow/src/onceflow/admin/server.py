"""One gRPC server per service: the service's own RPCs plus Admin, grpc.health.v1 and reflection."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from onceflow import __version__, faults
from onceflow.admin.auth import TokenAuthInterceptor, Tokens
from onceflow.admin.malformed import MalformedRequestInterceptor
from onceflow.admin.streams import StreamBudget
from onceflow.admin.tls import ServerTLS
from onceflow.config import CommonSettings
from onceflow.v1 import admin_pb2, admin_pb2_grpc

log = logging.getLogger(__name__)


@dataclass
class StatusSnapshot:
    state: str
    partitions: list[tuple[str, int, int, int]] = field(default_factory=list)  # topic, partition, position, lag
    transactions_committed: int = 0
    transactions_aborted: int = 0
    records_in: int = 0
    records_out: int = 0
    last_error: str = ""
    gauges: dict[str, float] = field(default_factory=dict)


class AdminControls(Protocol):
    """What a service hands the Admin service."""

    def status(self) -> StatusSnapshot: ...

    def pause(self) -> str: ...

    def resume(self) -> str: ...

    def drain(self, timeout_s: float) -> tuple[str, bool]: ...


@dataclass(frozen=True)
class FixedControls:
    """Admin for a process that runs no loop (a worker refusing its job, a test's server): Status
    always says ``state`` and ``last_error``; Pause, Resume and Drain change nothing."""

    state: str
    last_error: str = ""

    def status(self) -> StatusSnapshot:
        return StatusSnapshot(state=self.state, last_error=self.last_error)

    def pause(self) -> str:
        return self.state

    def resume(self) -> str:
        return self.state

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        return self.state, True


# Server threads kept free of data-plane calls, so health checks and Admin calls are answered
# however many slow calls (wait=PROCESSED, idle streams, big scans) are open.
RESERVED_FOR_ADMIN = 8
# A server's main pool, unless the service sizes it (ingest does).
MAX_WORKERS = 32
# In-flight calls a server holds per thread (running or queued) before refusing new ones.
MAX_QUEUED_PER_THREAD = 4
# Streams (admin/streams.py): blocking ones hold a thread of the stream pool each; non-blocking
# ones (health Watch) only a slot. Neither ever takes a thread of the main pool.
STREAM_THREADS = 8
MAX_OPEN_STREAMS = 256
# Streams past the budget are in flight for the moment it takes to refuse them.
SPARE_STREAM_CALLS = 64

# Connections, whoever holds them (gRPC core enforces these below Python, so they hold even
# when every thread is busy):
CONNECTION_OPTIONS: tuple[tuple[str, int], ...] = (
    # A connection with no call for 5 minutes is closed: idle connections cost a socket each.
    ("grpc.max_connection_idle_ms", 5 * 60_000),
    # Every connection is told to go away after 30 minutes and closed 5 minutes later, with any
    # stream still on it: no stream outlives 35 minutes, however idle its client keeps it.
    ("grpc.max_connection_age_ms", 30 * 60_000),
    ("grpc.max_connection_age_grace_ms", 5 * 60_000),
    # The server pings a connection silent for a minute and closes it when no answer comes in
    # 20 s: a half-open peer (gone without a FIN) does not hold its streams for good.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # Keepalive enforcement: a client pinging more often than every 10 s is sent GOAWAY.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 2),
)


class CallSlots:
    """A cap on a service's concurrent data-plane calls (``limit``; the server runs ``limit`` +
    ``RESERVED_FOR_ADMIN`` threads). A call past it is refused at once with RESOURCE_EXHAUSTED
    and a retry hint, instead of waiting for a thread the health checker needs too."""

    def __init__(self, limit: int, retry_after_ms: int = 200) -> None:
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)
        self._retry_after_ms = retry_after_ms

    @contextmanager
    def take(self, context: grpc.ServicerContext, what: str) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            context.set_trailing_metadata((("retry-after-ms", str(self._retry_after_ms)),))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{what}: {self.limit} calls already in progress, the limit; retry after {self._retry_after_ms} ms",
            )
        try:
            yield
        finally:
            self._free.release()


class _AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, service: str, instance: str, controls: AdminControls, test_switches: list[str]) -> None:
        self._service = service
        self._instance = instance
        self._controls = controls
        self._started = time.monotonic()
        self._test_switches = test_switches

    def Status(self, request: admin_pb2.StatusRequest, context: grpc.ServicerContext) -> admin_pb2.StatusReply:
        snap = self._controls.status()
        return admin_pb2.StatusReply(
            service=self._service,
            instance=self._instance,
            version=__version__,
            state=snap.state,
            partitions=[
                admin_pb2.PartitionStatus(topic=t, partition=p, position=pos, lag=lag)
                for t, p, pos, lag in snap.partitions
            ],
            transactions_committed=snap.transactions_committed,
            transactions_aborted=snap.transactions_aborted,
            records_in=snap.records_in,
            records_out=snap.records_out,
            last_error=snap.last_error,
            uptime_seconds=time.monotonic() - self._started,
            gauges=snap.gauges,
            test_switches=self._test_switches,
        )

    def Pause(self, request: admin_pb2.PauseRequest, context: grpc.ServicerContext) -> admin_pb2.PauseReply:
        log.info("admin: pause")
        return admin_pb2.PauseReply(state=self._controls.pause())

    def Resume(self, request: admin_pb2.ResumeRequest, context: grpc.ServicerContext) -> admin_pb2.ResumeReply:
        log.info("admin: resume")
        return admin_pb2.ResumeReply(state=self._controls.resume())

    def Drain(self, request: admin_pb2.DrainRequest, context: grpc.ServicerContext) -> admin_pb2.DrainReply:
        timeout = request.timeout_seconds or 30
        log.info("admin: drain (timeout %ss)", timeout)
        state, drained = self._controls.drain(float(timeout))
        return admin_pb2.DrainReply(state=state, drained=drained)


class ServedSettings(Protocol):
    """What every service's settings say about its gRPC server."""

    @property
    def instance(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def common(self) -> CommonSettings: ...


class ServiceServer:
    """Builds and runs the gRPC server. ``add_servicers`` registers the service's own RPCs;
    ``service_names`` lists their full names for reflection and health; ``tls`` (from
    ``ServerTLS.from_settings(common)``) switches the port from plaintext to TLS."""

    def __init__(
        self,
        *,
        service: str,
        instance: str,
        host: str,
        port: int,
        controls: AdminControls,
        tokens: Tokens,
        add_servicers: Callable[[grpc.Server], None] = lambda _server: None,
        service_names: tuple[str, ...] = (),
        max_workers: int = MAX_WORKERS,
        tls: ServerTLS | None = None,
        max_receive_bytes: int = 4 * 1024 * 1024,
        stream_threads: int = STREAM_THREADS,
        max_open_streams: int = MAX_OPEN_STREAMS,
    ) -> None:
        # Every service builds its server here, at start: the one place to refuse a sabotaged
        # build that was not explicitly allowed, and to say which test switches are on.
        test_switches = faults.guard_switches(service)
        self._streams = StreamBudget(service, threads=stream_threads, max_open=max(max_open_streams, stream_threads))
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"{service}-grpc"),
            # The stream budget wraps the parsed handler, so it sees (and keeps) whether the
            # method is non-blocking; the token check comes first, so a refused call takes no slot.
            interceptors=[TokenAuthInterceptor(tokens), self._streams, MalformedRequestInterceptor()],
            # Calls waiting for a thread are held in memory: past this many in flight, grpcio
            # refuses new ones with RESOURCE_EXHAUSTED instead of queueing without bound. Open
            # streams count too, so they get their own share: they can never fill the unary one.
            maximum_concurrent_rpcs=max_workers * MAX_QUEUED_PER_THREAD + self._streams.max_open + SPARE_STREAM_CALLS,
            # gRPC's own default: admin and query requests are small. Ingest sizes it to its caps.
            options=[("grpc.max_receive_message_length", max_receive_bytes), *CONNECTION_OPTIONS],
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        admin_pb2_grpc.add_AdminServicer_to_server(_AdminServicer(service, instance, controls, test_switches), self._server)
        add_servicers(self._server)
        names = (
            admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
            *service_names,
        )
        reflection.enable_server_reflection(names, self._server)
        self._service_names = (*service_names, admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name)
        if tls is None:
            bound = self._server.add_insecure_port(f"{host}:{port}")
        else:
            bound = self._server.add_secure_port(f"{host}:{port}", tls.credentials())
        if bound == 0:
            raise OSError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{bound}"
        self._transport = "plaintext" if tls is None else tls.mode

    @classmethod
    def for_service(
        cls,
        service: str,
        settings: ServedSettings,
        controls: AdminControls,
        *,
        add_servicers: Callable[[grpc.Server], None] = lambda _server: None,
        service_names: tuple[str, ...] = (),
        max_workers: int = MAX_WORKERS,
        max_receive_bytes: int = 4 * 1024 * 1024,
        stream_threads: int = STREAM_THREADS,
    ) -> ServiceServer:
        """``service``'s server where its settings put it, with the deployment's tokens and TLS."""
        return cls(
            service=service, instance=settings.instance, host=settings.host, port=settings.port, controls=controls,
            tokens=Tokens.from_settings(settings.common), tls=ServerTLS.from_settings(settings.common),
            add_servicers=add_servicers, service_names=service_names, max_workers=max_workers,
            max_receive_bytes=max_receive_bytes, stream_threads=stream_threads,
        )

    def start(self) -> None:
        self._server.start()
        self.set_serving(True)
        log.info("gRPC on %s (%s)", self.address, self._transport)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self._service_names):
            self._health.set(name, status)

    def stop(self, grace_s: float) -> None:
        """Refuse new calls, let running ones finish for up to ``grace_s``."""
        self.set_serving(False)
        self._server.stop(grace_s).wait()
        self._streams.shutdown()

"""A live view of a running pipeline, from the services' own admin calls: what each hop has
done, how fast, and what is still in flight (pending trees, dropped duplicates, the compute
watermark, rows applied). A service that does not answer shows as restarting, not as an error:
the view is for watching faults happen."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
from rich.table import Table

from onceflow.v1 import admin_pb2
from onceflow_tools import admin_client

_CALL_TIMEOUT_S = 1.0


@dataclass
class _Rate:
    """Per-second rate of a counter between two reads."""

    last: tuple[float, float] | None = None
    value: float = 0.0

    def update(self, count: float) -> float:
        now = time.monotonic()
        if self.last is not None and now > self.last[0]:
            self.value = max(0.0, (count - self.last[1]) / (now - self.last[0]))
        self.last = (now, count)
        return self.value


@dataclass
class PipelineView:
    """``addresses``: service name -> gRPC address (ingest, acker, dedup, compute, sink).
    ``event_time_origin_ms``: watermarks are shown as seconds of event time past it."""

    addresses: dict[str, str]
    event_time_origin_ms: int = 0
    notes: list[str] = field(default_factory=list)
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)
    _rates: dict[str, _Rate] = field(default_factory=dict)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def _channel(self, service: str) -> grpc.Channel:
        if service not in self._channels:
            # Plaintext, no token: the view reads the services demo and verify start on loopback.
            address = self.addresses[service]
            self._channels[service] = admin_client.open_channel(address, None, reads=admin_client.no_token)
        return self._channels[service]

    def _rate(self, name: str, count: float) -> str:
        return f"{self._rates.setdefault(name, _Rate()).update(count):,.0f}/s"

    def _status(self, service: str) -> admin_pb2.StatusReply:
        return admin_client.status(self._channel(service), _CALL_TIMEOUT_S)

    def rows(self) -> list[tuple[str, str, str]]:
        """(service, rate, what it reports) per service, read now."""
        rows = []
        for service, read in (
            ("ingest", self._ingest),
            ("acker", self._acker),
            ("dedup", self._dedup),
            ("compute", self._compute),
            ("sink", self._sink),
        ):
            if service not in self.addresses:
                continue
            try:
                rate, text = read()
            except grpc.RpcError as exc:
                rate, text = "", f"[yellow]not answering ({exc.code().name})[/]"
            rows.append((service, rate, text))
        return rows

    def render(self) -> Table:
        table = Table(show_header=True, header_style="bold", expand=False)
        table.add_column("service")
        table.add_column("rate", justify="right")
        table.add_column("progress")
        for service, rate, text in self.rows():
            table.add_row(service, rate, text)
        for note in self.notes[-4:]:
            table.add_row("", "", note)
        return table

    def _ingest(self) -> tuple[str, str]:
        status = self._status("ingest")
        pending = status.gauges.get("pending", 0.0)
        return self._rate("ingest", status.records_out), f"{status.records_out:,} records committed · {pending:,.0f} trees in flight"

    def _acker(self) -> tuple[str, str]:
        stats = admin_client.acker_stats(self._channel("acker"), _CALL_TIMEOUT_S)
        return (
            self._rate("acker", stats.completed),
            f"{stats.completed:,} trees completed · {stats.pending:,} pending · {stats.timed_out:,} timed out · "
            f"p99 {stats.tree_latency_p99_ms:,.0f} ms",
        )

    def _dedup(self) -> tuple[str, str]:
        stats = admin_client.dedup_stats(self._channel("dedup"), _CALL_TIMEOUT_S)
        return (
            self._rate("dedup", stats.passed + stats.dropped),
            f"{stats.passed:,} passed · {stats.dropped:,} duplicates dropped · fast path {stats.fast_path_ratio:.1%}",
        )

    def _compute(self) -> tuple[str, str]:
        stats = admin_client.compute_stats(self._channel("compute"), _CALL_TIMEOUT_S)
        if stats.watermark_ms < 0:
            watermark = "watermark: none yet"
        else:
            watermark = f"watermark at {(stats.watermark_ms - self.event_time_origin_ms) / 1000:+,.1f} s of event time"
        return (
            self._rate("compute", stats.records_in),
            f"{stats.records_in:,} records · {stats.results:,} result changes · {watermark} · batch {stats.batch_size:,}",
        )

    def _sink(self) -> tuple[str, str]:
        status = self._status("sink")
        lag = sum(p.lag for p in status.partitions)
        return self._rate("sink", status.records_out), f"{status.records_out:,} changes applied to Redis · lag {lag:,}"

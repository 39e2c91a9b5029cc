"""Prometheus metrics shared by every service (label ``service``), served over HTTP."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

TRANSACTIONS = Counter(
    "onceflow_transactions_total", "Kafka transactions by outcome", ["service", "outcome"]
)
RECORDS_IN = Counter("onceflow_records_in_total", "Records consumed or accepted", ["service"])
RECORDS_OUT = Counter("onceflow_records_out_total", "Records produced (outputs, not changelog)", ["service"])
DEAD_LETTERS = Counter("onceflow_dead_letters_total", "Records sent to a DLQ", ["service"])
REJECTED = Counter("onceflow_rejected_total", "Records refused at the boundary", ["service", "reason"])
COMMIT_SECONDS = Histogram(
    "onceflow_commit_seconds",
    "Time from begin_transaction to a committed transaction",
    ["service"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
BATCH_RECORDS = Histogram(
    "onceflow_batch_records", "Records per transaction", ["service"], buckets=(1, 10, 100, 500, 1000, 5000)
)
PENDING = Gauge("onceflow_pending_records", "Records accepted but not yet committed/processed", ["service"])
LAG = Gauge("onceflow_lag_records", "Records behind the input's high watermark, per partition", ["service", "partition"])
STAGE_FAILURES = Counter(
    "onceflow_stage_failures_total", "Batches a stage failed on as a whole (retried after a backoff)", ["service"]
)
STORE_REPAIRS = Counter(
    "onceflow_store_repairs_total",
    "Partition stores (Redis) rebuilt from Kafka after they were found to have lost or rolled back writes",
    ["service"],
)
RESTORED = Counter("onceflow_restored_records_total", "Changelog records applied on restore", ["service"])


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on the service's bind address; port 0 disables."""
    if port:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%d/metrics", host, port)

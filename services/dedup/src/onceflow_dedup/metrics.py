"""The gate's own Prometheus metrics (the loop's shared ones carry service="dedup")."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECORDS = Counter("onceflow_dedup_records_total", "Records through the gate", ["outcome"])
FAST_PATH = Counter("onceflow_dedup_fast_path_total", "New records proven new by the Bloom filters alone")
STORE_READS = Counter("onceflow_dedup_store_reads_total", "Exact-store lookups after a filter said maybe")
FALSE_POSITIVES = Counter("onceflow_dedup_false_positives_total", "Maybe answers the exact store proved new")
EXPIRED = Counter("onceflow_dedup_expired_ids_total", "Ids dropped by GC past the horizon")
CLOCK_SKEW = Gauge(
    "onceflow_dedup_ingest_clock_skew_seconds",
    "The largest distance, over the last minute, between a writer's clock (ingest_time) and the broker's log-append time, "
    "by direction; measured only, it moves no horizon",
    ["direction"],
)

"""Dedup gate settings: ONCEFLOW_DEDUP_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow import topology
from onceflow.config import (
    CommonSettings,
    LoopSettings,
    ServiceSettings,
    grpc_port_setting,
    instance_setting,
    metrics_port_setting,
)

from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.gate import AckMode


class DedupSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_DEDUP_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="The gate's exact store is Redis (`ONCEFLOW_REDIS_*`; a `redis+sentinel://` URL follows a Sentinel "
        "failover: docs/redis.md); it also uses the Kafka ones, the topic prefix, the transaction timeout, the "
        "tokens, TLS and the log level.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="The gate's loop over `ingest.records`; every `ONCEFLOW_LOOP_PUNCTUATE_MS` it also drops the buckets "
        "past the horizon (GC).",
    )
    port: int = grpc_port_setting(topology.DEDUP_SERVICE)
    metrics_port: int = metrics_port_setting(topology.DEDUP_SERVICE)
    instance: str = instance_setting(topology.DEDUP_SERVICE)
    bucket_ms: int = Field(
        default=60_000,
        ge=1,
        description="Ids are filed by their record's log-append time on `ingest.records` (the broker's clock) in "
        "buckets this wide, one Bloom filter per bucket.",
    )
    horizon_ms: int = Field(
        default=3_600_000,
        ge=1,
        description="How long, on the broker's clock, ids are recognised: buckets past it are dropped. A replay whose "
        "original is older is refused (`dedup.dlq`), never passed.",
    )
    expected_per_bucket: int = Field(
        default=100_000, ge=1, description="Filter sizing: records expected per bucket per partition."
    )
    false_positive_rate: float = Field(
        default=0.001,
        gt=0,
        lt=1,
        description="The gate's target false-positive rate: the share of new records that still cost an exact-store "
        "(Redis) read.",
    )
    ack_mode: AckMode = Field(
        default=AckMode.FORWARD,
        description="`forward`: a later stage (compute) acks the record; `terminal`: the tree ends at the gate; "
        "`off`: ingest runs without acking.",
    )
    rekey: bool = Field(
        default=True,
        description="Key `dedup.records` by the envelope's grouping key (when it has one) instead of `record_id`.",
    )
    gc_limit: int = Field(
        default=20_000,
        ge=1,
        description="At most this many ids tombstoned per partition per punctuation (bounds the GC's transactions).",
    )
    filters_enabled: bool = Field(
        default=True,
        description="`false`: no filters, every lookup reads the exact store (the benchmark's baseline only).",
    )

    @model_validator(mode="after")
    def _spec_is_valid(self) -> DedupSettings:
        self.spec  # noqa: B018 - raises a clear error at startup, not at the first record
        return self

    @property
    def spec(self) -> BucketSpec:
        return BucketSpec(self.bucket_ms, self.horizon_ms, self.expected_per_bucket, self.false_positive_rate)

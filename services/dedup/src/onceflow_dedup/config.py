"""Dedup gate settings: ONCEFLOW_DEDUP_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings

from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.gate import AckMode


class DedupSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_DEDUP_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)
    host: str = "127.0.0.1"
    port: int = Field(default=15053, ge=0, le=65535)
    metrics_port: int = Field(default=9103, ge=0, le=65535)
    # Stable across restarts: the transactional.id derives from it.
    instance: str = "dedup-0"
    # One Bloom filter per bucket of ingest time; ids are recognised for the horizon.
    bucket_ms: int = Field(default=60_000, ge=1)
    horizon_ms: int = Field(default=3_600_000, ge=1)
    # Sizing: records expected per bucket per partition, and the gate's target false-positive
    # rate (the share of new records that still cost an exact-store read).
    expected_per_bucket: int = Field(default=100_000, ge=1)
    false_positive_rate: float = Field(default=0.001, gt=0, lt=1)
    # forward: a later stage (compute) acks the record; terminal: the tree ends at the gate;
    # off: ingest runs without acking.
    ack_mode: AckMode = AckMode.FORWARD
    # Key dedup.records by the envelope's grouping key (when it has one) instead of record_id.
    rekey: bool = True
    # At most this many ids tombstoned per partition per punctuation (bounds GC transactions).
    gc_limit: int = Field(default=20_000, ge=1)
    # Benchmarks only: no filters, every lookup reads the exact store.
    filters_enabled: bool = True

    @model_validator(mode="after")
    def _spec_is_valid(self) -> DedupSettings:
        self.spec  # noqa: B018 - raises a clear error at startup, not at the first record
        return self

    @property
    def spec(self) -> BucketSpec:
        return BucketSpec(self.bucket_ms, self.horizon_ms, self.expected_per_bucket, self.false_positive_rate)

    @property
    def transactional_id(self) -> str:
        return topology.DEDUP.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def group_id(self) -> str:
        return topology.DEDUP.group_id(self.common.topic_prefix)

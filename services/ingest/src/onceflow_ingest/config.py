"""Ingest settings: ONCEFLOW_INGEST_* (plus the common ONCEFLOW_* ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings

RECORD_ID_MAX_BYTES = 256  # part of the contract (docs/services/ingest.md), not a tunable


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_INGEST_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    host: str = "127.0.0.1"
    port: int = Field(default=15051, ge=0, le=65535)
    metrics_port: int = Field(default=9101, ge=0, le=65535)
    # Stable across restarts: the transactional.id derives from it, so a restarted instance
    # fences its own zombie.
    instance: str = "ingest-0"
    # Storm's max.spout.pending: records accepted but not yet committed (later: not yet
    # processed). Past it, callers get RESOURCE_EXHAUSTED with a retry hint.
    max_pending: int = Field(default=50_000, ge=1)
    max_request_records: int = Field(default=10_000, ge=1)
    # Ingest and IngestStream calls in progress at once (wait=PROCESSED and streams can stay
    # open for long); past it, RESOURCE_EXHAUSTED. Health and Admin keep threads of their own.
    max_concurrent_calls: int = Field(default=24, ge=1, le=1024)
    # One Ingest call or stream message, serialized: gRPC refuses more (RESOURCE_EXHAUSTED)
    # before ingest reads it.
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    # Kafka's default message.max.bytes is ~1 MiB; leave room for the envelope and a batch.
    max_payload_bytes: int = Field(default=256 * 1024, ge=1, le=900 * 1024)
    max_key_bytes: int = Field(default=4096, ge=1)
    # Headers are the caller's, copied into the envelope: bounded like the payload.
    max_headers: int = Field(default=32, ge=0)
    max_header_key_bytes: int = Field(default=256, ge=1)
    max_header_value_bytes: int = Field(default=16 * 1024, ge=1)
    # The whole serialized record, so one record can never make a group commit too large for Kafka.
    max_record_bytes: int = Field(default=512 * 1024, ge=1, le=900 * 1024)
    # Group commit: one transaction carries what concurrent callers sent, up to this many.
    max_transaction_records: int = Field(default=5_000, ge=1)
    retry_after_ms: int = Field(default=200, ge=1)
    # Storm-style acking: each record's INIT goes to the acker with the record, in-flight trees
    # count against max_pending, TIMED_OUT/FAILED trees are replayed. Needs an acker running.
    acking: bool = True
    # A tree not fully acked within this is TIMED_OUT and replayed.
    tree_timeout_ms: int = Field(default=30_000, ge=100)
    # Attempts per record (1 = never replay); then the record goes to ingest.dlq.
    max_attempts: int = Field(default=3, ge=1)
    # How long a wait=PROCESSED call may wait for its trees when the client sets no deadline.
    processed_wait_s: float = Field(default=120.0, gt=0)
    shutdown_grace_s: float = Field(default=10.0, ge=0)

    loop: LoopSettings = Field(default_factory=LoopSettings)

    @property
    def transactional_id(self) -> str:
        return topology.INGEST.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def replayer_transactional_id(self) -> str:
        return topology.INGEST_REPLAYER.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def replayer_group_id(self) -> str:
        return topology.INGEST_REPLAYER.group_id(self.common.topic_prefix)

"""Ingest settings: ONCEFLOW_INGEST_* (plus the common ONCEFLOW_* ones)."""

from __future__ import annotations

from pathlib import Path

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from onceflow import topology
from onceflow.producers import Producers, is_loopback
from onceflow.config import (
    CommonSettings,
    LoopSettings,
    ServiceSettings,
    grpc_port_setting,
    instance_setting,
    metrics_port_setting,
)


RequireProducer = Literal["auto", "true", "false"]


class IngestSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_INGEST_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="Ingest uses the Kafka ones, the topic prefix, the transaction timeout, the tokens (Ingest, "
        "IngestStream and health are always open: docs/admin.md), TLS and the log level; it needs no Redis.",
    )
    port: int = grpc_port_setting(topology.INGEST_SERVICE)
    metrics_port: int = metrics_port_setting(topology.INGEST_SERVICE)
    instance: str = instance_setting(topology.INGEST_SERVICE)
    max_pending: int = Field(
        default=50_000,
        ge=1,
        description="Storm's max.spout.pending: trees in flight (with acking), else records accepted but not yet "
        "committed. Past it, callers get `RESOURCE_EXHAUSTED` with a retry hint.",
    )
    max_request_records: int = Field(
        default=10_000, ge=1, description="Records per Ingest call, and per IngestStream message."
    )
    stream_max_rejections: int = Field(
        default=1_000,
        ge=0,
        description="Rejections an IngestStream collects for its reply; the next invalid record ends the stream with "
        "`INVALID_ARGUMENT`, saying what was committed (the reply lists every rejection, so it must be bounded).",
    )
    stream_max_messages: int = Field(
        default=100_000,
        ge=1,
        description="Messages per IngestStream; the next ends it with `RESOURCE_EXHAUSTED`, saying what was committed: "
        "open a new stream for the rest.",
    )
    stream_max_age_s: float = Field(
        default=600.0,
        gt=0,
        description="How long an IngestStream may stay open: a message after it ends the stream with "
        "`RESOURCE_EXHAUSTED`, saying what was committed. An idle stream ends with its connection's age limit "
        "(docs/admin.md).",
    )
    max_concurrent_calls: int = Field(
        default=24,
        ge=1,
        le=1024,
        description="Ingest and IngestStream calls in progress at once (wait=PROCESSED and streams can stay open "
        "for long); past it, `RESOURCE_EXHAUSTED`. Health and Admin keep 8 threads of their own.",
    )
    producers_file: str = Field(
        default="",
        description="A TOML file of the producers ingest takes records from: one `[[producer]]` each, with its `name` "
        "and the `token_sha256` of its bearer token (`onceflow producer add`). A producer's record_ids are its own: "
        "no other caller can drop its records by sending their ids first (docs/decisions/0027).",
    )
    require_producer: RequireProducer = Field(
        default="auto",
        description="`true`: refuse callers without a producer's token (UNAUTHENTICATED); `false`: take anonymous "
        "callers too; `auto`: required when ingest binds beyond loopback (`ONCEFLOW_INGEST_HOST`), which then needs a "
        "producers file to start.",
    )
    max_request_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="One Ingest call or stream message, serialized: gRPC refuses more (`RESOURCE_EXHAUSTED`) before "
        "ingest reads it. The other services keep gRPC's 4 MiB.",
    )
    max_payload_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        le=900 * 1024,
        description="A record's payload. At most 900 KiB: Kafka's default `message.max.bytes` is about 1 MiB, and the "
        "envelope and a batch need room.",
    )
    max_key_bytes: int = Field(default=4096, ge=1, description="A record's key.")
    max_headers: int = Field(
        default=32,
        ge=0,
        description="Headers per record: they are the caller's, copied into the envelope, so bounded like the payload.",
    )
    max_header_key_bytes: int = Field(default=256, ge=1, description="A header's name.")
    max_header_value_bytes: int = Field(default=16 * 1024, ge=1, description="A header's value.")
    max_record_bytes: int = Field(
        default=512 * 1024,
        ge=1,
        le=900 * 1024,
        description="The whole serialized record, headers included, so that one record can never make a group "
        "commit too large for Kafka.",
    )
    max_transaction_records: int = Field(
        default=5_000,
        ge=1,
        description="Group commit: one transaction carries what concurrent callers sent, up to this many records.",
    )
    linger_ms: int = Field(
        default=0,
        ge=0,
        description="Group commit, after a first call: how long to wait for more before committing (the shared "
        "batching policy, docs/architecture.md). 0: a transaction takes what queued during the last commit; callers "
        "wait for their commit, so concurrent calls make the batches.",
    )
    retry_after_ms: int = Field(
        default=200,
        ge=1,
        description="The retry hint sent with `RESOURCE_EXHAUSTED` (trailer `retry-after-ms`).",
    )
    acking: bool = Field(
        default=True,
        description="Storm-style acking: each record's INIT goes to the acker with the record, trees in flight count "
        "against `max_pending`, and `wait=PROCESSED` answers once a record's tree completes; needs an acker running.",
    )
    tree_timeout_ms: int = Field(
        default=30_000,
        ge=100,
        description="A tree not fully acked within this is TIMED_OUT: counted and logged, and a `wait=PROCESSED` caller "
        "is told its outcome is unknown (retriable); replayed only with `replay`.",
    )
    replay: bool = Field(
        default=False,
        description="Replay TIMED_OUT and FAILED trees (Storm's at-least-once), up to `max_attempts`, then `ingest.dlq`. "
        "Off by default: every hop commits its input with its outputs, so a timed-out tree is late, not lost, and a "
        "replay can only add a copy (docs/decisions/0022). For stages outside the transactions that can lose records.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        description="With `replay`: attempts per record (1: never replay), then the record goes to `ingest.dlq`.",
    )
    processed_wait_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a wait=PROCESSED call may wait for its trees when the client sets no deadline.",
    )
    shutdown_grace_s: float = Field(
        default=10.0, ge=0, description="On SIGTERM: how long calls in progress get to commit."
    )

    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="With acking on, the replayer runs on the shared loop: it reads `acker.events` in batches as "
        "these say and writes the replays.",
    )

    @property
    def producer_required(self) -> bool:
        if self.require_producer == "auto":
            return not is_loopback(self.host)
        return self.require_producer == "true"

    @model_validator(mode="after")
    def _producers_known_where_required(self) -> IngestSettings:
        if self.producers_file:
            Producers.load(Path(self.producers_file))  # a file that cannot be used fails at start, naming the entry
        elif self.producer_required:
            raise ValueError(
                f"ingest binds {self.host}, beyond loopback, and takes records from known producers only: set "
                "ONCEFLOW_INGEST_PRODUCERS_FILE (`onceflow producer add NAME`), or ONCEFLOW_INGEST_REQUIRE_PRODUCER=false "
                "to take anonymous callers, whose record_ids any other caller can take first (docs/decisions/0027)"
            )
        return self

    def producers(self) -> Producers | None:
        return Producers.load(Path(self.producers_file)) if self.producers_file else None

    @property
    def transactional_id(self) -> str:
        """The group committer's: ingest's spout, which no consumer loop runs."""
        return self.transactional_id_of(topology.INGEST)

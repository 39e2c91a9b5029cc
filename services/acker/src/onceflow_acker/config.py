"""Acker settings: ONCEFLOW_ACKER_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings


class AckerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_ACKER_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="The acker uses the Kafka ones, the topic prefix, the transaction timeout, the tokens, TLS and the "
        "log level; it needs no Redis.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="The acker's loop over `acker.acks`; `ONCEFLOW_LOOP_PUNCTUATE_MS` is also the interval of its "
        "timeout sweep.",
    )
    host: str = Field(
        default="127.0.0.1",
        description="The address the gRPC and metrics ports bind to (loopback unless you say otherwise).",
    )
    port: int = Field(default=15052, ge=0, le=65535, description="The gRPC port: AckerAdmin, Admin, health, reflection.")
    metrics_port: int = Field(default=9102, ge=0, le=65535, description="Prometheus `/metrics`; 0 disables it.")
    instance: str = Field(
        default="acker-0",
        description="A name stable across restarts: the transactional.id `onceflow-acker-<instance>` derives from it.",
    )
    default_timeout_ms: int = Field(
        default=30_000, ge=100, description="The timeout of a tree whose INIT names none (ingest always names one)."
    )

    @property
    def transactional_id(self) -> str:
        return topology.ACKER.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def group_id(self) -> str:
        return topology.ACKER.group_id(self.common.topic_prefix)

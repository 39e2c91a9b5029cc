"""Acker settings: ONCEFLOW_ACKER_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field
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


class AckerSettings(ServiceSettings):
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
    port: int = grpc_port_setting(topology.ACKER_SERVICE)
    metrics_port: int = metrics_port_setting(topology.ACKER_SERVICE)
    instance: str = instance_setting(topology.ACKER_SERVICE)
    default_timeout_ms: int = Field(
        default=30_000, ge=100, description="The timeout of a tree whose INIT names none (ingest always names one)."
    )

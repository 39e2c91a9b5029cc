"""Sink settings: ONCEFLOW_SINK_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings


class SinkSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_SINK_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)
    host: str = "127.0.0.1"
    port: int = Field(default=15055, ge=0, le=65535)
    metrics_port: int = Field(default=9105, ge=0, le=65535)
    # Stable across restarts: the transactional.id derives from it.
    instance: str = "sink-0"
    # Ack the applied changes' edges (off when nothing tracks the trees).
    acking: bool = True

    @property
    def transactional_id(self) -> str:
        return topology.SINK.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def group_id(self) -> str:
        return topology.SINK.group_id(self.common.topic_prefix)

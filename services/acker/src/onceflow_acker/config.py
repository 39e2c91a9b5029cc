"""Acker settings: ONCEFLOW_ACKER_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings


class AckerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_ACKER_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)
    host: str = "127.0.0.1"
    port: int = Field(default=15052, ge=0, le=65535)
    metrics_port: int = Field(default=9102, ge=0, le=65535)
    # Stable across restarts: the transactional.id derives from it.
    instance: str = "acker-0"
    # For trees whose INIT names no timeout (ingest always does).
    default_timeout_ms: int = Field(default=30_000, ge=100)

    @property
    def transactional_id(self) -> str:
        return topology.ACKER.transactional_id(self.common.topic_prefix, self.instance)

    @property
    def group_id(self) -> str:
        return topology.ACKER.group_id(self.common.topic_prefix)

"""The console's settings (ONCEFLOW_CONSOLE_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_CONSOLE_", extra="ignore")

    # Loopback by default: the page shows user data (keys, record ids). Its actions still need
    # the admin token, typed by the operator; the console never holds one.
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)
    # Which services to watch (default infra/services.toml, as `onceflow admin status --all`).
    services_config: Path | None = None
    # How often every service is asked, and how long one may take before it shows as DOWN.
    poll_interval_s: float = Field(default=1.0, gt=0)
    deadline_s: float = Field(default=1.5, gt=0)
    # Samples of each service's rates the service page draws (the last 5 min at 1 s).
    history: int = Field(default=300, ge=2)
    # A record lookup reads acker.events and the dead-letter topics; it stops after this long
    # and says the search was incomplete.
    lookup_timeout_s: float = Field(default=10.0, gt=0)
    # Rows per page in the result-table browser (Query.Scan's limit; at most 10000).
    page_size: int = Field(default=50, ge=1, le=10_000)

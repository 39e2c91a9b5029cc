"""The console's settings (ONCEFLOW_CONSOLE_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_CONSOLE_", extra="ignore")

    host: str = Field(
        default="127.0.0.1",
        description="The address to bind: loopback by default, since the page shows user data (keys, record ids). "
        "Its actions still need the admin token, typed by the operator; the console never holds one.",
    )
    port: int = Field(default=8090, ge=0, le=65535, description="The page's HTTP port.")
    services_config: Path | None = Field(
        default=None,
        description="The services to watch, one `[[service]]` per instance; unset: `infra/services.toml`, as "
        "`onceflow admin status --all` (`--config` or `ONCEFLOW_SERVICES_CONFIG` win).",
    )
    poll_interval_s: float = Field(default=1.0, gt=0, description="How often every instance is asked.")
    deadline_s: float = Field(
        default=1.5, gt=0, description="The fleet deadline: an instance that has not answered by then shows as DOWN."
    )
    history: int = Field(
        default=300, ge=2, description="Rate samples kept per service (5 minutes at 1 s) for the service page's chart."
    )
    lookup_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a record lookup may read `acker.events` and the dead-letter topics; past it the "
        "answer says the search was incomplete.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the page answers to besides loopback's (127.0.0.1, localhost, [::1]) and the bound "
        "host: a request for any other Host is refused (400), so a web page that rebinds its own name to this "
        "address cannot read the console (DNS rebinding). A JSON list, e.g. `[\"console.internal\"]`.",
    )
    max_event_streams: int = Field(
        default=32, ge=1,
        description="Live pages (server-sent event streams) open at once; past it a new one is refused with 503 and "
        "Retry-After, so no client can hold the console's event loop with streams.",
    )
    page_size: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="Rows per page in the result-table browser (`Query.Scan`'s limit; `?limit=` overrides it).",
    )

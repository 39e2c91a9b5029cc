"""Where a client finds a service when it is given no address (issue 45): the service's first
instance in the services file a deployment names (``ONCEFLOW_SERVICES_CONFIG``: the TOML file
``onceflow admin status --all`` and the CLI read, ``[[service]]`` entries with ``name`` and
``address``), else the service's default port on loopback. The client package is thin, so the
default ports are written here too; tests/test_deploy_config.py checks them against the
topology's."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

SERVICES_CONFIG_ENV = "ONCEFLOW_SERVICES_CONFIG"
DEFAULT_PORTS = {"ingest": 15051, "sink": 15055}


def default_address(service: str) -> str:
    configured = os.environ.get(SERVICES_CONFIG_ENV)
    if configured:
        path = Path(configured)
        try:
            entries = tomllib.loads(path.read_text()).get("service", [])
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{SERVICES_CONFIG_ENV}={configured}: {exc}") from None
        for entry in entries:
            if entry.get("name") == service and isinstance(entry.get("address"), str):
                return str(entry["address"])
    return f"127.0.0.1:{DEFAULT_PORTS[service]}"

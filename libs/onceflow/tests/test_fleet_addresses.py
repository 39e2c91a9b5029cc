"""Where a CLI command finds a service it was given no address for: the services config, then
the topology's default ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.admin import fleet


def test_a_command_finds_a_service_where_the_services_config_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "services.toml"
    config.write_text('[[service]]\nname = "sink"\naddress = "10.0.0.7:25055"\n[[service]]\nname = "sink"\naddress = "x:1"\n')
    monkeypatch.setenv("ONCEFLOW_SERVICES_CONFIG", str(config))
    assert fleet.default_address("sink") == "10.0.0.7:25055"  # its first instance
    assert fleet.default_address("acker") == "127.0.0.1:15052"  # not configured: the topology's port
    monkeypatch.setenv("ONCEFLOW_SERVICES_CONFIG", str(tmp_path / "missing.toml"))
    assert fleet.default_address("sink") == "127.0.0.1:15055"


def test_an_optional_service_is_read_as_such(tmp_path: Path) -> None:
    config = tmp_path / "services.toml"
    config.write_text('[[service]]\nname = "sink"\naddress = "a:1"\n[[service]]\nname = "source"\naddress = "a:2"\noptional = true\n')
    assert [(e.name, e.optional) for e in fleet.load_endpoints(config)] == [("sink", False), ("source", True)]

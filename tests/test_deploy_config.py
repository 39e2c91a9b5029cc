"""Every way to run the pipeline names the same services with the same ports and settings: the
packages under services/, infra/services.toml (what `onceflow admin status --all` asks), the
Tiltfile, docker-compose.yml, the Dockerfile's targets and docs/services/. A service added in
one place and not the others, or a port or env var that drifted, fails here."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from pydantic_settings import BaseSettings

from onceflow.config import repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
INFRA_SERVICES = {"kafka", "redis", "topics"}


def settings_class(service: str) -> type[BaseSettings]:
    module = importlib.import_module(f"onceflow_{service}.config")
    prefix = f"ONCEFLOW_{service.upper()}_"
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, BaseSettings) and value.model_config.get("env_prefix") == prefix:
            return value
    raise AssertionError(f"onceflow_{service}.config has no settings class with env prefix {prefix}")


def packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "services").glob("*/pyproject.toml")}


def registered() -> dict[str, int]:
    entries = tomllib.loads((ROOT / "infra" / "services.toml").read_text())["service"]
    return {e["name"]: int(e["address"].rsplit(":", 1)[1]) for e in entries}


def compose() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def tilt_resources() -> dict[str, str]:
    """local_resource name -> its block of the Tiltfile."""
    text = (ROOT / "Tiltfile").read_text()
    blocks = re.split(r"\nlocal_resource\(\n", text)[1:]
    return {re.match(r"\s*'([\w-]+)'", block).group(1): block for block in blocks}  # type: ignore[union-attr]


def docker_targets() -> set[str]:
    return set(re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)) - {"base"}


def test_every_service_is_deployable_everywhere() -> None:
    services = packages()
    assert services == {"ingest", "acker", "dedup", "compute", "sink"}
    assert set(registered()) == services
    assert set(compose()) - INFRA_SERVICES == services
    assert {n for n, block in tilt_resources().items() if "labels=['pipeline']" in block} == services
    assert docker_targets() == services
    for service in services:
        assert (ROOT / "docs" / "services" / f"{service}.md").is_file(), f"docs/services/{service}.md"
        project = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"]
        assert project["name"] == f"onceflow-{service}" and project["version"]
        assert f"onceflow-{service}" in project["scripts"]


@pytest.mark.parametrize("service", sorted(packages()))
def test_ports_agree_with_the_settings_defaults(service: str) -> None:
    fields = settings_class(service).model_fields
    port, metrics_port = fields["port"].default, fields["metrics_port"].default
    assert registered()[service] == port
    env = {k: str(v) for k, v in compose()[service]["environment"].items()}
    prefix = f"ONCEFLOW_{service.upper()}_"
    assert env[f"{prefix}PORT"] == str(port) and env[f"{prefix}METRICS_PORT"] == str(metrics_port)
    assert env[f"{prefix}HOST"] == "0.0.0.0"
    published = {p.rsplit(":", 1)[1] for p in compose()[service]["ports"]}
    assert published == {str(port), str(metrics_port)}
    block = tilt_resources()[service]
    assert f"'{prefix}PORT': '{port}'" in block and f"'{prefix}METRICS_PORT': '{metrics_port}'" in block
    assert f"'health', '127.0.0.1:{port}'" in block  # the readiness probe
    dockerfile = (ROOT / "Dockerfile").read_text().split(f"AS {service}\n", 1)[1].split("\nFROM ", 1)[0]
    assert f"EXPOSE {port} {metrics_port}" in dockerfile and f"127.0.0.1:{port}" in dockerfile


@pytest.mark.parametrize("service", sorted(packages()))
def test_every_env_var_in_compose_and_tilt_is_a_setting(service: str) -> None:
    own = {f"ONCEFLOW_{service.upper()}_{name.upper()}" for name in settings_class(service).model_fields}
    common = {f"ONCEFLOW_{name.upper()}" for name in importlib.import_module("onceflow.config").CommonSettings.model_fields}
    loop = {f"ONCEFLOW_LOOP_{name.upper()}" for name in importlib.import_module("onceflow.config").LoopSettings.model_fields}
    known = own | common | loop
    used = set(compose()[service].get("environment", {}))
    used |= set(re.findall(r"'(ONCEFLOW_\w+)':", tilt_resources()[service]))
    assert used and used <= known, sorted(used - known)

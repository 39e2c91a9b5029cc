"""Every way to run the pipeline names the same services with the same ports and settings: the
packages under services/, infra/services.toml (what `onceflow admin status --all` asks), the
Tiltfile, docker-compose.yml, the Dockerfile's targets and docs/services/. A service added in
one place and not the others, or a port or env var that drifted, fails here."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from pydantic_settings import BaseSettings

from onceflow import topology
from onceflow.config import repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
# Beside the pipeline in compose: the broker, Redis, the topics job and the console (tools image).
INFRA_SERVICES = {"kafka", "redis", "topics", "console"}


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
    blocks = re.split(r"\n\s*local_resource\(\n", text)[1:]
    return {re.match(r"\s*'([\w-]+)'", block).group(1): block for block in blocks}  # type: ignore[union-attr]


def docker_targets() -> set[str]:
    """The service images (base and the tools image left out)."""
    return set(re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)) - {"base", "tools"}


def test_every_service_is_deployable_everywhere() -> None:
    services = packages()
    assert services == {service.name for service in topology.SERVICES}
    assert set(registered()) == services
    assert set(compose()) - INFRA_SERVICES == services
    assert {n for n, block in tilt_resources().items() if "labels=['pipeline']" in block} == services
    assert docker_targets() == services
    for service in services:
        assert (ROOT / "docs" / "services" / f"{service}.md").is_file(), f"docs/services/{service}.md"
        project = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"]
        assert project["name"] == f"onceflow-{service}" and project["version"]
        assert f"onceflow-{service}" in project["scripts"]


def test_the_clients_default_ports_are_the_services() -> None:
    from onceflow_client.addresses import DEFAULT_PORTS

    assert DEFAULT_PORTS == {name: topology.service(name).grpc_port for name in DEFAULT_PORTS}


@pytest.mark.parametrize("service", sorted(packages()))
def test_ports_agree_with_the_settings_defaults(service: str) -> None:
    fields = settings_class(service).model_fields
    port, metrics_port = fields["port"].default, fields["metrics_port"].default
    assert (port, metrics_port) == (topology.service(service).grpc_port, topology.service(service).metrics_port)
    assert registered()[service] == port
    env = {k: str(v) for k, v in compose()[service]["environment"].items()}
    prefix = f"ONCEFLOW_{service.upper()}_"
    assert env[f"{prefix}PORT"] == str(port) and env[f"{prefix}METRICS_PORT"] == str(metrics_port)
    assert env[f"{prefix}HOST"] == "0.0.0.0"
    published = {p.rsplit(":", 1)[1] for p in compose()[service]["ports"]}
    assert published == {str(port), str(metrics_port)}
    block = tilt_resources()[service]
    assert f"'{prefix}PORT': '{port}'" in block and f"'{prefix}METRICS_PORT': '{metrics_port}'" in block
    assert f"'onceflow.probe', '127.0.0.1:{port}'" in block  # the readiness probe
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


def compose_schema() -> dict:
    """The Compose Specification's JSON schema, as `make test` fetched it (infra/compose/schema.sh)."""
    path = subprocess.run([str(ROOT / "infra" / "compose" / "schema.sh")], check=True, capture_output=True, text=True).stdout.strip()
    return json.loads(Path(path).read_text())


def compose_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(compose_schema())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_follows_the_compose_specification() -> None:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose_errors(document) == []


def test_the_schema_check_can_fail() -> None:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    document["services"]["sink"]["depends_on"]["redis"]["condition"] = "service_ready"  # not a condition
    document["services"]["ingest"]["healthcheck"] = {"interval": 5}  # a duration is a string
    errors = compose_errors(document)
    assert any("services/sink/depends_on" in e for e in errors) and any("services/ingest/healthcheck" in e for e in errors), errors


def test_tilt_and_compose_start_the_same_pipeline_and_infra() -> None:
    text = (ROOT / "Tiltfile").read_text()
    lists = re.findall(r"for name in \[([^\]]*)\]:\n\s*dc_resource", text)
    dc_resources = {name.strip(" '") for names in lists for name in names.split(",")}
    assert dc_resources == set(compose())
    assert "docker_compose('docker-compose.yml'" in text  # with the source's profile when it runs
    # The compute job and every service's downstream wait agree too.
    assert "'ONCEFLOW_COMPUTE_JOB', 'auctionbids'" in text and compose()["compute"]["environment"]["ONCEFLOW_COMPUTE_JOB"] == "auctionbids"
    # Ingest waits for what is downstream of it; the Kafka source is a spout beside it, not downstream.
    assert set(compose()["ingest"]["depends_on"]) - INFRA_SERVICES == packages() - {"ingest", "source"}
    assert "resource_deps=['infra', 'acker', 'dedup', 'compute', 'sink']" in tilt_resources()["ingest"]


def deploy_table(service: str) -> dict[str, str]:
    page = (ROOT / "docs" / "services" / f"{service}.md").read_text()
    assert "\n## Deploy\n" in page, f"docs/services/{service}.md has no Deploy section"
    section = page.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| ([^|]+?) \| (.+?) \|$", section, re.MULTILINE))


@pytest.mark.parametrize("service", sorted(packages()))
def test_each_service_page_says_how_to_deploy_it_alone(service: str) -> None:
    table = deploy_table(service)
    fields = settings_class(service).model_fields
    assert f"`onceflow-{service}`" in table["package"] and f"`onceflow-{service}`" in table["entry point"]
    assert f"onceflow-{service}`" in table["alone, against running infra"]
    assert f"--target {service} " in table["container"]
    assert f"127.0.0.1:{fields['port'].default}" in table["gRPC (Admin, health, reflection)"]
    assert f":{fields['metrics_port'].default}/metrics" in table["metrics"]
    # The topics it names exist, and every topic its code names is on the page.
    # A per-job template (`compute.partials.{job}`) is written `compute.partials.<job>` on the page.
    declared = {t["name"].replace("{job}", "<job>") for t in tomllib.loads((ROOT / "infra" / "topics.toml").read_text())["topic"]}
    named = table["reads"] + table["writes"] + table.get("refers to", "")
    documented = set(re.findall(r"`([a-z]+\.[a-z]+(?:\.<job>)?)`", named))
    assert documented and documented <= declared, sorted(documented - declared)
    source = "\n".join(p.read_text() for p in (ROOT / "services" / service / "src").rglob("*.py"))
    in_code = set(re.findall(r'topic\("([a-z]+\.[a-z]+)"\)', source))
    assert in_code <= documented, sorted(in_code - documented)


def test_compose_runs_the_kafka_version_everything_else_runs() -> None:
    pinned = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", (ROOT / "infra" / "kafka" / "pom.xml").read_text())
    assert pinned is not None
    # The registry's image by default; `make compose-up` names the one `make images` built from the same jars.
    assert compose()["kafka"]["image"] == f"${{ONCEFLOW_KAFKA_IMAGE:-apache/kafka:{pinned.group(1)}}}"


@pytest.mark.parametrize("service", sorted(packages()))
@pytest.mark.security
def test_a_service_bound_beyond_loopback_in_compose_cannot_start_without_an_admin_token(service: str) -> None:
    """docs/admin.md, "Threat model": compose binds services to its network, so `${VAR:?}`
    makes `docker compose up` stop with the reason when no token is given."""
    env = {k: str(v) for k, v in compose()[service]["environment"].items()}
    assert env[f"ONCEFLOW_{service.upper()}_HOST"] == "0.0.0.0"
    assert re.fullmatch(r"\$\{ONCEFLOW_ADMIN_TOKEN:\?.+\}", env.get("ONCEFLOW_ADMIN_TOKEN", "")), env.get("ONCEFLOW_ADMIN_TOKEN")
    assert all(p.startswith("127.0.0.1:") for p in compose()[service]["ports"])  # published on the host's loopback only


@pytest.mark.security
def test_every_service_image_runs_as_an_unprivileged_user() -> None:
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)
    targets = {stage.split()[2]: stage for stage in stages if " AS " in stage.split("\n", 1)[0]}
    for service in packages():
        users = re.findall(r"^USER (\S+)", targets[service], flags=re.M)
        assert users and users[-1] not in ("root", "0"), (service, users)
        assert targets[service].rstrip().splitlines()[-1].startswith("CMD"), service


def test_uv_is_installed_by_its_pinned_hashes_wherever_it_is_installed() -> None:
    """Issue 39, supply chain: pip installs uv (the one tool not under uv.lock) only by the sha256
    of a wheel PyPI serves for the pinned version, in make's first step and in the image."""
    pinned = (ROOT / "infra" / "uv" / "requirements.txt").read_text()
    assert re.search(r"^uv==\d+\.\d+\.\d+ \\$", pinned, re.M), pinned
    hashes = re.findall(r"--hash=sha256:([0-9a-f]+)", pinned)
    assert len(hashes) >= 4 and all(len(h) == 64 for h in hashes) and len(set(hashes)) == len(hashes), hashes
    install = "--require-hashes -r"
    makefile, dockerfile = (ROOT / "Makefile").read_text(), (ROOT / "Dockerfile").read_text()
    assert f"pip install --quiet {install} infra/uv/requirements.txt" in makefile
    assert f"{install} /tmp/uv-requirements.txt" in dockerfile and "COPY infra/uv/requirements.txt" in dockerfile
    assert not re.search(r"pip install[^\n]*\buv==", makefile + dockerfile), "uv installed by version alone"

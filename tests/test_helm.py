"""The Helm chart (deploy/helm/onceflow), with the Helm that `make helm` built: `helm lint` and
`helm template` pass with a token and the addresses, and with the in-chart Kafka and Redis; the
rendered manifests have what issue 42 asks of them (probes, non-root, a read-only root
filesystem, a Service per gRPC port, the NetworkPolicy, settings from a ConfigMap and tokens from
a Secret); invalid values fail naming the value; its ports and settings are the services' own and
docs/helm.md's table is values.yaml's. Seconds: no cluster, only the helm binary."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from typing import Any

import pytest
import yaml

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings, repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "deploy" / "helm" / "onceflow"
# The pipeline's services (the Kafka source is in the chart too, left out by default).
PIPELINE = ("ingest", "acker", "dedup", "compute", "sink")
TOKEN = "chart-test-admin-token"
# What a user must give (besides the defaults): a token, where Kafka and Redis are, and how
# ingest knows its producers.
EXTERNAL = {
    "secrets.adminToken": TOKEN,
    "kafka.bootstrap": "kafka.data:9092",
    "redis.url": "redis://redis.data:6379/0",
    "services.ingest.env.ONCEFLOW_INGEST_REQUIRE_PRODUCER": "false",
}
IN_CHART = {
    "secrets.adminToken": TOKEN,
    "kafka.enabled": "true",
    "redis.enabled": "true",
    "services.ingest.env.ONCEFLOW_INGEST_REQUIRE_PRODUCER": "false",
}


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's own caches and config in a scratch directory, not the user's."""
    assert HELM.is_file(), "no .tools/bin/helm: `make test` builds it (make helm)"
    home = tmp_path_factory.mktemp("helm-home")
    return {**os.environ, **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}


def helm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], env=env, capture_output=True, text=True, timeout=60)


def set_args(values: dict[str, str]) -> list[str]:
    # --set-string for the settings (strings in a ConfigMap), --set for the chart's own switches.
    args = []
    for key, value in values.items():
        flag = "--set-string" if ".env." in key or key.startswith("settings.") else "--set"
        args += [flag, f"{key}={value}"]
    return args


def render(env: dict[str, str], values: dict[str, str], *extra: str) -> list[dict[str, Any]]:
    result = helm(env, "template", "t", str(CHART), *set_args(values), *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def component(doc: dict[str, Any]) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


@pytest.mark.parametrize("values", [EXTERNAL, IN_CHART], ids=["external", "in-chart"])
def test_helm_lint_passes_strictly(helm_env: dict[str, str], values: dict[str, str]) -> None:
    result = helm(helm_env, "lint", "--strict", str(CHART), *set_args(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_every_service_is_a_deployment_with_probes_non_root_and_a_read_only_root(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, EXTERNAL)
    deployments = of_kind(docs, "Deployment")
    assert {component(d) for d in deployments.values()} == set(PIPELINE)
    assert len(deployments) == len(PIPELINE)  # one instance each by default
    for name, deployment in deployments.items():
        service = topology.service(component(deployment))
        pod = deployment["spec"]["template"]["spec"]
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        assert container["image"] == f"onceflow-{service.name}:latest"
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        # Readiness is the images' HEALTHCHECK (grpc.health.v1 SERVING); liveness and startup
        # that the gRPC port accepts connections.
        assert container["readinessProbe"]["exec"]["command"] == [
            "/app/.venv/bin/python", "-m", "onceflow.probe", f"127.0.0.1:{service.grpc_port}",
        ], name
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["tcpSocket"] == {"port": "grpc"}, (name, probe)
        assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] == 300
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "grpc": service.grpc_port, "metrics": service.metrics_port,
        }
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        # The writable places of a read-only root are emptyDirs: /tmp (Spark, the JVM) and ONCEFLOW_HOME.
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]] and "emptyDir" in volumes[mounts["/var/lib/onceflow"]]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env[f"ONCEFLOW_{service.name.upper()}_INSTANCE"] == f"{service.name}-0"


def test_a_service_for_each_grpc_port(helm_env: dict[str, str]) -> None:
    services = of_kind(render(helm_env, EXTERNAL), "Service")
    assert {component(s) for s in services.values()} == set(PIPELINE)
    for name, service in services.items():
        expected = topology.service(component(service))
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert ports["grpc"]["port"] == expected.grpc_port and ports["grpc"]["appProtocol"] == "grpc", name
        assert ports["metrics"]["port"] == expected.metrics_port, name
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == expected.name


def test_settings_come_from_config_maps_and_tokens_from_a_secret_as_files(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, {**EXTERNAL, "secrets.readToken": "r"})
    config_maps = of_kind(docs, "ConfigMap")
    common = config_maps["t-onceflow-settings"]["data"]
    assert common["ONCEFLOW_KAFKA_BOOTSTRAP"] == "kafka.data:9092"
    assert common["ONCEFLOW_REDIS_URL"] == "redis://redis.data:6379/0"
    (secret,) = of_kind(docs, "Secret").values()
    assert set(secret["data"]) == {"admin-token", "read-token"}
    text = yaml.safe_dump_all(docs)
    assert TOKEN not in text  # base64 in the Secret only
    for deployment in of_kind(docs, "Deployment").values():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["ONCEFLOW_ADMIN_TOKEN_FILE"] == "/etc/onceflow/secrets/admin-token"
        assert env["ONCEFLOW_READ_TOKEN_FILE"] == "/etc/onceflow/secrets/read-token"
        assert not {"ONCEFLOW_ADMIN_TOKEN", "ONCEFLOW_READ_TOKEN"} & set(env)
        sources = [s["configMapRef"]["name"] for s in container["envFrom"]]
        assert sources == ["t-onceflow-settings", f"t-onceflow-{component(deployment)}"]


def settings_class(service: str) -> Any:
    module = importlib.import_module(f"onceflow_{service}.config")
    prefix = f"ONCEFLOW_{service.upper()}_"
    return next(v for v in vars(module).values() if isinstance(v, type) and getattr(v, "model_config", {}).get("env_prefix") == prefix)


def test_every_variable_the_chart_sets_is_a_setting_of_its_service(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, {**EXTERNAL, "services.source.instances": "1"})
    common = {f"ONCEFLOW_{n.upper()}" for n in CommonSettings.model_fields}
    loop = {f"ONCEFLOW_LOOP_{n.upper()}" for n in LoopSettings.model_fields}
    shared = set(of_kind(docs, "ConfigMap")["t-onceflow-settings"]["data"])
    assert shared - {"ONCEFLOW_HOME"} <= common, sorted(shared - common)  # ONCEFLOW_HOME: runtime_dir()
    for deployment in of_kind(docs, "Deployment").values():
        service = component(deployment)
        own = {f"ONCEFLOW_{service.upper()}_{n.upper()}" for n in settings_class(service).model_fields}
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        used = set(of_kind(docs, "ConfigMap")[f"t-onceflow-{service}"]["data"]) | {e["name"] for e in container["env"]}
        assert used <= own | common | loop, sorted(used - own - common - loop)


def test_values_ports_are_the_services_defaults() -> None:
    services = yaml.safe_load((CHART / "values.yaml").read_text())["services"]
    assert set(services) == {s.name for s in topology.SERVICES}
    for name, values in services.items():
        fields = settings_class(name).model_fields
        assert (values["port"], values["metricsPort"]) == (fields["port"].default, fields["metrics_port"].default), name


def test_the_network_policy_admits_only_the_release_and_named_clients(helm_env: dict[str, str]) -> None:
    clients = [{"namespaceSelector": {"matchLabels": {"onceflow-client": "yes"}}}]
    docs = render(helm_env, EXTERNAL, "--set-json", f"networkPolicy.clients={json.dumps(clients)}")
    policy = of_kind(docs, "NetworkPolicy")["t-onceflow-services"]
    selector = {e["key"]: e["values"] for e in policy["spec"]["podSelector"]["matchExpressions"]}
    assert set(selector["app.kubernetes.io/component"]) == {s.name for s in topology.SERVICES}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (grpc,) = policy["spec"]["ingress"]  # no metricsFrom given: metrics are not reachable
    assert {p["port"] for p in grpc["ports"]} == {s.grpc_port for s in topology.SERVICES}
    assert grpc["from"][0] == {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "t", "app.kubernetes.io/name": "onceflow"}}}
    assert grpc["from"][1:] == clients
    restricted = of_kind(render(helm_env, EXTERNAL, "--set", "networkPolicy.egress.restrict=true"), "NetworkPolicy")
    assert restricted["t-onceflow-services"]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not of_kind(render(helm_env, EXTERNAL, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_in_chart_kafka_and_redis_for_trying_it_out(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, {**IN_CHART, "console.enabled": "true"})
    deployments, services = of_kind(docs, "Deployment"), of_kind(docs, "Service")
    assert {"t-onceflow-kafka", "t-onceflow-redis", "t-onceflow-console"} <= set(deployments) & set(services)
    common = of_kind(docs, "ConfigMap")["t-onceflow-settings"]["data"]
    assert common["ONCEFLOW_KAFKA_BOOTSTRAP"] == "t-onceflow-kafka:9092"
    assert common["ONCEFLOW_REDIS_URL"] == "redis://t-onceflow-redis:6379/0"
    kafka_env = {e["name"]: e["value"] for e in deployments["t-onceflow-kafka"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert kafka_env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://t-onceflow-kafka:9092"
    assert kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    # The topics job runs once the in-chart broker exists; on your Kafka, before the services.
    (job,) = of_kind(docs, "Job").values()
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["infra", "topics"]
    (job,) = of_kind(render(helm_env, EXTERNAL), "Job").values()
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # The console watches the release's services through their Services.
    console = of_kind(docs, "ConfigMap")["t-onceflow-console"]["data"]["services.toml"]
    assert 'address = "t-onceflow-sink:15055"' in console and console.count("[[service]]") == len(PIPELINE)
    infra = of_kind(docs, "NetworkPolicy")["t-onceflow-infra"]
    assert {e["key"]: e["values"] for e in infra["spec"]["podSelector"]["matchExpressions"]}["app.kubernetes.io/component"] == ["kafka", "redis"]


@pytest.mark.parametrize("master", ["local[*]", "local[2]", "spark://spark-master:7077", "sc://spark-connect:15002"])
def test_compute_spark_master_is_a_value(helm_env: dict[str, str], master: str) -> None:
    docs = render(helm_env, EXTERNAL, "--set-string", f"services.compute.sparkMaster={master}")
    assert of_kind(docs, "ConfigMap")["t-onceflow-compute"]["data"]["ONCEFLOW_COMPUTE_SPARK_MASTER"] == master


def test_instances_are_deployments_with_stable_names_behind_one_service(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, {**EXTERNAL, "services.compute.instances": "2", "probes.type": "grpc"})
    computes = {n: d for n, d in of_kind(docs, "Deployment").items() if component(d) == "compute"}
    assert set(computes) == {"t-onceflow-compute-0", "t-onceflow-compute-1"}
    for i in range(2):
        (container,) = computes[f"t-onceflow-compute-{i}"]["spec"]["template"]["spec"]["containers"]
        assert {"name": "ONCEFLOW_COMPUTE_INSTANCE", "value": f"compute-{i}"} in container["env"]
        assert container["readinessProbe"]["grpc"] == {"port": 15054}  # the kubelet's own gRPC probe
    assert sum(component(s) == "compute" for s in of_kind(docs, "Service").values()) == 1


def test_producers_go_to_ingest_as_a_file(helm_env: dict[str, str]) -> None:
    values = {k: v for k, v in EXTERNAL.items() if "REQUIRE_PRODUCER" not in k}
    producers = '[[producer]]\nname = "shop"\ntoken_sha256 = "' + "0" * 64 + '"\n'
    docs = render(helm_env, {**values, "services.ingest.producers": producers})
    assert of_kind(docs, "ConfigMap")["t-onceflow-ingest-producers"]["data"]["producers.toml"].strip() == producers.strip()
    assert of_kind(docs, "ConfigMap")["t-onceflow-ingest"]["data"]["ONCEFLOW_INGEST_PRODUCERS_FILE"] == "/etc/onceflow/producers/producers.toml"


# Each bad value fails `helm template` naming what is wrong: the schema's checks (before any
# template runs) and the chart's `required`/`fail` for what must be given.
INVALID = {
    "negative instances": (
        {"services.acker.instances": "-1"}, "at '/services/acker/instances': minimum: got -1, want 0"),
    "unknown spark master scheme": (
        {"services.compute.sparkMaster": "yarn"}, "at '/services/compute/sparkMaster': 'yarn' does not match pattern"),
    "k8s master": (
        {"services.compute.sparkMaster": "k8s://https://api:6443"}, "at '/services/compute/sparkMaster'"),
    "no admin token": ({"secrets.adminToken": ""}, "secrets.adminToken is required: every service binds beyond loopback"),
    "token among the settings": (
        {"settings.ONCEFLOW_ADMIN_TOKEN": "x"}, "at '/settings/ONCEFLOW_ADMIN_TOKEN'"),
    "a setting that is not onceflow's": (
        {"services.sink.env.SINK_PORT": "1"}, "at '/services/sink/env': additional properties 'SINK_PORT' not allowed"),
    "an unknown service": ({"services.gateway.instances": "1"}, "at '/services': additional properties 'gateway' not allowed"),
    "a root pod": ({"podSecurityContext.runAsNonRoot": "false"}, "at '/podSecurityContext/runAsNonRoot'"),
    "bad bootstrap": ({"kafka.bootstrap": "kafka"}, "at '/kafka/bootstrap': 'kafka' does not match pattern"),
    "bad redis url": ({"redis.url": "http://redis:6379"}, "at '/redis/url'"),
    "unknown probe type": ({"probes.type": "http"}, "at '/probes/type'"),
    "no kafka": ({"kafka.bootstrap": ""}, "kafka.bootstrap is required"),
    "no redis": ({"redis.url": ""}, "redis.url is required"),
    "anonymous producers not chosen": (
        {"services.ingest.env.ONCEFLOW_INGEST_REQUIRE_PRODUCER": "auto"}, "services.ingest.producers is required"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_value_fails_helm_template_naming_it(helm_env: dict[str, str], case: str) -> None:
    override, message = INVALID[case]
    result = helm(helm_env, "template", "t", str(CHART), *set_args({**EXTERNAL, **override}))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def values_leaves(node: Any, prefix: str = "") -> set[str]:
    """values.yaml's keys as docs/helm.md's table names them: dotted paths, maps of settings,
    resources and security contexts as one entry each."""
    whole = {"resources", "env", "settings", "podSecurityContext", "securityContext", "nodeSelector", "affinity", "podAnnotations"}
    if not isinstance(node, dict):
        return {prefix}
    keys: set[str] = set()
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        keys |= {path} if key in whole else values_leaves(value, path)
    return keys


def test_docs_table_is_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    page = (ROOT / "docs" / "helm.md").read_text()
    table = page.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([\w.<>]+)` \|", table, re.M))
    # One row per service key, written services.<name>.*, and the compute-only ones by name.
    expected = set()
    for path in values_leaves(values):
        parts = path.split(".")
        if parts[0] == "services" and parts[2] not in ("job", "sparkMaster", "producers"):
            parts[1] = "<name>"
        expected.add(".".join(parts))
    assert documented == expected, (sorted(expected - documented), sorted(documented - expected))


def test_the_makefile_builds_helm_before_the_suite() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\bhelm\b", makefile, re.M)
    assert "infra/helm/install.sh" in makefile
    pinned = re.search(r'HELM_VERSION="\$\{HELM_VERSION:-([\d.]+)\}"', (ROOT / "infra" / "helm" / "install.sh").read_text())
    assert pinned and re.search(rf"^HELM_VERSION := {re.escape(pinned.group(1))}$", makefile, re.M)
    version = subprocess.run([str(HELM), "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True)
    assert version.stdout == f"v{pinned.group(1)}"


"""The Helm chart's pods, run for real under `podman kube play`, one instance each, with the
in-chart Kafka and Redis and the images `make images` builds; records go in through ingest and
the sink's table equals the batch answer, each record once, a resent batch included.

What `podman kube play` (Debian's podman 4.3) runs of the rendered chart, and what the test does
instead (issue 42):

- **Deployments** run as pods, but a pod is found on the podman network by its own name only, and
  Services (and so the names the ConfigMap gives, `<release>-onceflow-kafka:9092`, ...) are not
  played. So each Deployment's pod template is played as a Pod named after the Service in front
  of it: the same containers, settings, probes, security contexts and volumes.
- **Secrets**: 4.3 has no Secret kind; a secret volume reads a podman secret of the same name
  holding the Secret as JSON, and writes its `data` values without base64-decoding them. The
  test creates that podman secret with the values already decoded. (A secret volume without
  `optional` crashes 4.3 (podman issue 16636): the chart spells out Kubernetes' default.)
- **The topics job** is a Helm hook, and 4.3 plays no Job: its pod template is played as a Pod
  once Kafka answers, and must exit 0 before the services start (as `helm install` orders a
  post-install hook, and compose's `service_completed_successfully`).
- **NetworkPolicies** are not played (podman has no network policy); nor are **readiness
  probes**. The readiness command of every service (`python -m onceflow.probe`) is run here with
  `podman exec`, exactly as rendered, until it passes. Liveness and startup probes (TCP) would be
  podman health checks run by systemd timers, and no systemd runs here.
- Resources, `runAsUser`/`runAsNonRoot`, `readOnlyRootFilesystem`, dropped capabilities and the
  emptyDirs are applied, and checked below.

By hand: `helm template t deploy/helm/onceflow -f values.yaml > all.yaml`, then the same
transformation (`kube_play_documents` below) and `podman kube play --network NET pods.yaml`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from onceflow import topology
from onceflow.config import repo_root
from onceflow_client import IngestClient
from onceflow_tools.workloads import usersum
from tests.conftest import eventually

pytestmark = [pytest.mark.deploy, pytest.mark.devex]

ROOT = repo_root()
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "deploy" / "helm" / "onceflow"
RELEASE = "helmpods"
FULLNAME = f"{RELEASE}-onceflow"
PIPELINE = ("acker", "dedup", "compute", "sink", "ingest")
IMAGES = [f"onceflow-{name}:latest" for name in (*PIPELINE, "tools", "kafka", "redis")]
TOKEN = "kube-play-admin-token"
# The values a user trying the chart out would give, with the images `make images` built: its
# Kafka image runs as its own user (uid 10002), who owns the broker's config directory.
VALUES: dict[str, Any] = {
    "secrets": {"adminToken": TOKEN},
    "kafka": {
        "enabled": True,
        "image": "onceflow-kafka:latest",
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 10002, "fsGroup": 10002},
    },
    "redis": {"enabled": True, "image": "onceflow-redis:latest"},
    "image": {"pullPolicy": "Never"},
    "services": {
        "ingest": {"env": {"ONCEFLOW_INGEST_REQUIRE_PRODUCER": "false"}},
        "compute": {"job": usersum.JOB},
    },
}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / ".tools" / "containers" / "containers.conf"))}
    result = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.stderr.strip()}")
    return result


def render(values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [str(HELM), "template", RELEASE, str(CHART), "-f", str(path)], capture_output=True, text=True, timeout=60,
        env={**os.environ, **{f"HELM_{k}_HOME": str(tmp / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}},
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def as_pod(name: str, template: dict[str, Any], restart: str = "Always") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": {**template["spec"], "restartPolicy": restart},
    }


def kube_play_documents(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, dict[str, Any]]]:
    """The rendered chart as podman 4.3 plays it (see the module's docstring): the ConfigMaps,
    a Pod per Deployment named after its Service, the topics job's Pod, and the Secret."""
    services = {d["spec"]["selector"]["app.kubernetes.io/component"]: d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    config_maps = [d for d in docs if d["kind"] == "ConfigMap"]
    pods = {}
    for d in docs:
        if d["kind"] == "Deployment":
            component = d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            pods[component] = as_pod(services[component], d["spec"]["template"])
    (job,) = (d for d in docs if d["kind"] == "Job")
    pods["topics"] = as_pod(job["metadata"]["name"], job["spec"]["template"], restart="OnFailure")
    (secret,) = (d for d in docs if d["kind"] == "Secret")
    # Kinds podman does not play; nothing else may be left out unsaid.
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment", "Job", "Secret", "Service", "NetworkPolicy"}
    return config_maps, secret, pods


def play(pods: list[dict[str, Any]], config_maps: list[dict[str, Any]], network: str, tmp: Path, name: str) -> None:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([*config_maps, *pods]))
    podman("kube", "play", "--network", network, str(path), timeout=300)


def pod_ip(pod: str) -> str:
    infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout.strip()
    networks = json.loads(podman("inspect", infra, "--format", "{{json .NetworkSettings.Networks}}").stdout)
    (settings,) = networks.values()
    return str(settings["IPAddress"])


def container(pod: dict[str, Any]) -> str:
    """podman's name for the pod's one container: <pod>-<container>."""
    (spec,) = pod["spec"]["containers"]
    return f"{pod['metadata']['name']}-{spec['name']}"


def logs(ctr: str, lines: int = 40) -> str:
    result = podman("logs", "--tail", str(lines), ctr, check=False)
    return f"--- {ctr}'s last lines:\n{result.stdout}{result.stderr}"


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def volumes(pods: list[dict[str, Any]]) -> set[str]:
    """The podman volumes kube play makes for the pods: one per emptyDir (named as the volume)
    and one per secret volume (named as the Secret), left behind by `podman pod rm`."""
    names = set()
    for pod in pods:
        for volume in pod["spec"].get("volumes", []):
            names.add(volume["secret"]["secretName"] if "secret" in volume else volume["name"])
    return names


def cleanup(pods: list[dict[str, Any]], network: str, secret: str) -> None:
    for pod in pods:
        podman("pod", "rm", "--force", "--time", "5", pod["metadata"]["name"], check=False, timeout=120)
    for volume in volumes(pods):
        podman("volume", "rm", "--force", volume, check=False)
    podman("network", "rm", "--force", network, check=False)
    podman("secret", "rm", secret, check=False)


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    assert HELM.is_file(), "no .tools/bin/helm: make helm"
    assert shutil.which("podman"), "no podman: run infra/containers/install.sh"
    assert shutil.which("catatonit"), "podman kube play needs catatonit (its pods' pause process): apt-get install catatonit"
    missing = [image for image in IMAGES if podman("image", "exists", image, check=False).returncode != 0]
    assert not missing, f"images {missing} are not built: run make images"
    tmp = tmp_path_factory.mktemp("kube-play")
    docs = render(VALUES, tmp)
    config_maps, secret, pods = kube_play_documents(docs)
    network = f"onceflow-helm-{uuid.uuid4().hex[:8]}"
    secret_name = secret["metadata"]["name"]
    cleanup(list(pods.values()), network, secret_name)  # a previous run's leftovers
    podman("network", "create", network)
    decoded = {**secret, "data": {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}}
    (tmp / "secret.json").write_text(json.dumps(decoded))
    podman("secret", "create", secret_name, str(tmp / "secret.json"))
    started = time.monotonic()
    try:
        play([pods["kafka"], pods["redis"]], [], network, tmp, "infra")
        kafka = pod_ip(pods["kafka"]["metadata"]["name"])
        eventually(lambda: port_open(kafka, 9092), 120, "the in-chart Kafka to listen")
        play([pods["topics"]], [], network, tmp, "topics")
        topics = container(pods["topics"])

        def topics_done() -> bool:
            # Restarted on failure (OnFailure) until a broker answers, as the Job's pod would be.
            state = podman("inspect", topics, "--format", "{{.State.Status}} {{.State.ExitCode}}").stdout.split()
            return state == ["exited", "0"]

        try:
            eventually(topics_done, 240, "the topics job's pod to exit 0", interval_s=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(topics)}") from None
        play([pods[name] for name in PIPELINE], config_maps, network, tmp, "services")
        yield {"pods": pods, "docs": docs, "started": started}
    finally:
        cleanup(list(pods.values()), network, secret_name)


def readiness_command(pod: dict[str, Any]) -> list[str]:
    (spec,) = pod["spec"]["containers"]
    return list(spec["readinessProbe"]["exec"]["command"])


def test_every_service_pod_turns_ready_by_its_own_readiness_probe(played: dict[str, Any]) -> None:
    pods = played["pods"]
    for name in PIPELINE:
        command = readiness_command(pods[name])
        assert command[-1] == f"127.0.0.1:{topology.service(name).grpc_port}"

        def ready(name: str = name, command: list[str] = command) -> bool:
            return podman("exec", container(pods[name]), *command, check=False, timeout=30).returncode == 0

        try:
            eventually(ready, 300, f"{name}'s readiness probe to pass", interval_s=3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(container(pods[name]))}") from None
    print(f"\nkube play: every service ready {time.monotonic() - played['started']:.0f} s after the first pod")


def test_the_pods_run_as_the_chart_says(played: dict[str, Any]) -> None:
    for name in PIPELINE:
        ctr = container(played["pods"][name])
        ident = podman("exec", ctr, "id", "-u").stdout.strip()
        assert ident == "10001", (name, ident)
        assert podman("exec", ctr, "touch", "/app/written", check=False).returncode != 0, f"{name}'s root filesystem is writable"
        assert podman("exec", ctr, "touch", "/tmp/written", "/var/lib/onceflow/written", check=False).returncode == 0, name
        caps = podman("exec", ctr, "grep", "CapEff", "/proc/1/status").stdout.split()[-1]
        assert int(caps, 16) == 0, (name, caps)
        token = podman("exec", ctr, "cat", "/etc/onceflow/secrets/admin-token").stdout
        assert token == TOKEN, name
        env = podman("exec", ctr, "env").stdout
        assert TOKEN not in env and "ONCEFLOW_ADMIN_TOKEN_FILE=/etc/onceflow/secrets/admin-token" in env, name


def test_records_through_the_pods_are_exact(played: dict[str, Any]) -> None:
    test_every_service_pod_turns_ready_by_its_own_readiness_probe(played)
    pods = played["pods"]
    ingest = f"{pod_ip(pods['ingest']['metadata']['name'])}:{topology.INGEST_SERVICE.grpc_port}"
    sink = f"{pod_ip(pods['sink']['metadata']['name'])}:{topology.SINK_SERVICE.grpc_port}"
    sent = list(usersum.records(600, users=25, id_prefix="kube-play"))
    with IngestClient(ingest) as client:
        for start in range(0, len(sent), 100):
            batch = usersum.ingest_records(sent[start:start + 100])
            assert client.ingest(batch, wait="processed").accepted == len(batch)
        # A resent batch (the same record ids): the dedup gate drops it, the table counts it once.
        client.ingest(usersum.ingest_records(sent[:100]), wait="processed")
    answer = usersum.batch_answer(sent)
    assert answer == usersum.fold_answer(sent)

    def exact() -> bool:
        try:
            return usersum.sink_table(sink) == answer
        except Exception:  # the sink still applying, or a restart
            return False

    eventually(exact, 180, "the sink's table in the pods to equal the batch answer", interval_s=2)
    # No pod restarted along the way.
    for name in PIPELINE:
        restarts = podman("inspect", container(pods[name]), "--format", "{{.RestartCount}}").stdout.strip()
        assert restarts == "0", (name, restarts)

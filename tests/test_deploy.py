"""Issue 42, run for real (`make test-deploy`; marker deploy, left out of `make test`): the images
built with podman and no registry, docker-compose.yml run unchanged through podman-compose
(infra/containers/compose.py orders the starts by its conditions), records sent through the
client SDK, and the sink's table equal to the batch answer once the pipeline has drained. Under a
steady load one service's image is rebuilt with a visible change and only its container is
replaced, then another container's main process is killed with SIGKILL and its restart policy
brings it back: the table stays exact and no other container restarts.

The stack is a compose project of its own (ONCEFLOW_COMPOSE_PROJECT), its ports published on
free loopback ports outside the ranges the suite's own stacks use."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
import pytest

from onceflow.config import CommonSettings, repo_root
from onceflow_client import IngestClient
from onceflow_tools.process import free_port
from onceflow_tools.verify.check import undrained
from onceflow_tools.workloads import auctionbids, nexmark
from tests.conftest import eventually

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("deploy")]

ROOT = repo_root()
PROJECT = "ofdeploytest"
SERVICES = ("acker", "dedup", "compute", "sink", "ingest")
LONG_RUNNING = ("kafka", "redis", *SERVICES, "console")
IMAGES = ("kafka", "redis", *SERVICES, "source", "tools")
# One Nexmark stream, sent in three parts: before the upgrade, during it, during the kill.
EVENTS = nexmark.arrival_order(nexmark.NexmarkConfig(events=9_000, seed=42))
PARTS = (EVENTS[:3_000], EVENTS[3_000:6_000], EVENTS[6_000:])


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(ROOT / ".tools" / "containers" / "containers.conf"))
    return env


def podman(*args: str) -> str:
    res = subprocess.run(["podman", *args], env=engine_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"podman {' '.join(args)}: {res.stderr}"
    return res.stdout.strip()


def compose(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "infra" / "containers" / "compose.py"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)


@dataclass
class Stack:
    env: dict[str, str]
    ports: dict[str, int]
    sent: list[nexmark.Event] = field(default_factory=list)

    @staticmethod
    def container(service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"

    @property
    def common(self) -> CommonSettings:
        return CommonSettings(
            kafka_bootstrap=self.address("kafka"), redis_url=f"redis://{self.address('redis')}/0", admin_token=self.env["ONCEFLOW_ADMIN_TOKEN"],
        )

    def send(self, events: list[nexmark.Event], batch: int = 250, pause_s: float = 0.0) -> None:
        """Through the client SDK, as an application sends: committed batches."""
        records = nexmark.ingest_records(events, id_prefix="deploy")
        with IngestClient(self.address("ingest")) as client:
            for start in range(0, len(records), batch):
                client.ingest(records[start : start + batch], wait="committed")
                time.sleep(pause_s)
        self.sent.extend(events)

    def lives(self) -> dict[str, tuple[str, ...]]:
        """Each long-running container's id, start time and restart count: any restart changes them."""
        fmt = "{{.Id}}|{{.State.StartedAt}}|{{.RestartCount}}"
        return {s: tuple(podman("inspect", "--format", fmt, self.container(s)).split("|")) for s in LONG_RUNNING}

    def healthy(self, service: str) -> bool:
        res = subprocess.run(["podman", "healthcheck", "run", self.container(service)], env=engine_env(), capture_output=True, timeout=60)
        return res.returncode == 0

    def assert_exact(self) -> None:
        """On a drained pipeline (every group read to the end, the sink applied the last
        result, no open transaction), the sink's table equals Spark's batch answer over
        everything sent, and a plain fold of it."""
        eventually(lambda: not undrained(self.common, auctionbids.JOB), 300, "the compose pipeline to drain", interval_s=2)
        answer = auctionbids.batch_answer(self.sent)
        assert answer == auctionbids.fold_answer(self.sent)
        table = auctionbids.sink_table(self.address("sink"))
        wrong = sorted(k for k in answer.keys() | table.keys() if answer.get(k) != table.get(k))
        assert not wrong, f"{len(wrong)} rows differ, e.g. {[(k, answer.get(k), table.get(k)) for k in wrong[:3]]}"


class Load(threading.Thread):
    """A steady load (about 500 records a second) while a container is replaced or killed."""

    def __init__(self, stack: Stack, events: list[nexmark.Event]) -> None:
        super().__init__(daemon=True)
        self.stack, self.events = stack, events
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.stack.send(self.events, batch=100, pause_s=0.2)
        except Exception as exc:  # the test names it
            self.error = exc

    def finish(self, timeout_s: float = 600) -> None:
        self.join(timeout_s)
        assert not self.is_alive(), "the load did not finish"
        assert self.error is None, f"the load failed: {self.error!r}"


def test_the_images_build_from_the_repository() -> None:
    """`make images` (cached layers: a second build takes seconds), then each image as compose
    runs it: the services as an unprivileged user, with their health checks."""
    assert shutil.which("podman") and shutil.which("podman-compose"), "run infra/containers/install.sh"
    res = subprocess.run([str(ROOT / "infra" / "containers" / "images.sh")], env=engine_env(), capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    for image in IMAGES:
        user, health = podman("image", "inspect", "--format", "{{.User}}|{{.HealthCheck}}", f"onceflow-{image}:latest").split("|")
        assert user not in ("", "root", "0"), (image, user)
        if image in SERVICES:
            assert "onceflow.probe" in health, (image, health)


def test_compose_is_refused_without_an_admin_token() -> None:
    env = {k: v for k, v in engine_env().items() if k != "ONCEFLOW_ADMIN_TOKEN"} | {"ONCEFLOW_COMPOSE_PROJECT": PROJECT + "x"}
    for token in (None, ""):
        res = compose(env if token is None else env | {"ONCEFLOW_ADMIN_TOKEN": token}, "up", timeout_s=60)
        assert res.returncode == 2 and "set ONCEFLOW_ADMIN_TOKEN, the services listen on the compose network" in res.stderr, res.stderr
    # podman-compose itself refuses too (the file's `${ONCEFLOW_ADMIN_TOKEN:?...}`).
    res = subprocess.run(["podman-compose", "-p", PROJECT + "x", "-f", str(ROOT / "docker-compose.yml"), "ps"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "set ONCEFLOW_ADMIN_TOKEN" in res.stderr
    assert podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}x", "--format", "{{.Names}}") == ""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    ports = {name: free_port() for name in ("kafka", "redis", "console")}
    env = engine_env() | {"ONCEFLOW_COMPOSE_PROJECT": PROJECT, "ONCEFLOW_ADMIN_TOKEN": secrets.token_hex(16)}
    env |= {"ONCEFLOW_COMPOSE_KAFKA_PORT": str(ports["kafka"]), "ONCEFLOW_COMPOSE_REDIS_PORT": str(ports["redis"])}
    env["ONCEFLOW_COMPOSE_CONSOLE_PORT"] = str(ports["console"])
    for service in SERVICES:
        ports[service] = free_port()
        env[f"ONCEFLOW_COMPOSE_{service.upper()}_PORT"] = str(ports[service])
        env[f"ONCEFLOW_COMPOSE_{service.upper()}_METRICS_PORT"] = str(free_port())
    compose(env, "down", timeout_s=300)  # a stack left by an interrupted run
    started = time.monotonic()
    res = compose(env, "up")
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    print(f"compose stack up in {time.monotonic() - started:.0f} s")
    try:
        yield Stack(env, ports)
    finally:
        compose(env, "down", timeout_s=300)


def test_the_compose_stack_is_exact_end_to_end(stack: Stack) -> None:
    for service in LONG_RUNNING:
        assert stack.healthy(service), service
    assert podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", stack.container("topics")) == "exited 0"
    stack.send(PARTS[0])
    stack.assert_exact()


def test_one_service_is_upgraded_under_load_and_no_other_restarts(stack: Stack) -> None:
    before = stack.lives()
    old_image = podman("inspect", "--format", "{{.Image}}", stack.container("sink"))
    release = secrets.token_hex(4)
    load = Load(stack, PARTS[1])
    load.start()
    build = subprocess.run(
        [str(ROOT / "infra" / "containers" / "images.sh"), "sink", f"--release={release}"],
        env=engine_env(), capture_output=True, text=True, timeout=1800,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    res = compose(stack.env, "upgrade", "sink")
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    load.finish()
    # The visible change: the new container runs the new image, which carries the new label.
    assert podman("inspect", "--format", "{{.Image}}", stack.container("sink")) != old_image
    assert podman("inspect", "--format", '{{index .Config.Labels "onceflow.release"}}', stack.container("sink")) == release
    after = stack.lives()
    assert {s: v for s, v in after.items() if s != "sink"} == {s: v for s, v in before.items() if s != "sink"}
    assert after["sink"] != before["sink"]
    stack.assert_exact()


def test_a_killed_container_is_restarted_by_its_policy_and_the_table_stays_exact(stack: Stack) -> None:
    before = stack.lives()
    load = Load(stack, PARTS[2])
    load.start()
    time.sleep(3)
    # SIGKILL to the main process from outside, as a crash or the kernel's OOM killer sends it.
    # (`podman kill` would count as stopped by the user, and no restart policy restarts that.)
    os.kill(int(podman("inspect", "--format", "{{.State.Pid}}", stack.container("dedup"))), signal.SIGKILL)
    eventually(lambda: stack.lives()["dedup"][2] != before["dedup"][2], 120, "dedup's restart by its restart policy")
    eventually(lambda: stack.healthy("dedup"), 180, "the restarted dedup to serve", interval_s=2)
    load.finish()
    after = stack.lives()
    assert int(after["dedup"][2]) == int(before["dedup"][2]) + 1
    assert after["dedup"][0] == before["dedup"][0]  # the same container, restarted in place
    assert {s: v for s, v in after.items() if s != "dedup"} == {s: v for s, v in before.items() if s != "dedup"}
    stack.assert_exact()

"""Runs docker-compose.yml through Debian's podman-compose (`make compose-up`, `make compose-down`).

podman-compose creates every container from the file as it stands; this script only starts them
in the order the file's `depends_on` conditions give, because two things a Docker engine does are
missing here: podman-compose 1.0.3 ignores the conditions (it starts everything at once, so the
topics job would race the broker), and podman 4.3 schedules health checks through systemd timers,
which a machine without systemd never runs. So a condition `service_healthy` is waited for by
running the container's own health check (`podman healthcheck run`), `service_completed_successfully`
by `podman wait`. Restart policies are podman's own.

    compose.py up                 # create and start the stack, wait until every service is healthy
    compose.py upgrade SERVICE    # recreate one service's container from its image, wait until healthy
    compose.py down               # stop and remove the stack's containers

ONCEFLOW_COMPOSE_PROJECT names the stack (default onceflow); COMPOSE_PROFILES starts a profile's
services too (the source). Exit 2: refused before anything started (no token, engine or image).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from graphlib import TopologicalSorter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
TOKEN = "ONCEFLOW_ADMIN_TOKEN"


def project() -> str:
    return os.environ.get("ONCEFLOW_COMPOSE_PROJECT", "onceflow")


def container(service: str) -> str:
    """podman-compose 1.0.3's name for a service's (first) container."""
    return f"{project()}_{service}_1"


def engine_env() -> dict[str, str]:
    """The environment podman and podman-compose run in: the project's engine settings, and the
    locally built Kafka and Redis images unless the caller names others."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(ROOT / ".tools" / "containers" / "containers.conf"))
    prefix, tag = env.get("ONCEFLOW_IMAGE_PREFIX", "onceflow"), env.get("ONCEFLOW_IMAGE_TAG", "latest")
    env.setdefault("ONCEFLOW_KAFKA_IMAGE", f"{prefix}-kafka:{tag}")
    env.setdefault("ONCEFLOW_REDIS_IMAGE", f"{prefix}-redis:{tag}")
    return env


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["podman", *args], env=engine_env(), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise SystemExit(f"compose: podman {' '.join(args)} failed: {(res.stdout + res.stderr).strip()[-2000:]}")
    return res


def podman_compose(*args: str) -> None:
    """One podman-compose command; its (chatty) output goes to a log, shown only on failure."""
    log = ROOT / ".onceflow" / "logs" / f"compose-{project()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["podman-compose", "-p", project(), "-f", str(COMPOSE_FILE), *args]
    with log.open("a") as out:
        res = subprocess.run(cmd, env=engine_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        raise SystemExit(f"compose: {' '.join(cmd[1:])} failed (exit {res.returncode}); its output: {log}")


def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def enabled(spec: dict) -> bool:
    """A service without profiles always runs; one with profiles when COMPOSE_PROFILES names one
    (podman-compose 1.0.3 knows no profiles)."""
    wanted = {p for p in os.environ.get("COMPOSE_PROFILES", "").split(",") if p}
    return not spec.get("profiles") or bool(wanted & set(spec["profiles"]))


def refuse(message: str) -> None:
    print(f"compose: {message}", file=sys.stderr)
    raise SystemExit(2)


def preflight(started: dict[str, dict]) -> None:
    """Everything `up` needs, checked before any container exists."""
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            refuse(f"{tool} not found: run infra/containers/install.sh")
    if not Path(engine_env()["CONTAINERS_CONF"]).is_file():
        refuse("no engine settings (.tools/containers/containers.conf): run infra/containers/install.sh")
    if not os.environ.get(TOKEN):
        # The file's own reason (`${ONCEFLOW_ADMIN_TOKEN:?reason}`); podman-compose 1.0.3 would
        # take an empty token as given.
        reason = re.search(r"\$\{" + TOKEN + r":\?([^}]+)\}", COMPOSE_FILE.read_text())
        refuse(reason.group(1) if reason else f"set {TOKEN}")
    env = engine_env()
    for name, spec in started.items():
        image = re.sub(r"\$\{(\w+):-([^}]+)\}", lambda m: env.get(m.group(1)) or m.group(2), spec["image"])
        if podman("image", "exists", image, check=False).returncode != 0:
            refuse(f"no image {image} for {name}: run make images")


def health(name: str) -> str:
    """Run the container's health check once: 'healthy', 'unhealthy' or why it could not run."""
    res = podman("healthcheck", "run", name, check=False, timeout=60)
    if res.returncode == 0:
        return "healthy"
    return "unhealthy" if res.returncode == 1 else (res.stderr.strip() or f"exit {res.returncode}")


def state(name: str) -> tuple[str, int]:
    out = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.split()
    return out[0], int(out[1])


def wait_for(service: str, condition: str, deadline: float) -> None:
    name = container(service)
    while True:
        status, code = state(name)
        if condition == "service_completed_successfully":
            if status == "exited":
                if code != 0:
                    logs = podman("logs", "--tail", "30", name, check=False)
                    raise SystemExit(f"compose: {service} exited {code}:\n{logs.stdout}{logs.stderr}")
                return
        elif condition == "service_healthy":
            if status == "running" and health(name) == "healthy":
                return
        elif status == "running":
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"compose: {service} not {condition.removeprefix('service_')} in time (it is {status}): podman logs {name}")
        time.sleep(2)


def conditions(spec: dict) -> dict[str, str]:
    deps = spec.get("depends_on", {})
    return {d: "service_started" for d in deps} if isinstance(deps, list) else {d: c.get("condition", "service_started") for d, c in deps.items()}


def ready_condition(spec: dict) -> str:
    """What 'up' waits for at the end: a one-shot job (nothing restarts it, as the topics job)
    to succeed; a service to be healthy."""
    return "service_healthy" if "restart" in spec else "service_completed_successfully"


def up(timeout_s: float) -> None:
    start = time.monotonic()
    everything = services()
    started = {name: spec for name, spec in everything.items() if enabled(spec)}
    preflight(started)
    podman_compose("up", "--no-build", "--no-start")
    deadline = start + timeout_s
    order = TopologicalSorter({name: set(conditions(spec)) for name, spec in started.items()}).static_order()
    for name in order:
        for dep, condition in conditions(started[name]).items():
            wait_for(dep, condition, deadline)
        podman("start", container(name))
        print(f"compose: started {name} ({time.monotonic() - start:.0f} s)", flush=True)
    for name, spec in started.items():
        wait_for(name, ready_condition(spec), deadline)
    print(f"compose: {project()} is up, every service healthy, in {time.monotonic() - start:.0f} s")


def upgrade(service: str, timeout_s: float) -> None:
    """A new container for ``service`` from its image as it is now (`make images` rebuilt it),
    the others untouched: podman-compose creates only the container that is missing."""
    start = time.monotonic()
    spec = services()[service]
    preflight({service: spec})
    podman("stop", "--time", "20", container(service), check=False)
    podman("rm", "--force", container(service), check=False)
    log = ROOT / ".onceflow" / "logs" / f"compose-{project()}.log"
    try:
        podman_compose("up", "--no-build", "--no-start")
    except SystemExit:
        pass  # every other container exists already; podman-compose reports each as an error
    if podman("container", "exists", container(service), check=False).returncode != 0:
        raise SystemExit(f"compose: could not create {service}'s container; podman-compose's output: {log}")
    podman("start", container(service))
    wait_for(service, ready_condition(spec), start + timeout_s)
    print(f"compose: {service} upgraded and healthy in {time.monotonic() - start:.0f} s")


def down() -> None:
    if shutil.which("podman-compose") is None:
        refuse("podman-compose not found: run infra/containers/install.sh")
    podman_compose("down")
    podman("network", "rm", "--force", f"{project()}_default", check=False)
    print(f"compose: {project()} is down")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "upgrade", "down"])
    parser.add_argument("service", nargs="?")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the stack (or the service) to be healthy")
    args = parser.parse_args()
    if args.command == "up":
        up(args.timeout)
    elif args.command == "upgrade":
        if args.service not in services():
            parser.error(f"upgrade needs one of {', '.join(services())}")
        upgrade(args.service, args.timeout)
    else:
        down()


if __name__ == "__main__":
    main()

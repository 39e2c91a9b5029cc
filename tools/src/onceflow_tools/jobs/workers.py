"""A version's compute workers on this machine: started detached by `onceflow job deploy`
(each under ``onceflow_tools.supervise``, so exits 3 and 4 restart it), found again and
stopped by `onceflow job retire`. A deployment elsewhere (Kubernetes, Compose) runs the same
worker with the environment ``worker_env`` gives and `--no-start`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from onceflow.config import repo_root, runtime_dir
from onceflow.topology import LOCALHOST, versioned

from onceflow_tools.process import free_port


@dataclass(frozen=True)
class Worker:
    instance: str
    pid: int
    address: str
    log: str


def version_dir(job: str, version: int) -> Path:
    return runtime_dir() / "jobs" / versioned(job, version)


def worker_env(module: str, version: int, partitions: int, instance: str, port: int) -> dict[str, str]:
    """What a version's worker needs beyond the pipeline's common settings."""
    return {
        "ONCEFLOW_COMPUTE_JOB": module,
        "ONCEFLOW_COMPUTE_VERSION": str(version),
        "ONCEFLOW_COMPUTE_PARTITIONS": str(partitions),
        "ONCEFLOW_COMPUTE_INSTANCE": instance,
        "ONCEFLOW_COMPUTE_HOST": LOCALHOST,
        "ONCEFLOW_COMPUTE_PORT": str(port),
        "ONCEFLOW_COMPUTE_METRICS_PORT": "0",
    }


def start(job: str, version: int, module: str, partitions: int, count: int) -> list[Worker]:
    """``count`` workers of the version, detached from this process; their pids and addresses in
    the version's directory."""
    where = version_dir(job, version)
    where.mkdir(parents=True, exist_ok=True)
    workers = []
    for index in range(count):
        instance = f"{job}-v{version}-{index}"
        port = free_port()
        log_path = where / f"{instance}.log"
        env = {**os.environ, **worker_env(module, version, partitions, instance, port), "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "onceflow_tools.supervise", sys.executable, "-m", "onceflow_compute"],
                env=env, cwd=repo_root(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        workers.append(Worker(instance, process.pid, f"{LOCALHOST}:{port}", str(log_path)))
    (where / "workers.json").write_text(json.dumps([asdict(w) for w in workers], indent=2))
    return workers


def running(job: str, version: int) -> list[Worker]:
    """The version's workers started here that are still alive."""
    path = version_dir(job, version) / "workers.json"
    if not path.exists():
        return []
    return [w for w in (Worker(**item) for item in json.loads(path.read_text())) if _alive(w.pid)]


def stop(job: str, version: int, timeout_s: float = 60.0) -> list[Worker]:
    """SIGTERM to each worker (the supervisor passes it on and does not restart), then wait."""
    workers = running(job, version)
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_alive(w.pid) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    for worker in workers:
        if _alive(worker.pid):
            os.killpg(worker.pid, signal.SIGKILL)
    return workers


def stop_all(timeout_s: float = 60.0) -> list[str]:
    """Every version's workers started on this machine (`onceflow infra down` stops them before
    the broker they would keep retrying); the names of the versions stopped."""
    stopped = []
    for path in sorted((runtime_dir() / "jobs").glob("*/workers.json")):
        job, _sep, version = path.parent.name.partition("@")
        if version.isdigit() and stop(job, int(version), timeout_s):
            stopped.append(path.parent.name)
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"

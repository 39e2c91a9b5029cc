"""Spark from the pyspark wheel (no other download), on 127.0.0.1, started through the wheel's
``bin/spark-class``:

- a standalone cluster: one master and ``spark_workers`` workers, with their logs, work
  directories and pid files under ``$ONCEFLOW_HOME/spark-cluster``;
- a Spark Connect server (``ConnectServer``): a driver of its own, on ``spark_connect_master``,
  that compute reaches as ``sc://127.0.0.1:<spark_connect_port>``; under
  ``$ONCEFLOW_HOME/spark-connect``.

The executors run the Python the driver names (ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON; this
venv's is ``executor_python()``) with no PYTHONPATH of ours: a job module reaches them only if
the driver ships it (docs/services/compute.md, "Running on a cluster")."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow_tools.infra import plumbing
from onceflow_tools.infra.paths import runtime_dir
from onceflow_tools.infra.plumbing import InfraError
from onceflow_tools.infra.settings import InfraSettings

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def executor_python() -> str:
    """This venv's interpreter: on this machine's cluster it has onceflow-compute installed."""
    return sys.executable


def spark_home() -> Path:
    import pyspark  # the wheel is the distribution: bin/, jars/, sbin/

    return Path(pyspark.__file__).parent


class _Daemon(ABC):
    """A Spark JVM started detached through spark-class, recorded in a pid file and found again
    by a marker on its command line: what the master, the workers and the Connect server share."""

    @property
    @abstractmethod
    def dir(self) -> Path: ...

    @property
    @abstractmethod
    def log_path(self) -> Path: ...

    @property
    @abstractmethod
    def pid_file(self) -> Path: ...

    @property
    @abstractmethod
    def marker(self) -> str: ...

    @abstractmethod
    def command(self) -> list[str]: ...

    @abstractmethod
    def environment(self) -> dict[str, str]: ...

    def pid(self) -> int | None:
        return plumbing.read_pid(self.pid_file, self.marker)

    def start(self) -> int | None:
        """Spawn if not running, with no PYTHONPATH of ours; the pid, or None if it already ran."""
        if self.pid() is not None:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        env_prefix = ["env", "-u", "PYTHONPATH", *(f"{k}={v}" for k, v in self.environment().items())]
        pid = plumbing.spawn_detached([*env_prefix, *self.command()], self.log_path)
        self.pid_file.write_text(str(pid))
        return pid

    def stop(self, timeout: float = 20.0) -> bool:
        return plumbing.stop_recorded(self.pid_file, self.marker, timeout)

    def kill9(self) -> int | None:
        pid = self.pid()
        if pid is not None:
            plumbing.kill_pid(pid)
            self.pid_file.unlink(missing_ok=True)
        return pid


@dataclass(frozen=True)
class SparkDaemon(_Daemon):
    """The master (index 0) or worker ``index`` of the local standalone cluster."""

    index: int
    master_port: int
    worker_cores: int
    worker_memory: str
    home: Path

    @property
    def is_master(self) -> bool:
        return self.index == 0

    @property
    def name(self) -> str:
        return "spark-master" if self.is_master else f"spark-worker-{self.index}"

    @property
    def port(self) -> int:
        """RPC port: the master's, then one per worker just above it."""
        return self.master_port + self.index

    @property
    def web_port(self) -> int:
        return self.master_port + 100 + self.index

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def address(self) -> str:
        return self.master_url if self.is_master else f"127.0.0.1:{self.port}"

    @property
    def dir(self) -> Path:
        return self.home / self.name

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    def command(self) -> list[str]:
        spark_class = str(spark_home() / "bin" / "spark-class")
        common = ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.web_port)]
        if self.is_master:
            return [spark_class, MASTER_CLASS, *common]
        work = self.dir / "work"
        return [
            spark_class, WORKER_CLASS, *common, "--cores", str(self.worker_cores), "--memory", self.worker_memory,
            "--work-dir", str(work), self.master_url,
        ]

    def environment(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOG_DIR": str(self.dir),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }

    @property
    def marker(self) -> str:
        """What its command line holds: its port (several clusters may run on one host)."""
        return f"--port {self.port}"



def cluster(settings: InfraSettings | None = None, home: Path | None = None) -> list[SparkDaemon]:
    """The master, then its workers, as the settings describe them (under ``home``, default
    ``$ONCEFLOW_HOME/spark-cluster``)."""
    s = settings or InfraSettings()
    home = home or runtime_dir() / "spark-cluster"
    return [
        SparkDaemon(i, s.spark_master_port, s.spark_worker_cores, s.spark_worker_memory, home)
        for i in range(s.spark_workers + 1)
    ]


def master_state(master: SparkDaemon, timeout: float = 2.0) -> dict[str, Any] | None:
    """The master's own view (its web UI's JSON): status and workers; None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master.web_port}/json/", timeout=timeout) as reply:
            state = json.load(reply)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def alive_workers(master: SparkDaemon) -> set[int]:
    state = master_state(master) or {}
    return {
        int(w["port"]) for w in state.get("workers", []) if w.get("state") == "ALIVE" and w.get("host") == "127.0.0.1"
    } if state else set()


def up(timeout: float, daemons: list[SparkDaemon] | None = None) -> list[SparkDaemon]:
    """Start the master and every worker, and wait until the master lists them ALIVE."""
    daemons = daemons or cluster()
    master, workers = daemons[0], daemons[1:]
    with plumbing.file_lock(master.home / ".lock"):
        master.start()
        if not plumbing.wait_until(lambda: (master_state(master) or {}).get("status") == "ALIVE", timeout, 0.5):
            raise InfraError(f"the Spark master did not come up in {timeout:.0f}s; see {master.log_path}")
        for worker in workers:
            worker.start()
        wanted = {w.port for w in workers}
        if not plumbing.wait_until(lambda: wanted <= alive_workers(master), timeout, 0.5):
            raise InfraError(
                f"Spark workers {sorted(wanted - alive_workers(master))} did not register in {timeout:.0f}s; "
                f"see {workers[0].log_path}"
            )
    return daemons


def down(daemons: list[SparkDaemon] | None = None, home: Path | None = None) -> list[str]:
    """Workers first, then the master; the names of those that ran. By default every daemon
    with a pid file under ``home``, whatever the ports and worker count are now."""
    if daemons is not None:
        return [d.name for d in reversed(daemons) if d.stop()]
    home = home or runtime_dir() / "spark-cluster"
    stopped = []
    for pid_file in sorted(home.glob("spark-*/spark-*.pid"), reverse=True):  # workers sort after the master
        if plumbing.stop_recorded(pid_file, "org.apache.spark.deploy.", 20.0):
            stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    return stopped


def healthy(daemon: SparkDaemon, master: SparkDaemon) -> bool:
    if daemon.pid() is None:
        return False
    if daemon.is_master:
        return (master_state(daemon) or {}).get("status") == "ALIVE"
    return daemon.port in alive_workers(master)


def running() -> bool:
    """True if this home's master runs: `infra status` then shows the cluster."""
    return cluster()[0].pid() is not None


@dataclass(frozen=True)
class ConnectServer(_Daemon):
    """A Spark Connect server: the driver (on ``master``, ``local[N]`` or a standalone
    cluster's URL) lives here, and compute workers are its gRPC clients. Its executors run this
    venv's Python, which has onceflow-compute; a user's job package is shipped by the client
    (``addArtifacts``)."""

    port: int
    master: str
    driver_memory: str
    home: Path
    name: str = "spark-connect"

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def dir(self) -> Path:
        return self.home

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def marker(self) -> str:
        return f"spark.connect.grpc.binding.port={self.port}"

    def command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"), SUBMIT_CLASS, "--class", CONNECT_CLASS,
            "--name", "onceflow-spark-connect", "--master", self.master, "--driver-memory", self.driver_memory,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", self.marker,
            "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={executor_python()}",
            "spark-internal",
        ]

    def environment(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOG_DIR": str(self.dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": executor_python(),
        }


    def answers(self) -> bool:
        return plumbing.port_open(self.port)

    def up(self, timeout: float) -> ConnectServer:
        with plumbing.file_lock(self.home / ".lock"):
            self.start()
            if not plumbing.wait_until(self.answers, timeout, 0.5):
                raise InfraError(f"the Spark Connect server did not answer on {self.port} in {timeout:.0f}s; see {self.log_path}")
        return self


def executor_pids(home: Path) -> list[int]:
    """The executors (CoarseGrainedExecutorBackend) of the cluster under ``home``: they run in
    its workers' work directories."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_text().replace("\0", " ")
            if "CoarseGrainedExecutorBackend" in cmdline and (str(home) in cmdline or str(home) in os.readlink(proc / "cwd")):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def busy_executors(home: Path) -> list[int]:
    """Executors of the cluster under ``home`` running Python tasks (a pyspark.daemon under them)."""
    executors = set(executor_pids(home))
    busy = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if "pyspark.daemon" not in (proc / "cmdline").read_text():
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in executors:
            busy.append(parent)
    return busy


def connect_server(settings: InfraSettings | None = None, home: Path | None = None) -> ConnectServer:
    s = settings or InfraSettings()
    home = home or runtime_dir() / "spark-connect"
    return ConnectServer(s.spark_connect_port, s.spark_connect_master, s.spark_connect_memory, home)


def connect_running() -> bool:
    return connect_server().pid() is not None

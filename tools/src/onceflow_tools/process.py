"""A service as a real subprocess, and what operators and failures do to it: SIGTERM,
kill -9, SIGSTOP/SIGCONT (zombies), a restart of the broker under it. Used by the CLI's demo,
``onceflow verify`` and the fault tests."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2

from onceflow.admin.tls import ClientTLS, channel
from onceflow.config import CommonSettings, repo_root
from onceflow.probe import check_health
from onceflow_tools.infra import secure

if TYPE_CHECKING:
    from onceflow_tools.infra.kafka import KafkaBroker


# Below Linux's ephemeral range (32768-60999): a port handed out here is never taken meanwhile
# as the local end of somebody's outgoing connection, as one the kernel picked could be.
_FREE_PORTS = range(20000, 32700)


_handed_out: set[int] = set()


def free_port(span: int = 1) -> int:
    """The first of ``span`` consecutive ports nothing is bound to now, for a service started
    next (tests, benches, the demo). A span covers a component that takes the next ports too
    (a Redis replica on the primary's + 1)."""
    for _ in range(500):
        first = random.randrange(_FREE_PORTS.start, _FREE_PORTS.stop - span)
        ports = range(first, first + span)
        # Nothing binds a port until its service starts: never hand one out twice in a process.
        if not _handed_out.intersection(ports) and all(_bindable(port) for port in ports):
            _handed_out.update(ports)
            return first
    raise RuntimeError(f"no {span} free consecutive port(s) in {_FREE_PORTS}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class ServiceProcess:
    """``python -m module args``, or with ``command`` an explicit argv (a JVM peer of
    ``onceflow bench``: ``java -jar ...``), in a session of its own, its output in ``log_path``."""

    def __init__(
        self, name: str, module: str, env: Mapping[str, str], log_dir: Path, cwd: Path | None = None,
        args: Sequence[str] = (),
        python: str = sys.executable,
        command: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.args = list(args)
        self.python = python  # another venv's, for a peer whose pins clash with ours (onceflow bench)
        self.command = list(command) if command is not None else None
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.log_path = log_dir / f"{name}.log"
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def argv(self) -> list[str]:
        """What ``start`` runs."""
        return self.command if self.command is not None else [self.python, "-m", self.module, *self.args]

    def start(self, extra_env: Mapping[str, str] | None = None) -> ServiceProcess:
        env = {**self.env, **(extra_env or {})}
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.argv, env=env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Its exit code, once ``alive()`` (or a wait) has seen it exit; None before."""
        return self.proc.returncode if self.proc is not None else None

    def exited(self) -> AssertionError:
        """The failure of a wait that found the process gone: its exit code and its log's tail."""
        return AssertionError(f"{self.name} exited with {self.returncode}\n{self.log_tail()}")

    def kill9(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30)

    def sigstop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def stopped(self) -> bool:
        """True while the process is stopped (SIGSTOP): state T in /proc."""
        if not self.alive():
            return False
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def sigcont(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: a graceful stop."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s}s\n{self.log_tail()}") from None

    def wait_exit(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            stacks = self.stack_dump() or "(no py-spy)"
            raise AssertionError(f"{self.name} still running after {timeout_s}s\n{self.log_tail()}\n{stacks}") from None

    def stack_dump(self) -> str:
        """Every thread's Python stack, or "" if it cannot be had (see ``stack_dump``)."""
        return stack_dump(self.pid) if self.alive() else ""

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def wait_healthy(self, address: str, timeout_s: float = 60.0, tls: ClientTLS | None = None) -> None:
        """Until grpc.health.v1 answers SERVING."""
        deadline = time.monotonic() + timeout_s
        with channel(address, tls) as chan:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise self.exited()
                try:
                    reply = check_health(chan, timeout_s=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"{self.name} not healthy on {address} after {timeout_s}s\n{self.log_tail()}")

    def wait_log(self, needle: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.log_path.read_text(errors="replace"):
                return
            if not self.alive():
                raise self.exited()
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: no {needle!r} in its log after {timeout_s}s\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])


# A process that is not its package's main module: the Kafka output topic (ONCEFLOW_SINK_KAFKA_*).
MODULES = {"sink_kafka": "onceflow_sink.kafka_output"}


def pipeline_service(
    name: str, address: str, prefix: str, instance: str, log_dir: Path, log_name: str | None = None, **settings: str
) -> ServiceProcess:
    """One of the five services (``onceflow_<name>``) on ``address``, on topic prefix ``prefix``,
    as ``instance`` (its transactional.id derives from it: a second process with the same
    instance fences the first). ``settings`` are the service's own, without their
    ``ONCEFLOW_<NAME>_`` prefix."""
    upper = f"ONCEFLOW_{name.upper()}_"
    env = {
        "ONCEFLOW_TOPIC_PREFIX": prefix,
        f"{upper}INSTANCE": instance,
        f"{upper}PORT": address.rsplit(":", 1)[1],
        f"{upper}METRICS_PORT": "0",
        **{f"{upper}{key}": value for key, value in settings.items()},
    }
    if secure.enabled():  # the service's own credentials, not the admin's (ADR 0029)
        env |= secure.service_env(name, CommonSettings().redis_url)
    return ServiceProcess(log_name or name, MODULES.get(name, f"onceflow_{name}"), env, log_dir, cwd=repo_root())


def stack_dump(pid: int, native: bool = False) -> str:
    """Every thread's Python stack in process ``pid`` (py-spy, a dev dependency), with the C
    frames beneath if ``native``; "" if py-spy is missing: where a process that should have
    moved on sits, rather than guesses."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        return ""
    try:
        done = subprocess.run(
            [py_spy, "dump", *(["--native"] if native else []), "--pid", str(pid)],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy dump failed: {exc}"
    return done.stdout + done.stderr


# Long enough for an EndTxn already sent to have its markers written, on a loaded machine.
MARKERS_SETTLE_S = 1.0


def restart_lone_broker(broker: KafkaBroker, services: Iterable[ServiceProcess], hard: bool = False) -> None:
    """Restart the only broker (SIGKILL if ``hard``), the services frozen (SIGSTOP) while it
    goes down and thawed while it is down, so they meet a dead broker and its return, open
    transactions included.

    Frozen because Kafka (4.3.1) on one node can lose a transaction's markers: the coordinator
    skips a partition it finds no leader for ("likely deleted already") and may still record
    the transaction complete, and the partition's last stable offset hangs for good
    (docs/architecture.md, 'Hanging transactions'). A transaction ending while a restart takes
    the leaderships away is what risks it. Frozen, no client can end one, so the restart keeps
    the faults onceflow must survive; the coordinator could still abort one that outlived its
    timeout (10 s) meanwhile, so the risk is made small, not removed. On a cluster leaderships
    move before a broker stops: `make test-cluster` kills brokers mid-commit there."""
    frozen: list[ServiceProcess] = []
    try:
        for proc in services:
            if proc.alive():
                proc.sigstop()
                frozen.append(proc)
        time.sleep(MARKERS_SETTLE_S)
        if hard:
            broker.kill()
        else:
            broker.stop()
    finally:
        for proc in frozen:
            proc.sigcont()
    broker.start()

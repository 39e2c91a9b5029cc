"""The local Kafka broker: KRaft combined mode on 127.0.0.1, one node or a cluster of three.
This module starts, stops and watches the JVM; its jars come from kafka_install (Maven Central,
pinned), its properties from kafka_config and its command line from kafka_jvm."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from onceflow.kafka.clients import plain_config
from onceflow_tools.infra import plumbing
from onceflow_tools.infra.kafka_config import random_cluster_id, render_server_properties, scram_format_args
from onceflow_tools.infra.kafka_install import KafkaJars
from onceflow_tools.infra.kafka_jvm import (
    JVM_OPTS, MAIN_CLASS, class_archive_opts, drop_partial_class_archive, java_executable, log_opts,
)
from onceflow_tools.infra.paths import display_path, runtime_dir
from onceflow_tools.infra.plumbing import InfraError
from onceflow_tools.infra.settings import InfraSettings, kafka_mtls_port, kafka_port

# The public face of the broker: callers import these from here, wherever they are defined.
__all__ = ["CLUSTER_SIZE", "InfraError", "KafkaBroker", "active_controller", "cluster", "java_executable"]

log = logging.getLogger(__name__)

CLUSTER_SIZE = 3


@dataclass
class KafkaBroker:
    """One broker+controller JVM. All state lives under ``home`` (``$ONCEFLOW_HOME/kafka``, or a
    node's folder under ``kafka-cluster/``); the jars under ``libs_home`` (shared by a cluster)."""

    port: int
    controller_port: int
    home: Path
    node_id: int = 1
    # A cluster's static quorum, "1@host:port,2@host:port,..." ('' = one standalone node).
    voters: str = ""
    libs_home: Path | None = None
    # SASL_SSL (SCRAM) listener, and a mutual-TLS one on ``mtls_port``; certificates and
    # password from onceflow_tools.infra.secure.
    secure: bool = False
    mtls_port: int = 0

    @classmethod
    def from_env(cls, secure: bool | None = None) -> KafkaBroker:
        """The single broker (a cluster's nodes: ``cluster``); in secure mode the secure one,
        in a home of its own (its SCRAM user is written when its storage is formatted)."""
        s = InfraSettings()
        if s.secure if secure is None else secure:
            port = kafka_port(s)
            return cls(
                port=port, controller_port=s.kafka_controller_port, home=runtime_dir() / "kafka-secure",
                libs_home=runtime_dir() / "kafka", secure=True, mtls_port=kafka_mtls_port(s),
            )
        return cls(port=kafka_port(s), controller_port=s.kafka_controller_port, home=runtime_dir() / "kafka")

    @property
    def name(self) -> str:
        return f"kafka-{self.node_id}" if self.voters else "kafka"

    # -- layout ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def jars(self) -> KafkaJars:
        return KafkaJars(self.libs_dir)

    @property
    def libs_dir(self) -> Path:
        return (self.libs_home or self.home) / "libs"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def log_path(self) -> Path:
        """log4j2's server.log: what to read when the broker misbehaves."""
        return self.log_dir / "server.log"

    @property
    def out_path(self) -> Path:
        """The JVM's stdout/stderr: crashes before log4j2 is up (bad flags, missing class)."""
        return self.log_dir / "kafka.out"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def props_path(self) -> Path:
        return self.home / "server.properties"

    @property
    def _lock(self) -> Path:
        return self.home / ".lock"

    # -- jars (kafka_install) -----------------------------------------------------------------

    @property
    def pom(self) -> Path:
        return self.jars.pom

    @property
    def pins(self) -> Path:
        """infra/kafka/jars.sha256: the sha256 of every jar the pom assembles."""
        return self.jars.pins

    @property
    def version(self) -> str:
        """The Kafka version pinned in infra/kafka/pom.xml."""
        return self.jars.version

    def check_jars(self, folder: Path) -> None:
        """Every jar in ``folder`` is one pinned, with its pinned sha256, and every pinned jar is
        there (kafka_install.KafkaJars.check)."""
        self.jars.check(folder)

    def is_installed(self) -> bool:
        return self.jars.is_installed()

    def install(self, force: bool = False) -> bool:
        """Copy the broker's runtime jars into ``libs_dir`` with Maven. Skipped (returns False)
        when the stamp matches the pom's hash, so only a pom change costs a Maven run."""
        with plumbing.file_lock(self._lock):
            return self.jars.install(force)

    # -- storage ----------------------------------------------------------------------------

    def is_formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    @property
    def _cluster_id_file(self) -> Path:
        return self.home.parent / "cluster-id"

    def _cluster_id(self) -> str:
        """One node alone: a fresh id. A cluster's nodes: the one id, written by the first."""
        if not self.voters:
            return random_cluster_id()
        with plumbing.file_lock(self.home.parent / ".cluster-id.lock"):
            if not self._cluster_id_file.exists():
                self._cluster_id_file.write_text(random_cluster_id() + "\n")
            return self._cluster_id_file.read_text().strip()

    def format(self) -> bool:
        """Format the KRaft storage once (a fresh cluster id); False if already formatted."""
        with plumbing.file_lock(self._lock):
            return self._format()

    def _format(self) -> bool:
        if self.is_formatted():
            return False
        self.jars.install()
        render_server_properties(self)
        cmd = [
            java_executable(),
            *log_opts(self.log_dir),
            "-cp",
            f"{self.libs_dir}/*",
            "kafka.tools.StorageTool",
            "format",
            *([] if self.voters else ["--standalone"]),  # static voters need no initial controllers
            *(scram_format_args() if self.secure else []),
            "-t",
            self._cluster_id(),
            "-c",
            str(self.props_path),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise InfraError(f"kafka storage format failed:\n{(res.stdout + res.stderr).strip()[-3000:]}")
        return True

    # -- process ----------------------------------------------------------------------------

    def pid(self) -> int | None:
        return plumbing.read_pid(self.pid_file, MAIN_CLASS)

    def is_running(self) -> bool:
        return self.pid() is not None

    def is_healthy(self, timeout: float = 2.0) -> bool:
        """The broker answers a metadata request and lists itself."""
        if not plumbing.port_open(self.port, timeout=min(timeout, 0.5)):
            return False
        from confluent_kafka.admin import AdminClient

        # log_level 0: a broker that is still starting is expected here, not worth a stderr line.
        admin = AdminClient(plain_config(self.bootstrap, log_level=0, error_cb=lambda _e: None))
        try:
            md = admin.list_topics(timeout=timeout)
        except Exception:
            return False
        return self.node_id in md.brokers

    def start(self, timeout: float = 90.0) -> bool:
        """Install, format and start the broker if needed, then wait until it answers.
        Returns False (fast) if it was already healthy."""
        with plumbing.file_lock(self._lock):
            return self._start(timeout)

    def _start(self, timeout: float) -> bool:
        pid = self._spawn()
        if pid is None:
            return False
        self._wait_ready(pid, timeout)
        return True

    def spawn(self) -> int | None:
        """Start the JVM if it is not running, without waiting for it: a cluster's nodes must all
        be started before any can elect a controller. The pid, or None if already healthy."""
        with plumbing.file_lock(self._lock):
            return self._spawn()

    def wait_ready(self, pid: int, timeout: float = 90.0) -> None:
        self._wait_ready(pid, timeout)

    def _spawn(self) -> int | None:
        pid = self.pid()
        if pid is None:
            if self.is_healthy(timeout=2.0):
                raise InfraError(
                    f"{self.bootstrap} is answered by a Kafka that onceflow did not start"
                    f" (no live pid in {display_path(self.pid_file)})"
                )
            if plumbing.port_open(self.port) or plumbing.port_open(self.controller_port):
                raise InfraError(f"port {self.port} or {self.controller_port} is taken by another process")
        elif self.is_healthy(timeout=2.0):
            return None
        if pid is None:
            self.jars.install()
            self._format()
            render_server_properties(self)
            java = java_executable()
            classpath = ["-cp", f"{self.libs_dir}/*", MAIN_CLASS, str(self.props_path)]
            cmd = [java, *JVM_OPTS, *class_archive_opts(self.home, self.jars.pom_hash(), java), *log_opts(self.log_dir), *classpath]
            if self.out_path.exists():  # keep the previous JVM's output (a crash) one start longer
                self.out_path.replace(self.out_path.with_suffix(".out.prev"))
            pid = plumbing.spawn_detached(cmd, self.out_path, cwd=self.home)
            self.pid_file.write_text(f"{pid}\n")
        return pid

    def _wait_ready(self, pid: int, timeout: float) -> None:
        started = time.monotonic()

        def ready() -> bool:
            if not plumbing.pid_alive(pid):
                raise InfraError(self._failure(f"Kafka exited during start-up (pid {pid})"))
            return self.is_healthy(timeout=1.0)

        if not plumbing.wait_until(ready, timeout, 0.2):
            raise InfraError(
                self._failure(f"Kafka did not answer on {self.bootstrap} within {timeout:.0f}s (pid {pid})")
            )
        log.info("%s up on %s in %.1fs", self.name, self.bootstrap, time.monotonic() - started)

    def _failure(self, what: str) -> str:
        out = plumbing.tail(self.out_path, 15)
        hint = f"\n--- {display_path(self.out_path)} (tail) ---\n{out}" if out.strip() else ""
        return f"{what}; see {display_path(self.log_path)}{hint}"

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (controlled shutdown, clean logs), SIGKILL after ``timeout``.
        Returns False if it was not running."""
        with plumbing.file_lock(self._lock):
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        if not plumbing.stop_pid(pid, timeout):
            drop_partial_class_archive(self.home)
            log.warning("kafka (pid %d) ignored SIGTERM for %.0fs and was killed", pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL, as a crash would: the next start recovers the logs. False if not running."""
        pid = self.pid()
        if pid is None:
            return False
        plumbing.kill_pid(pid)
        drop_partial_class_archive(self.home)
        return True

    def pause(self) -> bool:
        """SIGSTOP: a broker that stops answering (a long GC pause, a partitioned host) while its
        sessions, leaderships and open connections stay. False if not running."""
        return self._signal(signal.SIGSTOP)

    def resume(self) -> bool:
        return self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signum)
        return True

    def quorum_state(self) -> tuple[int, int] | None:
        """(leader epoch, leader id) of the KRaft quorum as this node last wrote it to disk, or
        None before it has voted. Clients cannot ask: in KRaft a Metadata or DescribeCluster
        answer names a random broker as "the controller", not the quorum's leader."""
        try:
            state = json.loads((self.data_dir / "__cluster_metadata-0" / "quorum-state").read_text())
        except (OSError, ValueError):
            return None
        return int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))

    def warm_up(self, timeout: float = 30.0, bootstrap: str = "") -> None:
        """Have the cluster (``bootstrap``, default this broker) create and load
        __transaction_state and __consumer_offsets now: else the first clients of a fresh
        cluster wait seconds on COORDINATOR_LOAD_IN_PROGRESS."""
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
        from confluent_kafka.admin import AdminClient

        bootstrap = bootstrap or self.bootstrap
        admin = AdminClient(plain_config(bootstrap))
        if {"__consumer_offsets", "__transaction_state"} <= set(admin.list_topics(timeout=timeout).topics):
            return
        # log_level 3: the expected "coordinator load in progress" retries are not worth a line.
        quiet = plain_config(bootstrap, log_level=3)
        producer = Producer({**quiet, "transactional.id": "onceflow-infra-warm-up"})
        producer.init_transactions(timeout)
        # A consumer's offset fetch makes the broker create __consumer_offsets and load its
        # coordinator. Not AdminClient.list_consumer_group_offsets: librdkafka 2.16 segfaults
        # when that call meets a loading coordinator (librdkafka#5040).
        consumer = Consumer({**quiet, "group.id": "onceflow-infra-warm-up"})
        deadline = time.monotonic() + timeout
        try:
            while True:  # NOT_COORDINATOR / loading until the new partitions have a leader
                try:
                    consumer.committed([TopicPartition("__transaction_state", 0)], timeout=timeout)
                    return
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            consumer.close()

    def restart(self, hard: bool = False, timeout: float = 90.0) -> None:
        """Stop (SIGKILL if ``hard``) and start again on the same data."""
        with plumbing.file_lock(self._lock):
            if hard:
                self.kill()
            else:
                self._stop(timeout=30.0)
            self._start(timeout)


def cluster(settings: InfraSettings | None = None) -> list[KafkaBroker]:
    """The brokers ``ONCEFLOW_KAFKA_BROKERS`` asks for: the single broker, or N combined
    broker+controller nodes under ``kafka-cluster/`` (node i on the first port + 10 (i - 1), its
    controller likewise), every node a voter. A cluster once started stays the topology for
    status and down while any node of it runs."""
    s = settings or InfraSettings()
    if s.secure and s.kafka_brokers > 1:
        raise InfraError("secure mode runs one broker (ONCEFLOW_SECURE with ONCEFLOW_KAFKA_BROKERS=3 is not supported)")
    single = KafkaBroker.from_env(secure=s.secure)
    base, controller = kafka_port(s), s.kafka_controller_port
    home = runtime_dir() / "kafka-cluster"
    count = CLUSTER_SIZE
    voters = ",".join(f"{i}@127.0.0.1:{controller + 10 * (i - 1)}" for i in range(1, count + 1))
    nodes = [
        KafkaBroker(
            port=base + 10 * (i - 1), controller_port=controller + 10 * (i - 1), home=home / f"node-{i}",
            node_id=i, voters=voters, libs_home=single.home,
        )
        for i in range(1, count + 1)
    ]
    if s.kafka_brokers > 1 or any(node.is_running() for node in nodes):
        return nodes
    return [single]


def active_controller(nodes: list[KafkaBroker]) -> KafkaBroker | None:
    """The node the running voters last agreed leads the KRaft quorum (the highest epoch any of
    them recorded), or None while no leader is known."""
    states = [(state, node) for node in nodes if node.is_running() and (state := node.quorum_state())]
    if not states:
        return None
    (_epoch, leader), _node = max(states, key=lambda pair: pair[0])
    return next((node for node in nodes if node.node_id == leader), None)

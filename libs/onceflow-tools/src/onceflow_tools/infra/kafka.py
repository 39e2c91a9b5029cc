"""The local Kafka broker: jars from Maven Central, KRaft combined mode on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from onceflow.kafka.clients import plain_config
from onceflow_tools.infra import plumbing, secure
from onceflow_tools.infra.paths import display_path, infra_dir, runtime_dir
from onceflow_tools.infra.plumbing import InfraError
from onceflow_tools.infra.settings import InfraSettings, kafka_mtls_port, kafka_port

log = logging.getLogger(__name__)

_MAIN_CLASS = "kafka.Kafka"
CLUSTER_SIZE = 3
# Small heap: a dev broker holds little, and it shares a 2-core box with the services and tests.
# The G1 flags are those of Kafka's own start script.
_JVM_OPTS = [
    "-Xms256m",
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]


def java_executable() -> str:
    """JAVA_HOME's java, else the one on PATH (the broker's, and the Kafka Streams peer's of
    ``onceflow bench``)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise InfraError("java not found: Kafka needs a JRE 17+ (apt-get install openjdk-17-jre-headless)")
    return found


def _random_cluster_id() -> str:
    # Kafka's own format (Uuid.randomUuid): url-safe base64 without padding, never leading '-'.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


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
    def pom(self) -> Path:
        return infra_dir() / "kafka" / "pom.xml"

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

    @property
    def _stamp(self) -> Path:
        return self.libs_dir / ".pom-sha256"

    @property
    def version(self) -> str:
        """The Kafka version pinned in infra/kafka/pom.xml."""
        m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", self.pom.read_text())
        return m.group(1) if m else "?"

    # -- install ----------------------------------------------------------------------------

    def _pom_hash(self) -> str:
        """What the installed jars answer to: the pom and the pinned hashes (a change of either
        installs and checks them again)."""
        return hashlib.sha256(self.pom.read_bytes() + self.pins.read_bytes()).hexdigest()

    @property
    def pins(self) -> Path:
        """infra/kafka/jars.sha256: the sha256 of every jar the pom assembles."""
        return self.pom.with_name("jars.sha256")

    def check_jars(self, folder: Path) -> None:
        """Every jar in ``folder`` is one pinned, with its pinned sha256, and every pinned jar is
        there: anything else is refused before it reaches the classpath (issue 39)."""
        pinned = {}
        for line in self.pins.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                digest, name = line.split()
                pinned[name] = digest
        found = {jar.name: hashlib.sha256(jar.read_bytes()).hexdigest() for jar in folder.glob("*.jar")}
        wrong = [f"{name}: sha256 {digest}, pinned {pinned[name]}" for name, digest in found.items() if name in pinned and digest != pinned[name]]
        unpinned = sorted(set(found) - set(pinned))
        absent = sorted(set(pinned) - set(found))
        problems = wrong + [f"{name}: not pinned" for name in unpinned] + [f"{name}: pinned, not assembled" for name in absent]
        if problems:
            raise InfraError(
                f"Kafka {self.version}'s jars do not match {self.pins.name} (a changed pom needs new pins; otherwise "
                "something other than Maven Central's jars was served): " + "; ".join(problems)
            )

    def is_installed(self) -> bool:
        try:
            stamp_ok = self._stamp.read_text().strip() == self._pom_hash()
        except OSError:
            return False
        return stamp_ok and any(self.libs_dir.glob("kafka_*.jar"))

    def install(self, force: bool = False) -> bool:
        """Copy the broker's runtime jars into ``libs_dir`` with Maven. Skipped (returns False)
        when the stamp matches the pom's hash, so only a pom change costs a Maven run."""
        with plumbing.file_lock(self._lock):
            return self._install(force)

    def _install(self, force: bool = False) -> bool:
        if not force and self.is_installed():
            return False
        mvn = shutil.which("mvn")
        if not mvn:
            raise InfraError(
                "mvn not found: the broker's jars come from Maven Central (apt-get install maven)"
            )
        # Beside libs_dir, which a cluster's nodes share (in a fresh home, not yet made).
        staging = self.libs_dir.parent / "libs.partial"
        staging.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(self.pom), "validate", f"-Donceflow.kafka.libs={staging}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            out = (res.stdout + res.stderr).strip()
            raise InfraError(f"maven could not assemble Kafka {self.version}:\n{out[-3000:]}")
        self.check_jars(staging)
        (staging / ".pom-sha256").write_text(self._pom_hash() + "\n")
        # Swap the whole folder so a version change leaves no stale jars on the classpath.
        shutil.rmtree(self.libs_dir, ignore_errors=True)
        staging.replace(self.libs_dir)
        return True

    # -- storage ----------------------------------------------------------------------------

    def is_formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def _render_props(self) -> Path:
        if self.voters:
            quorum, replicas = f"controller.quorum.voters={self.voters}", len(self.voters.split(","))
        else:
            quorum, replicas = f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}", 1
        return plumbing.render(
            infra_dir() / "kafka" / "server.properties",
            self.props_path,
            {
                "kafka_port": self.port, "controller_port": self.controller_port, "data_dir": self.data_dir,
                "node_id": self.node_id, "quorum": quorum, "replicas": min(3, replicas),
                "min_isr": max(1, min(2, replicas - 1)),
                "listener": "SASL_SSL" if self.secure else "PLAINTEXT", "security": self._security_props(),
                "mtls_listener": f",SSL://127.0.0.1:{self.mtls_port}" if self.secure else "",
                "mtls_protocol": ",SSL:SSL" if self.secure else "",
                "controller_protocol": "SSL" if self.secure else "PLAINTEXT",
            },
        )

    def _security_props(self) -> str:
        if not self.secure:
            return ""
        m = secure.material()
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{secure.USER}" password="{m.kafka_password}";'
        )
        return "\n".join([
            "# Secure mode (onceflow_tools.infra.secure): SCRAM over TLS, the broker's own connections too.",
            f"sasl.enabled.mechanisms={secure.SCRAM_MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={secure.SCRAM_MECHANISM}",
            f"listener.name.sasl_ssl.{secure.SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={m.server_keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={m.ca}",
            "# The mutual-TLS listener: a client certificate the CA signed, or no connection.",
            "listener.name.ssl.ssl.client.auth=required",
            "# The controller listener: TLS with the broker's own certificate, so it has a principal too.",
            "listener.name.controller.ssl.client.auth=required",
            "# Least privilege (ADR 0029): nothing is allowed that no ACL allows. The admin user, the",
            "# broker's certificate (its connections to the controller) and the operator's client",
            "# certificate are super users; each service is a principal of its own (infra/access.py).",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{secure.USER};User:CN=server;User:CN=client",
        ])

    @property
    def _cluster_id_file(self) -> Path:
        return self.home.parent / "cluster-id"

    def _cluster_id(self) -> str:
        """One node alone: a fresh id. A cluster's nodes: the one id, written by the first."""
        if not self.voters:
            return _random_cluster_id()
        with plumbing.file_lock(self.home.parent / ".cluster-id.lock"):
            if not self._cluster_id_file.exists():
                self._cluster_id_file.write_text(_random_cluster_id() + "\n")
            return self._cluster_id_file.read_text().strip()

    def format(self) -> bool:
        """Format the KRaft storage once (a fresh cluster id); False if already formatted."""
        with plumbing.file_lock(self._lock):
            return self._format()

    def _format(self) -> bool:
        if self.is_formatted():
            return False
        self._install()
        self._render_props()
        cmd = [
            java_executable(),
            *self._log_opts(),
            "-cp",
            f"{self.libs_dir}/*",
            "kafka.tools.StorageTool",
            "format",
            *([] if self.voters else ["--standalone"]),  # static voters need no initial controllers
            *self._scram_args(),
            "-t",
            self._cluster_id(),
            "-c",
            str(self.props_path),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise InfraError(f"kafka storage format failed:\n{(res.stdout + res.stderr).strip()[-3000:]}")
        return True

    def _scram_args(self) -> list[str]:
        """The SCRAM user, written into the metadata log at format time (KRaft has no ZooKeeper
        to hold it, and the broker needs it for its own connections before it can serve)."""
        if not self.secure:
            return []
        password = secure.material().kafka_password
        return ["--add-scram", f"{secure.SCRAM_MECHANISM}=[name={secure.USER},password={password}]"]

    def _cds_opts(self, java: str) -> list[str]:
        """AppCDS: the first run records the loaded classes into an archive when it exits, later
        starts map it and reach the listener ~1.5 s sooner (of ~4 s) - fault tests restart a lot.
        Keyed on the jars and the JVM; a stale or broken archive is only ignored by the JVM."""
        real = Path(java).resolve()
        key = hashlib.sha256(f"{self._pom_hash()}|{real}|{real.stat().st_mtime_ns}".encode()).hexdigest()[:12]
        archive = self.home / f"cds-{key}.jsa"
        dump = archive.with_suffix(".dump")
        if dump.exists():  # written by a JVM that exited cleanly (a killed one's is deleted)
            dump.replace(archive)
        if archive.exists():
            return [f"-XX:SharedArchiveFile={archive}"]
        for old in self.home.glob("cds-*"):
            old.unlink(missing_ok=True)
        return [f"-XX:ArchiveClassesAtExit={dump}", "-Xlog:cds=off"]

    def _drop_partial_cds(self) -> None:
        for dump in self.home.glob("cds-*.dump"):
            dump.unlink(missing_ok=True)

    def _log_opts(self) -> list[str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return [
            f"-Dlog4j2.configurationFile={infra_dir() / 'kafka' / 'log4j2.xml'}",
            f"-Donceflow.kafka.logs={self.log_dir}",
        ]

    # -- process ----------------------------------------------------------------------------

    def pid(self) -> int | None:
        return plumbing.read_pid(self.pid_file, _MAIN_CLASS)

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
            self._install()
            self._format()
            self._render_props()
            java = java_executable()
            classpath = ["-cp", f"{self.libs_dir}/*", _MAIN_CLASS, str(self.props_path)]
            cmd = [java, *_JVM_OPTS, *self._cds_opts(java), *self._log_opts(), *classpath]
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
            self._drop_partial_cds()
            log.warning("kafka (pid %d) ignored SIGTERM for %.0fs and was killed", pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL, as a crash would: the next start recovers the logs. False if not running."""
        pid = self.pid()
        if pid is None:
            return False
        plumbing.kill_pid(pid)
        self._drop_partial_cds()
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

"""How a Kafka JVM is started: which java, the heap and GC flags, the log4j2 set-up, and the
class-data-sharing archive that makes restarts faster."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from onceflow_tools.infra.paths import infra_dir
from onceflow_tools.infra.plumbing import InfraError

MAIN_CLASS = "kafka.Kafka"
# Small heap: a dev broker holds little, and it shares a 2-core box with the services and tests.
# The G1 flags are those of Kafka's own start script.
JVM_OPTS = [
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


def log_opts(log_dir: Path) -> list[str]:
    """log4j2 from infra/kafka, writing into ``log_dir`` (made here)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return [
        f"-Dlog4j2.configurationFile={infra_dir() / 'kafka' / 'log4j2.xml'}",
        f"-Donceflow.kafka.logs={log_dir}",
    ]


def class_archive_opts(home: Path, jars_hash: str, java: str) -> list[str]:
    """AppCDS: the first run records the loaded classes into an archive when it exits, later
    starts map it and reach the listener ~1.5 s sooner (of ~4 s) - fault tests restart a lot.
    Keyed on the jars and the JVM; a stale or broken archive is only ignored by the JVM."""
    real = Path(java).resolve()
    key = hashlib.sha256(f"{jars_hash}|{real}|{real.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    archive = home / f"cds-{key}.jsa"
    dump = archive.with_suffix(".dump")
    if dump.exists():  # written by a JVM that exited cleanly (a killed one's is deleted)
        dump.replace(archive)
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}"]
    for old in home.glob("cds-*"):
        old.unlink(missing_ok=True)
    return [f"-XX:ArchiveClassesAtExit={dump}", "-Xlog:cds=off"]


def drop_partial_class_archive(home: Path) -> None:
    """A killed JVM's archive dump is incomplete: never let a later start map it."""
    for dump in home.glob("cds-*.dump"):
        dump.unlink(missing_ok=True)

"""The broker's jars: assembled from Maven Central by infra/kafka/pom.xml, checked against the
sha256 pinned in infra/kafka/jars.sha256 before they reach the classpath (issue 39)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from onceflow_tools.infra.paths import infra_dir
from onceflow_tools.infra.plumbing import InfraError


@dataclass(frozen=True)
class KafkaJars:
    """The runtime jars in ``libs_dir``, stamped with the hash of the pom and pins they answer
    to. Not locked here: the broker that owns the folder holds its lock around an install."""

    libs_dir: Path

    @property
    def pom(self) -> Path:
        return infra_dir() / "kafka" / "pom.xml"

    @property
    def pins(self) -> Path:
        """infra/kafka/jars.sha256: the sha256 of every jar the pom assembles."""
        return self.pom.with_name("jars.sha256")

    @property
    def version(self) -> str:
        """The Kafka version pinned in infra/kafka/pom.xml."""
        m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", self.pom.read_text())
        return m.group(1) if m else "?"

    @property
    def _stamp(self) -> Path:
        return self.libs_dir / ".pom-sha256"

    def pom_hash(self) -> str:
        """What the installed jars answer to: the pom and the pinned hashes (a change of either
        installs and checks them again)."""
        return hashlib.sha256(self.pom.read_bytes() + self.pins.read_bytes()).hexdigest()

    def check(self, folder: Path) -> None:
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
            stamp_ok = self._stamp.read_text().strip() == self.pom_hash()
        except OSError:
            return False
        return stamp_ok and any(self.libs_dir.glob("kafka_*.jar"))

    def install(self, force: bool = False) -> bool:
        """Copy the broker's runtime jars into ``libs_dir`` with Maven. Skipped (returns False)
        when the stamp matches the pom's hash, so only a pom change costs a Maven run."""
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
        self.check(staging)
        (staging / ".pom-sha256").write_text(self.pom_hash() + "\n")
        # Swap the whole folder so a version change leaves no stale jars on the classpath.
        shutil.rmtree(self.libs_dir, ignore_errors=True)
        staging.replace(self.libs_dir)
        return True

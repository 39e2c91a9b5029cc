"""AppCDS for the Spark driver JVM: an archive of the classes a worker loads, mapped at start
instead of parsed from the jars. A worker reaches its first job about a third sooner, and with
several workers starting at once on a small machine (a failover, a rebalance, the fault tests)
far sooner: it is CPU they no longer compete for.

``make setup`` builds the archive once (``python -m onceflow_compute.engine.cds``): a small Spark
job runs with ``-XX:ArchiveClassesAtExit`` and the file is renamed into place when complete. It
is keyed on the pyspark version and the JVM, so an upgrade builds a new one; a worker whose
archive is missing or stale starts as before (the JVM ignores an archive it cannot use)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from onceflow.config import runtime_dir


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(found).resolve() if found else None


def archive_path() -> Path | None:
    """Where this pyspark and this JVM's archive lives (None without a JVM)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    key = hashlib.sha256(f"{pyspark.__version__}|{java}|{java.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    return runtime_dir() / "spark" / f"cds-{key}.jsa"


def java_options(extra: str = "") -> str:
    """The driver's JVM options: the archive when it is built, then ``extra``."""
    archive = archive_path()
    # A stale archive is only slower, and its warning must not reach stdout (verify --json).
    use = f"-XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds*=off -Xlog:cds*=warning:stderr" if archive and archive.exists() else ""
    return " ".join(part for part in (use, extra) if part)


def build() -> Path | None:
    """Build the archive unless it exists; its path."""
    archive = archive_path()
    if archive is None or archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    for old in archive.parent.glob("cds-*"):
        old.unlink(missing_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.dump")
    # A job that loads what a worker's first batches load: Arrow in, a grouped aggregate out.
    script = (
        "from onceflow_compute.engine.spark import SparkEngine\n"
        "import pyarrow as pa\n"
        f"engine = SparkEngine('local[1]', 1, '512m', 'onceflow-cds', java_options={f'-XX:ArchiveClassesAtExit={partial}'!r})\n"
        "frame = engine.frame(pa.table({'k': ['a', 'b', 'a'], 'v': [1, 2, 3]}))\n"
        "frame.groupBy('k').sum('v').toArrow() if hasattr(frame, 'toArrow') else frame.groupBy('k').sum('v').collect()\n"
        "engine.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        print(f"spark CDS archive not built (workers start without it):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    partial.replace(archive)
    return archive


if __name__ == "__main__":
    built = build()
    print(f"spark CDS archive: {built}" if built else "spark CDS archive: none")

"""Compute on a real Spark standalone cluster started from the pyspark wheel (`onceflow infra
up --spark standalone`): a master and two workers whose executors run this venv's Python with
nothing of ours on their path. A user's job package, with a combiner of its own, lives only in a
temporary directory on the driver's PYTHONPATH, so the executors can import it only if compute
ships it: the same job without shipping must fail, naming the import error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.config import repo_root
from onceflow.process import free_port

pytestmark = [pytest.mark.spark_cluster, pytest.mark.integration, pytest.mark.xdist_group("spark_cluster")]

JOB_SOURCE = '''
"""A user's job: distinct merchants per user, through a combiner defined here."""
import time

import pyarrow as pa

from onceflow_compute.api import Aggregation, Combine, Count, Sum

SECONDS_PER_VALUE = {slow}  # > 0 keeps the executors busy long enough to be killed mid-task


class DistinctMerchants:
    def init(self):
        return []

    def add(self, acc, value):
        time.sleep(SECONDS_PER_VALUE)
        return sorted(set(acc) | {{value}})

    def merge(self, a, b):
        return sorted(set(a) | set(b))

    def result(self, acc):
        return len(acc)


job = Aggregation(
    name="{name}",
    schema=pa.schema([
        pa.field("user", pa.string(), nullable=False),
        pa.field("merchant", pa.string(), nullable=False),
        pa.field("amount", pa.int64(), nullable=False),
    ]),
    key="user",
    aggregates=(Count("count"), Sum("amount", name="total"), Combine("merchant", name="merchants", combiner=DistinctMerchants())),
)
'''


def _ports_free(base: int, count: int) -> bool:
    import socket

    for port in [base + i for i in range(count)] + [base + 100 + i for i in range(count)]:
        with socket.socket() as probe:
            if port >= 65536 or probe.connect_ex(("127.0.0.1", port)) == 0:
                return False
    return True


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A master and two workers of their own (home, ports); torn down after the module."""
    while not _ports_free(base := free_port(), 3):
        pass
    env = {
        **os.environ,
        "ONCEFLOW_HOME": str(tmp_path_factory.mktemp("spark-home")),
        "ONCEFLOW_SPARK_CLUSTER": "standalone",
        "ONCEFLOW_SPARK_MASTER_PORT": str(base),
        "ONCEFLOW_SPARK_WORKERS": "2",
        "ONCEFLOW_SPARK_WORKER_MEMORY": "768m",
    }
    from onceflow.infra import spark

    os.environ.update({k: env[k] for k in ("ONCEFLOW_HOME", "ONCEFLOW_SPARK_MASTER_PORT", "ONCEFLOW_SPARK_WORKERS")})
    try:
        spark.up(timeout=120)
        env["ONCEFLOW_COMPUTE_SPARK_MASTER"] = spark.cluster()[0].master_url
        yield env
    finally:
        spark.down()


@pytest.fixture
def user_job(tmp_path: Path) -> tuple[str, Path]:
    """A job package that exists only under ``tmp_path`` (the driver's PYTHONPATH): a fast job
    and one whose combiner takes 0.5 ms a value."""
    package = f"userjobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    for module, slow in (("merchants", 0.0), ("slow_merchants", 0.0005)):
        source = textwrap.dedent(JOB_SOURCE).replace("{name}", module).replace("{slow}", str(slow))
        (tmp_path / package / f"{module}.py").write_text(source.replace("{{value}}", "{value}"))
    return f"{package}.merchants", tmp_path


def _input(path: Path, records: int = 3000) -> tuple[Path, dict[str, dict]]:
    rows = [{"user": f"u{i % 7}", "merchant": f"m{i % 11}", "amount": i % 50} for i in range(records)]
    expected: dict[str, dict] = {}
    for row in rows:
        entry = expected.setdefault(row["user"], {"count": 0, "total": 0, "merchants": set()})
        entry["count"] += 1
        entry["total"] += row["amount"]
        entry["merchants"].add(row["merchant"])
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, {k: {"count": v["count"], "total": v["total"], "merchants": len(v["merchants"])} for k, v in expected.items()}


def _batch(env: dict[str, str], job: str, pythonpath: Path, input_path: Path, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow", "batch", job, "--input", str(input_path), "--output", str(output)],
        cwd=repo_root(), env={**env, "PYTHONPATH": str(pythonpath)}, capture_output=True, text=True, timeout=300,
    )


def _table(output: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    return {row["key"]: {k: row["value"][k] for k in ("count", "total", "merchants")} for row in rows}


def test_a_user_job_with_its_own_combiner_runs_on_the_cluster_only_because_it_is_shipped(
    spark_cluster: dict[str, str], user_job: tuple[str, Path], tmp_path: Path,
) -> None:
    job, pythonpath = user_job
    input_path, expected = _input(tmp_path / "input.jsonl")
    done = _batch(spark_cluster, job, pythonpath, input_path, tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _table(tmp_path / "out.jsonl") == expected

    # The control: the same job, not shipped, cannot run on these executors.
    script = textwrap.dedent(f"""
        from onceflow_compute import batch
        engine = batch.spark_engine({spark_cluster["ONCEFLOW_COMPUTE_SPARK_MASTER"]!r}, ship=[])
        try:
            batch.run_batch({job!r}, {str(input_path)!r}, session_or_engine=engine, bisect_budget=2)
        except batch.JobFailed as exc:
            print("JOBFAILED", exc)
        finally:
            engine.close()
    """)
    control = subprocess.run(
        [sys.executable, "-c", script], cwd=repo_root(), env={**spark_cluster, "PYTHONPATH": str(pythonpath)},
        capture_output=True, text=True, timeout=300,
    )
    assert "JOBFAILED" in control.stdout and "No module named" in control.stdout, control.stdout[-3000:] + control.stderr[-3000:]


def _executor_pids(home: str) -> list[int]:
    done = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True)
    pids = []
    for pid in map(int, done.stdout.split()):
        try:
            if home in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") or home in os.readlink(f"/proc/{pid}/cwd"):
                pids.append(pid)
        except OSError:
            continue
    return pids


def test_an_executor_killed_mid_batch_costs_a_retry_not_a_row(
    spark_cluster: dict[str, str], user_job: tuple[str, Path], tmp_path: Path,
) -> None:
    job, pythonpath = user_job
    job = job.replace(".merchants", ".slow_merchants")
    input_path, expected = _input(tmp_path / "input.jsonl", records=20_000)  # ≈10 s of combiner work
    batch = subprocess.Popen(
        [sys.executable, "-m", "onceflow", "batch", job, "--input", str(input_path), "--output", str(tmp_path / "out.jsonl")],
        cwd=repo_root(), env={**spark_cluster, "PYTHONPATH": str(pythonpath)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not (executors := _executor_pids(spark_cluster["ONCEFLOW_HOME"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert executors, "no executor started"
    time.sleep(4.0)  # past reading the input, into the tasks
    assert batch.poll() is None, "the batch ended before the kill: it proves nothing"
    os.kill(executors[0], signal.SIGKILL)
    out, err = batch.communicate(timeout=300)
    assert batch.returncode == 0, out[-3000:] + err[-3000:]
    assert _table(tmp_path / "out.jsonl") == expected

"""Compute on a real Spark standalone cluster started from the pyspark wheel (`onceflow infra
up --spark standalone`): a master and two workers whose executors run this venv's Python with
nothing of ours on their path. A user's job package, and the package of the combiner it uses,
live only in a temporary directory on the driver's PYTHONPATH, so the executors can import them
only if compute ships both: the same job without shipping must fail at once, naming the import
error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from onceflow.config import repo_root
from onceflow.topology import Topic, job_topic
from onceflow.v1 import compute_pb2
from onceflow_tools.process import free_port
from tests.conftest import Pipeline, eventually
from tests.harness import checker
from tests.test_compute import (
    Input,
    check_exact,
    compute_admin,
    pandas_table,
    produce,
    usersum_inputs,
    wait_consumed,
    wait_unhealthy,
    worker,
)

from onceflow_compute.jobs import load_job

pytestmark = [pytest.mark.spark_cluster, pytest.mark.integration, pytest.mark.xdist_group("spark_cluster")]

COMBINER_SOURCE = '''
"""A user's combiner, in a package of its own (not the job's): distinct values."""
import time


class DistinctMerchants:
    def __init__(self, seconds_per_value=0.0):
        self.seconds_per_value = seconds_per_value  # > 0 keeps the executors busy long enough to be killed mid-task

    def init(self):
        return []

    def add(self, acc, value):
        time.sleep(self.seconds_per_value)
        return sorted(set(acc) | {value})

    def merge(self, a, b):
        return sorted(set(a) | set(b))

    def result(self, acc):
        return len(acc)
'''

JOB_SOURCE = '''
"""A user's job: distinct merchants per user, through a combiner from another package."""
import pyarrow as pa

from onceflow_compute.api import Aggregation, Combine, Count, Sum
from COMBINERS.distinct import DistinctMerchants

job = Aggregation(
    name="NAME",
    schema=pa.schema([
        pa.field("user", pa.string(), nullable=False),
        pa.field("merchant", pa.string(), nullable=False),
        pa.field("amount", pa.int64(), nullable=False),
    ]),
    key="user",
    aggregates=(Count("count"), Sum("amount", name="total"), Combine("merchant", name="merchants", combiner=DistinctMerchants(SLOW))),
)
'''


def _free_base(count: int) -> int:
    """A first port with ``count`` RPC and ``count`` web UI ports free above it."""
    while not _ports_free(base := free_port(), count):
        pass
    return base


def _ports_free(base: int, count: int) -> bool:
    import socket

    for port in [base + i for i in range(count)] + [base + 100 + i for i in range(count)]:
        with socket.socket() as probe:
            if port >= 65536 or probe.connect_ex(("127.0.0.1", port)) == 0:
                return False
    return True


@dataclass
class Cluster:
    daemons: list
    env: dict[str, str]  # what a compute worker or `onceflow batch` needs to run on it
    home: str


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two workers of their own (home, ports); torn down after the module."""
    from onceflow_tools.infra import spark
    from onceflow_tools.infra.settings import InfraSettings

    base = _free_base(3)
    home = tmp_path_factory.mktemp("spark-cluster")
    settings = InfraSettings(spark_cluster="standalone", spark_master_port=base, spark_workers=2)  # 1g each: an executor takes 1g
    daemons = spark.cluster(settings, home)
    try:
        spark.up(120, daemons)
        env = {
            "ONCEFLOW_COMPUTE_SPARK_MASTER": daemons[0].master_url,
            "ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON": spark.executor_python(),  # has onceflow-compute, not the job
        }
        yield Cluster(daemons, env, str(home))
    finally:
        spark.down(daemons)


@pytest.fixture
def user_job(tmp_path: Path) -> tuple[str, Path]:
    """A job package and a combiner package that exist only under ``tmp_path`` (the driver's
    PYTHONPATH): a fast job and one whose combiner takes 0.5 ms a value, to be killed under."""
    package, combiners = f"userjobs_{uuid.uuid4().hex[:8]}", f"usercombiners_{uuid.uuid4().hex[:8]}"
    for name in (package, combiners):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / combiners / "distinct.py").write_text(COMBINER_SOURCE)
    for module, slow in (("merchants", 0.0), ("slow_merchants", 0.0005)):
        source = JOB_SOURCE.replace("COMBINERS", combiners).replace("NAME", module).replace("SLOW", str(slow))
        (tmp_path / package / f"{module}.py").write_text(source)
    return f"{package}.merchants", tmp_path


def _answer(rows: list[dict]) -> dict[str, dict]:
    """The job's table by a plain fold: per user, count, total and distinct merchants."""
    folded: dict[str, dict] = {}
    for row in rows:
        entry = folded.setdefault(row["user"], {"count": 0, "total": 0, "merchants": set()})
        entry["count"] += 1
        entry["total"] += row["amount"]
        entry["merchants"].add(row["merchant"])
    return {k: {"count": v["count"], "total": v["total"], "merchants": len(v["merchants"])} for k, v in folded.items()}


def _input(path: Path, records: int = 3000) -> tuple[Path, dict[str, dict]]:
    rows = [{"user": f"u{i % 7}", "merchant": f"m{i % 11}", "amount": i % 50} for i in range(records)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, _answer(rows)


def _batch(cluster: Cluster, job: str, pythonpath: Path, input_path: Path, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", "batch", "--job", job, "--input", str(input_path), "--output", str(output)],
        cwd=repo_root(), env={**os.environ, **cluster.env, "PYTHONPATH": str(pythonpath)}, capture_output=True, text=True,
        timeout=300,
    )


def _table(output: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    return {row["user"]: {k: row[k] for k in ("count", "total", "merchants")} for row in rows}


def test_a_user_job_with_its_own_combiner_runs_on_the_cluster_only_because_it_is_shipped(
    spark_cluster: Cluster, user_job: tuple[str, Path], tmp_path: Path,
) -> None:
    job, pythonpath = user_job
    input_path, expected = _input(tmp_path / "input.jsonl")
    done = _batch(spark_cluster, job, pythonpath, input_path, tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _table(tmp_path / "out.jsonl") == expected

    # The control: the same job, not shipped, cannot run on these executors.
    script = textwrap.dedent(f"""
        from onceflow_compute import batch
        engine = batch.spark_engine({spark_cluster.env["ONCEFLOW_COMPUTE_SPARK_MASTER"]!r}, ship=[])
        try:
            batch.run_batch({job!r}, {str(input_path)!r}, session_or_engine=engine, bisect_budget=2)
        except batch.JobFailed as exc:
            print("JOBFAILED", exc)
        finally:
            engine.close()
    """)
    control = subprocess.run(
        [sys.executable, "-c", script], cwd=repo_root(), env={**os.environ, **spark_cluster.env, "PYTHONPATH": str(pythonpath)},
        capture_output=True, text=True, timeout=300,
    )
    assert "JOBFAILED" in control.stdout and "No module named" in control.stdout, control.stdout[-3000:] + control.stderr[-3000:]


def test_a_streaming_worker_on_the_cluster_stays_exact_through_a_master_and_an_executor_kill(
    spark_cluster: Cluster, user_job: tuple[str, Path], pipeline: Pipeline,
) -> None:
    """The compute service as deployed on a cluster: the user job shipped from the worker, the
    master killed with kill -9 mid-stream (a standalone application keeps its executors), then
    a busy executor killed (its tasks run again on the other worker)."""
    from onceflow_tools.infra import spark

    job, pythonpath = user_job
    job = job.replace(".merchants", ".slow_merchants")  # busy executors: the kill lands mid-task
    rows, inputs = _user_rows(8000)
    compute = worker(pipeline, job, "a", PYTHONPATH=str(pythonpath), **spark_cluster.env).start()
    compute.wait_log("compute: assigned", 180)
    sender = threading.Thread(target=produce, args=(pipeline, inputs, 16, 1.0), daemon=True)
    sender.start()
    compute.wait_log("shipped", 60)
    time.sleep(4.0)
    spark_cluster.daemons[0].kill9()  # the master
    deadline = time.monotonic() + 60
    while not (busy := spark.busy_executors(Path(spark_cluster.home))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert busy, "no executor ran a task after the master was killed"
    os.kill(busy[0], signal.SIGKILL)
    compute.wait_log("Lost executor", 60)  # the driver saw it go mid-task; its tasks run again elsewhere
    sender.join(120)
    assert not sender.is_alive()
    _check_exact(pipeline, job, pythonpath, rows)
    assert compute.alive()
    spark.up(120, spark_cluster.daemons)  # the master back for the next test



@pytest.mark.extended  # about 2.5 min; make test-extended, pytest -m spark_cluster
def test_two_workers_share_the_cluster_and_stay_exact_through_rebalances(
    spark_cluster: Cluster, user_job: tuple[str, Path], pipeline: Pipeline,
) -> None:
    """Two compute workers of one job, each its own Spark application on the one cluster (one
    core each, spark.cores.max: the first would otherwise take every core and the second wait
    for ever). b joins mid-stream, a is killed with kill -9 and comes back, b leaves: three
    rebalances, and the table is exact."""
    from onceflow_tools.infra import spark

    job, pythonpath = user_job
    rows, inputs = _user_rows(6000)
    env = {**spark_cluster.env, "PYTHONPATH": str(pythonpath), "ONCEFLOW_COMPUTE_SPARK_CONF": '{"spark.cores.max": "1"}'}
    master = spark_cluster.daemons[0]
    sender = threading.Thread(target=produce, args=(pipeline, inputs, 20, 1.0), daemon=True)
    workers = {"a": worker(pipeline, job, "a", **env).start()}
    workers["a"].wait_log("compute: assigned", 180)
    sender.start()
    workers["b"] = worker(pipeline, job, "b", **env).start()  # joins: a hands over half its partitions
    workers["b"].wait_log("compute: assigned", 180)
    eventually(lambda: len((spark.master_state(master) or {}).get("activeapps", [])) == 2, 120,
               "both workers running as applications on the cluster")
    time.sleep(3.0)
    workers["a"].kill9()  # b takes every partition
    workers["a"] = worker(pipeline, job, "a", **env).start()  # and hands half back
    workers["a"].wait_log("compute: assigned", 180)
    sender.join(120)
    assert not sender.is_alive()
    assert workers["b"].terminate() == 0, workers["b"].log_tail()  # a takes them all, restoring b's state
    _check_exact(pipeline, job, pythonpath, rows)
    assert workers["a"].alive()

def _user_rows(records: int) -> tuple[list[dict], list[Input]]:
    rows = [{"user": f"u{i % 40}", "merchant": f"m{i % 13}", "amount": i % 97} for i in range(records)]
    return rows, [Input(f"sc-{i}", row["user"].encode(), json.dumps(row).encode(), True) for i, row in enumerate(rows)]


def _check_exact(pipeline: Pipeline, job: str, pythonpath: Path, rows: list[dict]) -> None:
    """Once both hops read to the end: the result table equals a plain fold, no problems."""
    sys.path.insert(0, str(pythonpath))  # to read the job's name, as the worker does
    try:
        name = load_job(job).name
    finally:
        sys.path.remove(str(pythonpath))
    wait_consumed(pipeline, name)
    fold = checker.fold_results(checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_RESULTS)), name)
    assert not fold.problems, fold.problems[:10]
    table = {key: json.loads(row) for key, row in fold.table.items()}
    assert {k: {"count": v["count"], "total": v["total"], "merchants": v["merchants"]} for k, v in table.items()} == _answer(rows)
    assert not checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_DLQ), timeout_s=5)


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator:
    """A Spark Connect server of its own (port, home), its driver on local[1]."""
    from onceflow_tools.infra import spark

    server = spark.ConnectServer(free_port(), "local[1]", "1g", tmp_path / "spark-connect")
    try:
        yield server.up(120)
    finally:
        server.stop()


def test_a_streaming_worker_through_spark_connect_stays_exact_through_a_server_restart(
    connect_server, user_job: tuple[str, Path], pipeline: Pipeline,  # noqa: ANN001 - a ConnectServer
) -> None:
    """Compute as a thin Spark Connect client (sc://): the user job shipped as an artifact, the
    server killed with kill -9 under load (its driver, executors and the session go with it).
    The worker turns NOT_SERVING with the reason, commits nothing meanwhile, opens a new
    session (and ships again) once the server is back, and the table is exact."""
    job, pythonpath = user_job
    job = job.replace(".merchants", ".slow_merchants")
    rows, inputs = _user_rows(6000)
    port = free_port()
    compute = worker(
        pipeline, job, "a", PYTHONPATH=str(pythonpath), ONCEFLOW_COMPUTE_PORT=str(port),
        ONCEFLOW_COMPUTE_SPARK_MASTER=connect_server.url, ONCEFLOW_COMPUTE_BATCH_TIMEOUT_S="60",
    ).start()
    address = f"127.0.0.1:{port}"
    compute.wait_healthy(address, timeout_s=180)
    assert "shipped" in compute.log_path.read_text()
    sender = threading.Thread(target=produce, args=(pipeline, inputs, 16, 1.0), daemon=True)
    sender.start()
    admin = compute_admin(address)
    stats = lambda: admin.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)  # noqa: E731
    eventually(lambda: stats().records_in > 0, 120, "a first batch through Spark Connect")
    connect_server.kill9()
    stats = wait_unhealthy(address, 90, "the worker to report Spark Connect unavailable")
    assert "Spark Connect at" in stats.last_error and "unavailable" in stats.last_error, stats.last_error
    assert stats.dead_letters == 0  # a lost server blames no record
    connect_server.up(120)
    sender.join(120)
    assert not sender.is_alive()
    _check_exact(pipeline, job, pythonpath, rows)
    compute.wait_healthy(address, timeout_s=60)
    assert compute.log_path.read_text().count("shipped") >= 2  # the new session got the job again
    assert compute.terminate() == 0, compute.log_tail()



def test_a_worker_whose_batches_no_executor_runs_turns_unhealthy_and_recovers_when_one_comes(
    pipeline: Pipeline, tmp_path: Path,
) -> None:
    """First no master at all: the worker starts anyway (no crash loop) and is NOT_SERVING,
    naming the master that does not answer. Then a master with no worker: Spark waits forever
    for resources ("Initial job has not accepted any resources"); the batch is cancelled at its
    timeout and fails as a whole: NOT_SERVING with the reason, nothing committed, backing off.
    Once a worker registers, the same records are processed exactly once."""
    from onceflow_tools.infra import spark
    from onceflow_tools.infra.settings import InfraSettings

    settings = InfraSettings(spark_cluster="standalone", spark_master_port=_free_base(2), spark_workers=1)
    master, lone_worker = spark.cluster(settings, tmp_path / "spark")
    try:
        port = free_port()
        inputs = usersum_inputs(1500, seed=3)
        compute = worker(
            pipeline, "usersum", "a", ONCEFLOW_COMPUTE_PORT=str(port), ONCEFLOW_COMPUTE_SPARK_MASTER=master.master_url,
            ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON=spark.executor_python(), ONCEFLOW_COMPUTE_BATCH_TIMEOUT_S="8",
        ).start()
        address = f"127.0.0.1:{port}"
        compute.wait_log("compute: assigned", 180)
        produce(pipeline, inputs)
        stats = wait_unhealthy(address, 120, "the worker to report the master unreachable")
        assert "no Spark master answers" in stats.last_error, stats.last_error
        assert stats.records_in == 0 and stats.dead_letters == 0 and compute.alive()

        spark.up(120, [master])
        stats = eventually(
            lambda: (s := compute_admin(address).Stats(compute_pb2.ComputeStatsRequest(), timeout=10))
            and "did not finish a micro-batch" in s.last_error and s,
            180, "the worker to report its batches stalled",
        )
        assert "did not finish a micro-batch within 8 s" in stats.last_error, stats.last_error
        assert stats.records_in == 0 and stats.dead_letters == 0  # a stalled engine blames no record
        assert not checker.read_committed(pipeline.common, pipeline.topic(job_topic(Topic.COMPUTE_PARTIALS, "usersum")), timeout_s=5)

        spark.up(120, [master, lone_worker])
        wait_consumed(pipeline, "usersum")
        compute.wait_healthy(address, timeout_s=60)
        check_exact(pipeline, "usersum", inputs, pandas_table("usersum", inputs))
        assert compute.terminate() == 0, compute.log_tail()
    finally:
        spark.down([master, lone_worker])

"""Blue/green versions of a job (issue 38 part 3, docs/decisions/0024), on the real broker and
Redis, compute on the pandas engine and the real sink.

v1 serves under load; v2 (an aggregate added, and its own topics rescaled from 4 to 8
partitions) is deployed beside it from the earliest record and rebuilt through two kill -9s. A
promotion is refused while v2 lags and goes through once it has caught up; a reader that keeps
scanning the job's plain name meanwhile never sees a page of one version and a page of the
other in one scan. After the promotion the plain name reads v2's table, equal to v2's answer
over every input record; v1 retires and its topics and table go. The sabotage: a promotion
forced while a version lags serves a partial table, and the same comparison catches it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from onceflow.kafka.inspect import committed_offsets, partitions_of
from onceflow.kafka.positions import stable_ends
from onceflow.kafka.registry import read_registry
from onceflow.redis_client import connect
from onceflow.topology import COMPUTE_MAP, Topic, job_topic
from onceflow.v1 import admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc, sink_pb2, sink_pb2_grpc
from onceflow.versions import VersionState
from onceflow_client.tail import Change, ResultsTail
from onceflow_sink.tables import ResultTables
from onceflow_tools.jobs import lifecycle, workers
from onceflow_tools.jobs.lifecycle import JobCommandError
from tests.conftest import COMPUTE_NOT_UNDER_TEST, SHORT_LIVED_COMPUTE, Pipeline, eventually, free_port
from tests.harness.process import ServiceProcess
from tests.test_lifecycle import JOB, V1, V2, _status, expected, produce, readings, sink

pytestmark = [pytest.mark.lifecycle, pytest.mark.compute, pytest.mark.integration]

Records = list[tuple[str, str, int]]


def expected_v2(records: Records) -> dict[str, dict[str, object]]:
    """v2's answer: v1's columns and the average."""
    return {k: {**row, "avg": row["total"] / row["n"]} for k, row in expected(records).items()}


def same_rows(got: dict[str, dict[str, object]], want: dict[str, dict[str, object]]) -> bool:
    if got.keys() != want.keys():
        return False
    for key, row in want.items():
        other = got[key]
        if other.keys() != row.keys():
            return False
        for column, value in row.items():
            if isinstance(value, float):
                if abs(float(other[column]) - value) > 1e-9 * max(1.0, abs(value)):  # type: ignore[arg-type]
                    return False
            elif other[column] != value:
                return False
    return True


def worker(pipe: Pipeline, deployed: lifecycle.Deployed, tag: str) -> ServiceProcess:
    """The version's worker as `onceflow job deploy --no-start` says to run it."""
    env = {**deployed.env, "ONCEFLOW_COMPUTE_INSTANCE": f"{deployed.name}-{tag}", "ONCEFLOW_COMPUTE_PORT": str(free_port())}
    return pipe.process(f"compute-{deployed.name}-{tag}", "onceflow_compute", **env, **SHORT_LIVED_COMPUTE, **COMPUTE_NOT_UNDER_TEST)


def scan_all(query: sink_pb2_grpc.QueryStub, job: str, limit: int = 10) -> tuple[set[str], dict[str, dict[str, object]]]:
    """One whole scan of ``job`` page by page: the tables that answered, and the rows."""
    tables: set[str] = set()
    rows: dict[str, dict[str, object]] = {}
    token = b""
    while True:
        reply = query.Scan(sink_pb2.ScanRowsRequest(job=job, limit=limit, page_token=token), timeout=10)
        tables.add(reply.table)
        rows.update((row.key, json.loads(row.value)) for row in reply.rows)
        token = reply.next_page_token
        if not token:
            return tables, rows


@dataclass
class Load:
    """Records sent to dedup.records in small batches until stopped."""

    pipe: Pipeline
    sent: Records = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        seed = 1_000
        while not self.stop.wait(0.3):
            batch = readings(50, seed)
            produce(self.pipe, batch)
            self.sent += batch
            seed += 1


@dataclass
class Reader:
    """Scans the plain name in a loop; each scan must come from one table, whose rows are that
    version's shape."""

    query: sink_pb2_grpc.QueryStub
    scans: int = 0
    seen: set[str] = field(default_factory=set)
    mixed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            tables, rows = scan_all(self.query, JOB)
            shapes = {"avg" in row for row in rows.values()}
            if len(tables) != 1 or len(shapes) > 1:
                self.mixed.append(f"tables {sorted(tables)}, row shapes {sorted(shapes)}")
            self.seen |= tables
            self.scans += 1


def background(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_blue_green_rebuild_promote_and_retire_under_load(pipeline: Pipeline) -> None:
    common = pipeline.common
    sink_port = free_port()
    sinker = sink(pipeline, sink_port).start()
    query = sink_pb2_grpc.QueryStub(grpc.insecure_channel(f"127.0.0.1:{sink_port}"))
    history = readings(3_000, seed=11)
    produce(pipeline, history)

    # v1: deployed, built, promoted: the plain name reads it.
    v1 = lifecycle.deploy(common, V1, start=False)
    assert v1.name == f"{JOB}@1"
    live = worker(pipeline, v1, "a").start()
    lifecycle.promote(common, JOB, 1, wait_s=90)
    eventually(lambda: same_rows(scan_all(query, JOB)[1], expected(history)), 60, "v1's table behind the plain name")

    # A tail of the plain name, started on v1: it must move to v2 at the promotion.
    early_tail = ResultsTail(common.kafka_bootstrap, JOB, common.topic_prefix)
    assert early_tail.version == v1.name
    folded: dict[str, bytes] = {}

    def fold(changes: list[Change]) -> None:
        for change in changes:
            if change.op == "+":
                folded[change.key] = change.value
            else:
                folded.pop(change.key, None)

    fold(list(early_tail.changes(idle_timeout_s=1.0)))

    load = Load(pipeline)
    loading = background(load.run)

    # v2: an aggregate added (state v1 cannot take) and 8 partitions instead of 4.
    v2 = lifecycle.deploy(common, V2, start_from="earliest", partitions=8, start=False)
    assert v2.name == f"{JOB}@2" and any("builds its own" in note for note in v2.notes), v2.notes
    with pytest.raises(JobCommandError, match="still a shadow"):
        lifecycle.deploy(common, V2, start=False)
    with pytest.raises(JobCommandError, match="still lags"):
        lifecycle.promote(common, JOB, 2)  # not even started
    rebuild = worker(pipeline, v2, "a").start()
    for tag in ("b", "c"):  # kill -9 mid-rebuild, twice: a replacement resumes from what was committed
        eventually(lambda: lifecycle.status(common, JOB, sample_s=0)[1].status.map_behind.records < len(history), 60, "v2 to commit")
        rebuild.kill9()
        rebuild = worker(pipeline, v2, tag).start()
    assert len(partitions_of(common, pipeline.topic(job_topic(Topic.COMPUTE_PARTIALS, v2.name)))) == 8
    assert len(partitions_of(common, pipeline.topic(job_topic(Topic.COMPUTE_CHANGELOG, v2.name)))) == 8

    reader = Reader(query)
    reading = background(reader.run)
    lifecycle.promote(common, JOB, 2, wait_s=120)
    eventually(lambda: reader.seen == {v1.name, v2.name}, 30, "the reader to scan both versions")
    reader.stop.set()
    reading.join(30)
    assert not reader.mixed, reader.mixed[:3]
    assert reader.scans >= 3

    load.stop.set()
    loading.join(30)
    everything = history + load.sent
    eventually(lambda: not lifecycle.lagging(common, read_registry(common)[JOB], read_registry(common)[JOB].versions[2]), 60, "v2 to drain")
    tables, rows = scan_all(query, JOB)
    assert tables == {v2.name}
    assert same_rows(rows, expected_v2(everything)), "v2's table is not v2's answer over every record"
    with ResultsTail(common.kafka_bootstrap, JOB, common.topic_prefix) as tail:  # the SDK follows the alias too
        assert tail.version == v2.name
        list(tail.changes(idle_timeout_s=1.0))
        assert same_rows({k: json.loads(v) for k, v in tail.table.items()}, expected_v2(everything))
    # The tail started on v1 followed the promotion: its table, and the changes it handed out
    # folded by a consumer that knows only + and -, are v2's whole table.
    fold(list(early_tail.changes(idle_timeout_s=1.0)))
    assert early_tail.version == v2.name
    assert same_rows({k: json.loads(v) for k, v in early_tail.table.items()}, expected_v2(everything))
    assert same_rows({k: json.loads(v) for k, v in folded.items()}, expected_v2(everything))
    early_tail.close()

    # Retire v1: refused while live elsewhere, then its worker stopped, topics and table gone.
    with pytest.raises(JobCommandError, match="is live"):
        lifecycle.retire(common, JOB, 2)
    assert live.terminate() == 0, live.log_tail()
    deleted = lifecycle.retire(common, JOB, 1)
    assert f"topic {pipeline.topic(job_topic(Topic.COMPUTE_PARTIALS, v1.name))}" in deleted, deleted
    tables_in_redis = ResultTables(connect(common.redis_url), common.topic_prefix)
    eventually(lambda: not tables_in_redis.table(v1.name), 30, "the sink to delete v1's table")
    assert read_registry(common)[JOB].versions[1].state is VersionState.RETIRED

    # The sabotage: v3 (v1's code again: a reprocess of nothing) promoted at once with --force.
    v3 = lifecycle.deploy(common, V1, start=False)
    rebuild3 = worker(pipeline, v3, "a").start()
    lifecycle.promote(common, JOB, 3, force=True)
    _tables, partial = scan_all(query, JOB)
    assert not same_rows(partial, expected(everything)), "a forced promotion served a complete table: the check could not fail"
    eventually(lambda: same_rows(scan_all(query, JOB)[1], expected(everything)), 90, "v3 to catch up")
    for process in (rebuild, rebuild3):
        assert process.terminate() == 0, process.log_tail()
    assert sinker.terminate() == 0, sinker.log_tail()


def test_job_commands_refuse_what_cannot_be_done(pipeline: Pipeline) -> None:
    common = pipeline.common
    with pytest.raises(JobCommandError, match="'tests.harness.jobs.no_such_job' does not load: .*No module named"):
        lifecycle.deploy(common, "tests.harness.jobs.no_such_job", start=False)
    with pytest.raises(JobCommandError, match="'tests.harness.jobs.broken' does not load: RuntimeError: the config file"):
        lifecycle.deploy(common, "tests.harness.jobs.broken", start=False)
    # A worker given that module stays up, NOT_SERVING, saying why: no crash for a supervisor to loop on.
    port = free_port()
    broken = pipeline.process(
        "compute-broken", "onceflow_compute", ONCEFLOW_COMPUTE_JOB="tests.harness.jobs.broken",
        ONCEFLOW_COMPUTE_PORT=str(port), ONCEFLOW_COMPUTE_METRICS_PORT="0",
    ).start()
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    status = eventually(lambda: _status(admin), 60, "the worker to answer Status")
    assert status.state == "REFUSED" and "'tests.harness.jobs.broken' does not load: RuntimeError" in status.last_error, status
    assert broken.terminate() == 0, broken.log_tail()
    with pytest.raises(JobCommandError, match="no job 'sensors' in the registry"):
        lifecycle.promote(common, JOB, 1)
    lifecycle.deploy(common, V1, version=5, start=False)
    with pytest.raises(JobCommandError, match="no version 4"):
        lifecycle.promote(common, JOB, 4)
    with pytest.raises(JobCommandError, match="1 to 999999"):
        lifecycle.version_argument("0")
    with pytest.raises(JobCommandError, match="no longer holds records that old"):
        produce(pipeline, readings(10, seed=3))
        _truncate_all(pipeline)
        produce(pipeline, readings(10, seed=4))
        lifecycle.deploy(common, V2, start_from="2001-01-01T00:00:00", start=False)
    retired = lifecycle.retire(common, JOB, 5)
    assert any("table" in item for item in retired)
    with pytest.raises(JobCommandError, match="already retired"):
        lifecycle.retire(common, JOB, 5)
    with pytest.raises(JobCommandError, match="retired"):
        lifecycle.promote(common, JOB, 5)
    assert workers.running(JOB, 5) == []
    # --from a time within the history: the version's map group starts at the first record then.
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(pipeline, readings(10, seed=5))
    v6 = lifecycle.deploy(common, V2, start_from=str(middle), start=False)
    topic = pipeline.topic(Topic.DEDUP_RECORDS)
    starts = committed_offsets(common, COMPUTE_MAP.group_id(common.topic_prefix, v6.name), topic)
    ends = stable_ends(common, topic)
    assert sum(ends[p] - starts[p] for p in ends) == 10, (starts, ends)


def _truncate_all(pipe: Pipeline) -> None:
    """Delete every record of dedup.records so far, as retention would."""
    from confluent_kafka import TopicPartition

    from onceflow.kafka import clients

    topic = pipe.topic(Topic.DEDUP_RECORDS)
    ends = stable_ends(pipe.common, topic)
    admin = clients.admin(pipe.common)
    futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in ends.items() if o > 0])
    for future in futures.values():
        future.result(timeout=30)
    time.sleep(0.5)


def test_job_admin_over_grpc_answers_and_refuses_with_precise_statuses(pipeline: Pipeline) -> None:
    """JobAdmin on the sink's port: the same calls as `onceflow job`, read calls open, changes
    behind the admin token, each refusal its own status."""
    common = pipeline.common
    port = free_port()
    sinker = pipeline.process(
        "sink", "onceflow_sink", ONCEFLOW_SINK_PORT=str(port), ONCEFLOW_SINK_METRICS_PORT="0", ONCEFLOW_SINK_INSTANCE="a",
        ONCEFLOW_SINK_ACKING="false", ONCEFLOW_ADMIN_TOKEN="jobs-token",
    ).start()
    address = f"127.0.0.1:{port}"
    sinker.wait_healthy(address)
    produce(pipeline, readings(20, seed=9))
    lifecycle.deploy(common, V1, start=False)  # registered; no worker runs it
    stub = jobs_pb2_grpc.JobAdminStub(grpc.insecure_channel(address))
    admin = [("authorization", "Bearer jobs-token")]

    listed = stub.ListVersions(jobs_pb2.ListVersionsRequest(), timeout=10)
    assert [(j.job, j.live, [(v.name, v.state) for v in j.versions]) for j in listed.jobs] == [(JOB, 0, [(f"{JOB}@1", "shadow")])]
    progress = stub.VersionStatus(jobs_pb2.VersionStatusRequest(job=JOB), timeout=10).versions
    assert [(p.version.name, p.map_behind, p.workers) for p in progress] == [(f"{JOB}@1", 20, 0)]

    def refused(call: Callable[[], object]) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        return caught.value  # type: ignore[return-value]

    promote = jobs_pb2.PromoteRequest(job=JOB, version=1)
    assert refused(lambda: stub.Promote(promote, timeout=10)).code() == grpc.StatusCode.UNAUTHENTICATED
    lags = refused(lambda: stub.Promote(promote, timeout=30, metadata=admin))
    assert lags.code() == grpc.StatusCode.FAILED_PRECONDITION and "still lags: its map hop is 20 records" in lags.details()
    missing = refused(lambda: stub.Promote(jobs_pb2.PromoteRequest(job=JOB, version=4), timeout=10, metadata=admin))
    assert missing.code() == grpc.StatusCode.NOT_FOUND and "no version 4" in missing.details()
    bad = refused(lambda: stub.Retire(jobs_pb2.RetireRequest(job="no/such", version=1), timeout=10, metadata=admin))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    forced = stub.Promote(jobs_pb2.PromoteRequest(job=JOB, version=1, force=True), timeout=60, metadata=admin)
    assert forced.live == f"{JOB}@1"
    live = refused(lambda: stub.Retire(jobs_pb2.RetireRequest(job=JOB, version=1), timeout=10, metadata=admin))
    assert live.code() == grpc.StatusCode.FAILED_PRECONDITION and "is live" in live.details()
    assert sinker.terminate() == 0, sinker.log_tail()


def test_a_sql_job_deploys_as_a_version_from_its_file(pipeline: Pipeline, tmp_path: Path) -> None:
    """`onceflow job deploy --sql FILE` registers the SQL job's version like a module's: its
    workers load the file by its absolute path (one started elsewhere, or a reprocess later,
    finds the same file)."""
    from typer.testing import CliRunner

    from onceflow_tools.cli import job as job_cli

    path = tmp_path / "sensors.sql"
    path.write_text("-- job: sensors_sql\nCREATE TABLE readings (sensor STRING, celsius DOUBLE);\n"
                    "SELECT sensor, MAX(celsius) AS hottest FROM readings GROUP BY sensor\n")
    runner = CliRunner()
    refused = runner.invoke(job_cli.app, ["deploy", "sensors", "--sql", str(path), "--no-start"], env=pipeline.env)
    assert refused.exit_code == 2 and "one of the two" in refused.output, refused.output
    deployed = runner.invoke(job_cli.app, ["deploy", "--sql", str(path), "--no-start"], env=pipeline.env)
    assert deployed.exit_code == 0, deployed.output
    assert f"ONCEFLOW_COMPUTE_JOB=sql:{path.resolve()}" in deployed.output.replace("\n", ""), deployed.output
    record = read_registry(pipeline.common)["sensors_sql"]
    assert record.versions[1].module == f"sql:{path.resolve()}"

"""The sink and job versions, on the real Redis and broker: the alias a job's plain name reads
through never moves back; Get resolves it and Scan pins it for a whole scan; the follower takes
jobs.registry (written by RegistryWriter, as `onceflow job` does) to Redis, also once the topic
appears late and after Redis lost the alias; and a retired version's table is deleted, its
changes skipped but their anchors acked."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest
import redis

from onceflow.admin import fleet
from onceflow.config import CommonSettings
from onceflow.kafka.registry import RegistryWriter
from onceflow.kafka.topics import load_specs
from onceflow.redis_client import connect
from onceflow.topology import Topic
from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow.v1.acker_pb2 import AckerBatch, Anchor
from onceflow.v1.results_pb2 import ResultChange
from onceflow.versions import JobRecord, Version, VersionState
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from tests.conftest import Pipeline, eventually
from tests.harness import checker
from tests.test_sink import produce, sink, wait_applied

from onceflow_sink.aliases import RegistryFollower
from onceflow_sink.query import QueryServicer
from onceflow_sink.tables import ResultTables

pytestmark = [pytest.mark.sink, pytest.mark.integration]

JOB = "orders"


def version(number: int, state: VersionState) -> Version:
    return Version(number, "onceflow_compute.jobs.usersum", state, "earliest", 4, 1_700_000_000_000)


@dataclass
class Space:
    """A prefix of its own: its Redis keys (and topics, where a test creates them)."""

    common: CommonSettings
    client: redis.Redis
    tables: ResultTables

    def fill(self, table: str, rows: dict[str, str]) -> None:
        self.client.hset(self.tables.table_key(table), mapping=rows)  # type: ignore[arg-type]


@pytest.fixture
def space(infra: None) -> Iterator[Space]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    client = connect(common.redis_url)
    yield Space(common, client, ResultTables(client, prefix))
    keys = list(client.scan_iter(match=f"onceflow:{{{prefix}sink}}:*"))
    if keys:
        client.delete(*keys)
    delete_topics(common.kafka_bootstrap, prefix=prefix)


@pytest.fixture
def query(space: Space) -> Iterator[sink_pb2_grpc.QueryStub]:
    """The Query servicer on a gRPC server of its own, over the space's tables."""
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    sink_pb2_grpc.add_QueryServicer_to_server(QueryServicer(space.tables), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield sink_pb2_grpc.QueryStub(channel)
    finally:
        server.stop(0)


def test_the_alias_script_never_moves_an_alias_back(space: Space) -> None:
    tables = space.tables
    assert tables.set_alias(JOB, "orders@2", 10)
    assert not tables.set_alias(JOB, "orders@1", 9)  # a sink resumed with an older view of the registry
    assert tables.alias(JOB) == ("orders@2", 10)
    assert tables.set_alias(JOB, "orders@2", 10)  # the same record again: every round writes it
    assert tables.set_alias(JOB, "orders@3", 11)
    assert tables.resolve(JOB) == "orders@3"
    assert tables.resolve("orders@1") == "orders@1"  # a version reads itself
    assert tables.resolve("clicks") == "clicks"  # never versioned: its own table
    assert tables.set_alias(JOB, "", 12)  # the job left the registry
    assert tables.resolve(JOB) == JOB
    assert not tables.set_alias(JOB, "orders@3", 11)
    assert tables.alias(JOB) == ("", 12)


def test_get_reads_through_the_alias_and_names_the_table_that_answered(space: Space, query: sink_pb2_grpc.QueryStub) -> None:
    for table in (JOB, "orders@1", "orders@2"):
        space.fill(table, {"k": f"from {table}"})

    def get(job: str) -> tuple[str, str]:
        reply = query.Get(sink_pb2.GetRowRequest(job=job, key="k"), timeout=5)
        assert reply.found
        return reply.table, reply.value.decode()

    assert get(JOB) == (JOB, "from orders")  # no alias: the unversioned table
    space.tables.set_alias(JOB, "orders@1", 0)
    assert get(JOB) == ("orders@1", "from orders@1")
    space.tables.set_alias(JOB, "orders@2", 1)
    assert get(JOB) == ("orders@2", "from orders@2")
    assert get("orders@1") == ("orders@1", "from orders@1")
    absent = query.Get(sink_pb2.GetRowRequest(job=JOB, key="absent"), timeout=5)
    assert not absent.found and absent.table == "orders@2"
    for job, reason in [("orders@0", "version '0'"), ("a b", "job name 'a b'"), ("orders@x", "version 'x'")]:
        for call in (lambda: query.Get(sink_pb2.GetRowRequest(job=job, key="k"), timeout=5),
                     lambda: query.Scan(sink_pb2.ScanRowsRequest(job=job), timeout=5)):
            with pytest.raises(grpc.RpcError) as bad:
                call()
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason in (bad.value.details() or "")


def test_a_scan_reads_the_version_it_started_on_across_a_promotion(space: Space, query: sink_pb2_grpc.QueryStub) -> None:
    keys = [f"k{i:03d}" for i in range(200)]
    space.fill("orders@1", {k: f"v1 {k}" for k in keys})
    space.fill("orders@2", {k: f"v2 {k}" for k in [*keys, "only-in-v2"]})
    space.tables.set_alias(JOB, "orders@1", 0)

    first = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, limit=7), timeout=5)
    assert first.table == "orders@1" and first.next_page_token and first.rows
    space.tables.set_alias(JOB, "orders@2", 1)  # promoted while the scan is under way
    rows = {row.key: row.value for row in first.rows}
    token, pages = first.next_page_token, 1
    while token:
        page = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, limit=7, page_token=token), timeout=5)
        assert page.table == "orders@1"
        rows.update((row.key, row.value) for row in page.rows)
        token, pages = page.next_page_token, pages + 1
    assert pages > 10
    assert rows == {k: f"v1 {k}".encode() for k in keys}

    again = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, limit=1000), timeout=5)
    assert again.table == "orders@2" and not again.next_page_token
    assert {row.key: row.value for row in again.rows} == {k: f"v2 {k}".encode() for k in [*keys, "only-in-v2"]}

    # A token goes on only for the job it was made for.
    for other in ("clicks", "orders@2"):
        with pytest.raises(grpc.RpcError) as bad:
            query.Scan(sink_pb2.ScanRowsRequest(job=other, limit=7, page_token=first.next_page_token), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"not of job '{other}'" in (bad.value.details() or "")
    pinned = query.Scan(sink_pb2.ScanRowsRequest(job="orders@1", limit=7, page_token=first.next_page_token), timeout=5)
    assert pinned.table == "orders@1"


def test_the_follower_takes_the_registry_to_redis_and_heals_what_redis_lost(
    space: Space, caplog: pytest.LogCaptureFixture,
) -> None:
    common, tables, client = space.common, space.tables, space.client
    caplog.set_level(logging.INFO, logger="onceflow_sink.aliases")
    follower = RegistryFollower(common, tables, refresh_s=0.5)
    follower.start()
    try:
        # No registry topic yet (a stack from before versions): said once, nothing to wait for.
        assert follower.wait_ready(10)
        registry_spec = [s for s in load_specs() if s.name == Topic.JOBS_REGISTRY.value]
        ensure_topics(common.kafka_bootstrap, common.topic_prefix, registry_spec)
        space.fill("orders@1", {"k": "v1"})
        client.hset(tables.table_meta_key("orders@1"), "fingerprint", "f1")
        with RegistryWriter(common) as registry:
            registry.write(JobRecord(JOB, {1: version(1, VersionState.LIVE)}, live=1))
        eventually(lambda: tables.resolve(JOB) == "orders@1", 20, "the alias of v1", interval_s=0.1)

        with RegistryWriter(common) as registry:
            record = registry.records[JOB].with_version(version(2, VersionState.SHADOW)).promoted(2).retired(1)
            registry.write(record)

        def switched() -> bool:
            gone = not client.exists(tables.table_key("orders@1"), tables.table_meta_key("orders@1"))
            return tables.resolve(JOB) == "orders@2" and gone

        eventually(switched, 20, "the alias of v2 and v1's table deleted", interval_s=0.1)
        assert follower.retired() == frozenset({"orders@1"})
        offset = follower.offset
        assert tables.alias(JOB) == ("orders@2", offset)

        client.delete(tables.alias_key(JOB))  # Redis lost it (a flush, a failover, a new Redis)
        space.fill("orders@1", {"k": "written by a sink that had not seen the retirement yet"})
        eventually(lambda: tables.alias(JOB) == ("orders@2", offset) and not tables.table("orders@1"), 5,
                   "the next round to write it all again", interval_s=0.1)
    finally:
        follower.stop()
    assert caplog.text.count("no topic") == 1, caplog.text
    assert "exists now; following it" in caplog.text


def test_a_retired_versions_table_is_deleted_and_its_changes_skipped_but_acked(pipeline: Pipeline) -> None:
    tables = ResultTables(connect(pipeline.common.redis_url), pipeline.common.topic_prefix)
    client = connect(pipeline.common.redis_url)
    client.hset(tables.table_key("orders@1"), "left", "by v1")
    client.hset(tables.table_meta_key("orders@1"), "fingerprint", "f1")
    with RegistryWriter(pipeline.common) as registry:
        registry.write(JobRecord(JOB, {1: version(1, VersionState.RETIRED), 2: version(2, VersionState.LIVE)}, live=2))
    changes = [
        ResultChange(job=name, key=f"k{i}", op=ResultChange.UPSERT, value=f"{name} {i}".encode(),
                     anchor=Anchor(group_id=100 * n + i + 1, edge_id=i + 7, acker_partitions=[0]))
        for n, name in enumerate(("orders@1", "orders@2"), start=1)
        for i in range(40)
    ]
    produce(pipeline, changes)
    proc, address = sink(pipeline, "a", ONCEFLOW_SINK_ACKING="true")
    proc.start()
    proc.wait_healthy(address)
    wait_applied(pipeline, timeout_s=30)

    assert tables.table("orders@2") == {f"k{i}".encode(): f"orders@2 {i}".encode() for i in range(40)}
    eventually(lambda: not client.exists(tables.table_key("orders@1"), tables.table_meta_key("orders@1")), 10,
               "v1's table deleted")
    acked = {(m.root_id, m.xor_value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.ACKER_ACKS))
             for m in AckerBatch.FromString(r.value).messages}
    assert {(c.anchor.group_id, c.anchor.edge_id) for c in changes} <= acked  # skipped ones too
    gauges = fleet.query(fleet.Endpoint("sink", address), None, 5.0).status.gauges
    assert gauges["retired_changes"] == 40 and gauges["registry_offset"] >= 0
    with grpc.insecure_channel(address) as channel:
        row = sink_pb2_grpc.QueryStub(channel).Get(sink_pb2.GetRowRequest(job=JOB, key="k3"), timeout=5)
    assert (row.found, row.value, row.table) == (True, b"orders@2 3", "orders@2")
    assert proc.terminate() == 0, proc.log_tail()

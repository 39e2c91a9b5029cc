"""onceflow-client against a running pipeline (`pytest -m client`): the sync and asyncio
ingest clients (dicts, JSON bytes and protobufs, wait=processed, many calls in flight, a
refused record), a result table of more than one Scan's worth of rows read whole, and a
ResultsTail that stops, resumes from its snapshot and ends equal to the sink's table, through
a kill -9 of the sink. Judged once the pipeline has drained."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from onceflow.config import CommonSettings
from onceflow_client import (
    AsyncIngestClient,
    AsyncQueryClient,
    AsyncResultsTail,
    IngestClient,
    QueryClient,
    RecordsRejected,
    ResultsTail,
    TailSnapshot,
)
from onceflow_client.query import MAX_PAGE
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually

pytestmark = [pytest.mark.client, pytest.mark.integration, pytest.mark.xdist_group("client")]
JOB = usersum.JOB
BIG = MAX_PAGE + 500  # rows under one prefix: more than one Scan page holds


@dataclass
class Running:
    supervisor: Supervisor
    common: CommonSettings
    sent: list[KeyedRecord] = field(default_factory=list)  # every record the module sent, once each

    def table(self, prefix: str = "") -> dict[str, dict]:
        with QueryClient(self.supervisor.address("sink")) as query:
            return {key: json.loads(value) for key, value in query.scan(JOB, prefix)}

    def drained_and_exact(self) -> dict[str, dict]:
        """The table, once every record sent is applied and nothing is in flight."""
        answer = usersum.fold_answer(self.sent)

        def matches() -> bool:
            try:
                return self.table() == answer
            except grpc.RpcError:  # a sink restarting after its kill -9
                return False

        eventually(matches, 240, "the table to equal the fold of every record sent", interval_s=2)
        eventually(lambda: not undrained(self.common, JOB), 120, "the pipeline to drain", interval_s=2)
        return self.table()


@pytest.fixture(scope="module")
def running(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    supervisor = Supervisor(
        prefix, tmp_path_factory.mktemp("client"),
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            **COMPUTE_NOT_UNDER_TEST,
        },
    )
    try:
        supervisor.start_all()
        yield Running(supervisor, common)
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def _as_dict(record: KeyedRecord) -> dict:
    return {"record_id": record.record_id, "key": record.user, "payload": {"user": record.user, "amount": record.amount}}


def test_sync_and_async_clients_send_dicts_json_and_protobufs_exactly_once(running: Running) -> None:
    records = list(usersum.records(900, users=40, id_prefix="client"))
    dicts, jsons, protos = records[:300], records[300:600], records[600:]
    with IngestClient(running.supervisor.address("ingest")) as client:
        assert client.ingest([_as_dict(r) for r in dicts], wait="processed").accepted == 300
        # Sent again with the same record_ids, as after a lost reply: the gate drops the copies.
        assert client.ingest([json.dumps(_as_dict(r)).encode() for r in dicts[:100]]).accepted == 100
        with pytest.raises(RecordsRejected) as refused:
            client.ingest([_as_dict(dicts[0]), {"record_id": "x" * 300, "key": "u1", "payload": "{}"}])
    [rejection] = refused.value.rejections
    assert (rejection.index, rejection.field) == (1, "record_id"), refused.value

    async def send_async() -> int:
        async with AsyncIngestClient(running.supervisor.address("ingest")) as client:
            json_calls = [client.ingest([json.dumps(_as_dict(r)).encode() for r in jsons[i:i + 30]]) for i in range(0, 300, 30)]
            proto_calls = [client.ingest(usersum.ingest_records(protos[i:i + 30]), wait="processed") for i in range(0, 300, 30)]
            replies = await asyncio.gather(*json_calls, *proto_calls)
        return sum(reply.accepted for reply in replies)

    assert asyncio.run(send_async()) == 600
    running.sent += records
    assert running.drained_and_exact() == usersum.fold_answer(running.sent)

    async def read_async() -> dict[str, dict]:
        async with AsyncQueryClient(running.supervisor.address("sink")) as query:
            assert await query.get(JOB, "no-such-user") is None
            return {key: json.loads(value) async for key, value in query.scan(JOB, page_size=7)}

    assert asyncio.run(read_async()) == usersum.fold_answer(running.sent)


def test_a_table_of_more_than_one_scan_page_is_read_whole_each_row_once(running: Running) -> None:
    big = [KeyedRecord(f"big:{k}", f"w{k:05d}", k % 997 + 1) for k in range(BIG)]
    with IngestClient(running.supervisor.address("ingest")) as client:
        for start in range(0, BIG, 2000):
            client.ingest(usersum.ingest_records(big[start:start + 2000]))
    running.sent += big
    running.drained_and_exact()
    with QueryClient(running.supervisor.address("sink")) as query:
        for page_size in (MAX_PAGE, 3001):
            keys = [key for key, _value in query.scan(JOB, prefix="w", page_size=page_size)]
            assert len(keys) == len(set(keys)) == BIG, (page_size, len(keys), len(set(keys)))
        first = query.page(JOB, prefix="w", page_size=MAX_PAGE)
    assert len(first.rows) <= MAX_PAGE and first.next_token, "one page cannot hold the whole table"


def test_a_results_tail_resumed_from_its_snapshot_ends_equal_to_the_sink_through_a_sink_kill9(running: Running) -> None:
    sink_kill_at, stop_at = 1, 3
    batches = [list(usersum.records(500, users=60, id_prefix=f"tail{b}", seed=100 + b)) for b in range(6)]
    address = running.supervisor.address("ingest")
    first = ResultsTail(running.common.kafka_bootstrap, JOB, running.common.topic_prefix)
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            first.poll(0.2)

    folded = threading.Thread(target=follow, name="tail")
    folded.start()
    with IngestClient(address) as client:
        for index, batch in enumerate(batches):
            if index == sink_kill_at:
                running.supervisor.kill9("sink")
            if index == stop_at:  # the application stops here and keeps where it was
                stop.set()
                folded.join()
                saved = first.snapshot().to_json()
                first.close()
            client.ingest(usersum.ingest_records(batch))
            running.sent += batch
    final = running.drained_and_exact()

    resumed = ResultsTail(running.common.kafka_bootstrap, JOB, running.common.topic_prefix, resume=TailSnapshot.from_json(saved))
    try:
        assert resumed.snapshot().positions, "the first tail read nothing before it stopped"
        changes = list(resumed.changes(idle_timeout_s=3))
        assert changes, "nothing arrived after the resume"
        assert {key: json.loads(value) for key, value in resumed.table.items()} == final
    finally:
        resumed.close()
    assert running.supervisor.restarts["sink"] == 0, "the killed sink was restarted by kill9, not by a crash"


def test_an_async_tail_given_no_prefix_follows_onceflow_topic_prefix(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 45: a tail built as the docs show it, on a prefixed pipeline, read the unprefixed topic
    # and saw 0 changes, quietly; and AsyncResultsTail had no `async with`.
    monkeypatch.setenv("ONCEFLOW_TOPIC_PREFIX", running.common.topic_prefix)
    batch = list(usersum.records(300, users=40, id_prefix="envtail", seed=7))
    with IngestClient(running.supervisor.address("ingest")) as client:
        client.ingest(usersum.ingest_records(batch))
    running.sent += batch
    final = running.drained_and_exact()

    async def follow() -> dict[str, dict]:
        async with AsyncResultsTail(running.common.kafka_bootstrap, JOB) as tail:
            assert tail.snapshot().positions == {}
            async for _change in tail.changes(idle_timeout_s=2):
                pass
            return {key: json.loads(value) for key, value in tail.table.items()}

    assert asyncio.run(follow()) == final

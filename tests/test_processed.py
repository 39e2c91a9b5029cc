"""``wait=PROCESSED`` means "its effect is in the result table" (docs/decisions/0016), on the
whole pipeline: ingest (acking on), the acker, the gate, compute's two hops and the sink.

Each record is sent alone and waited for; the moment the call returns, the rows it changed are
read through ``Query.Get`` and must already equal the plain answer over everything sent so far.
Nothing else sends, so there is no later record to hide behind. Checked for an aggregation
(usersum, on the pandas engine: Spark is not the subject) and for an incremental join (Nexmark
q3, on Spark: joins need it).

The check can fail: with the sink sabotaged to drop its acks (``sink_drops_acks``), the rows
still appear, but no call returns, because the trees end only at the sink's ack."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import pytest

from onceflow.faults import SABOTAGE_ENV
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc, sink_pb2, sink_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import nexmark, usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, eventually
from tests.harness.supervised import supervised
from tests.nexmark_answers import q3

pytestmark = [pytest.mark.acker, pytest.mark.integration]

Table = dict[str, dict]
# Long enough for a Spark micro-batch on a loaded machine, far below the trees' timeout: a
# call that has not returned by then is waiting for an ack that never comes.
PROCESSED_WITHIN_S = 45.0
TREE_TIMEOUT_MS = 120_000


def rows(sink: str, job: str, keys: list[str]) -> Table:
    with grpc.insecure_channel(sink) as channel:
        query = sink_pb2_grpc.QueryStub(channel)
        found = {}
        for key in keys:
            row = query.Get(sink_pb2.GetRowRequest(job=job, key=key), timeout=10)
            if row.found:
                found[key] = json.loads(row.value)
        return found


def processed_then_visible(
    supervisor: Supervisor, job: str, sends: list[list[IngestRecord]], answer_after: Callable[[int], Table],
    within_s: float = PROCESSED_WITHIN_S,
) -> list[str]:
    """Send each list with wait=PROCESSED; as each call returns, read the rows the answer over
    sends 0..i holds. What went wrong, per send: empty if every call returned and every row was
    already there."""
    problems = []
    with grpc.insecure_channel(supervisor.address("ingest")) as channel:
        ingest = ingest_pb2_grpc.IngestStub(channel)
        for i, records in enumerate(sends):
            request = ingest_pb2.IngestRequest(records=records, wait=ingest_pb2.WAIT_FOR_PROCESSED)
            try:
                reply = ingest.Ingest(request, timeout=within_s)
            except grpc.RpcError as exc:
                problems.append(f"send {i}: no reply within {within_s:.0f} s ({exc.code().name})")
                continue
            assert reply.accepted == len(records), reply
            answer = answer_after(i)
            seen = rows(supervisor.address("sink"), job, sorted(answer))
            problems += [
                f"send {i}: row {key!r} is {seen.get(key)!r} when PROCESSED returned, not {want!r}"
                for key, want in answer.items()
                if seen.get(key) != want
            ]
    return problems


# -- an aggregation -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def aggregating(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    settings = {"compute": {"JOB": usersum.JOB}, "ingest": {"TREE_TIMEOUT_MS": str(TREE_TIMEOUT_MS)}}
    yield from supervised(tmp_path_factory.mktemp("processed-agg"), settings, COMPUTE_NOT_UNDER_TEST)


def usersum_sends(id_prefix: str, count: int) -> list[list[KeyedRecord]]:
    """One record per send, over three users, so each send changes a row that already exists."""
    return [[KeyedRecord(f"{id_prefix}:{i}", f"{id_prefix}-u{i % 3}", i + 1)] for i in range(count)]


# One worker for both: the sabotage restarts the module's sink, after the first test.
@pytest.mark.xdist_group("processed-aggregation")
def test_processed_means_the_aggregate_row_is_readable(aggregating: Supervisor) -> None:
    sends = usersum_sends("agg", 12)

    def answer_after(i: int) -> Table:
        return usersum.fold_answer(r for send in sends[: i + 1] for r in send)

    problems = processed_then_visible(aggregating, usersum.JOB, [usersum.ingest_records(s) for s in sends], answer_after)
    assert problems == []


@pytest.mark.xdist_group("processed-aggregation")
def test_the_check_fails_when_the_sink_drops_its_acks(aggregating: Supervisor) -> None:
    sink = aggregating.instances["sink"]
    assert sink.process.terminate() == 0, sink.process.log_tail()
    sink.process.start({SABOTAGE_ENV: "sink_drops_acks"})
    sink.process.wait_healthy(sink.address)
    # First the sabotaged sink shows it applies: a record waited for only until committed.
    [applied] = usersum_sends("applied", 1)
    with grpc.insecure_channel(aggregating.address("ingest")) as channel:
        ingest_pb2_grpc.IngestStub(channel).Ingest(ingest_pb2.IngestRequest(records=usersum.ingest_records(applied)), timeout=30)
    answer = usersum.fold_answer(applied)
    eventually(lambda: rows(sink.address, usersum.JOB, sorted(answer)) == answer, 60, "the sabotaged sink to apply")
    # Then a record waited for until processed: applied as fast, but its tree never completes.
    [dropped] = usersum_sends("dropped", 1)
    answer = usersum.fold_answer(dropped)

    problems = processed_then_visible(aggregating, usersum.JOB, [usersum.ingest_records(dropped)], lambda i: answer, within_s=15)

    assert len(problems) == 1 and "no reply within 15 s (DEADLINE_EXCEEDED)" in problems[0], problems
    assert rows(sink.address, usersum.JOB, sorted(answer)) == answer  # in Redis: only the acks are missing


# -- an incremental join ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def joining(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    compute = {"JOB": "nexmark_q3", "SPARK_MASTER": "local[1]", "SPARK_SHUFFLE_PARTITIONS": "1"}
    settings = {"compute": compute, "ingest": {"TREE_TIMEOUT_MS": str(TREE_TIMEOUT_MS)}}
    yield from supervised(tmp_path_factory.mktemp("processed-join"), settings, {})


def q3_events() -> list[nexmark.Event]:
    """Sellers in Oregon and their category-10 auctions, the seller first for some and the
    auction first for others: each send adds one side of a joined row."""
    base = 1_700_000_000_000
    events = []
    for k in range(3):
        person = {"id": 900 + k, "name": f"seller {k}", "city": "Bend", "state": "OR", "date_time": base + k}
        auction = {"id": 5000 + k, "seller": 900 + k, "category": 10, "expires": base + 60_000, "date_time": base + k}
        sides = [("person", person), ("auction", auction)]
        for kind, fields in sides if k % 2 == 0 else reversed(sides):
            events.append(nexmark.Event(len(events), kind, base + k, base + k, fields))  # type: ignore[arg-type]
    return events


def test_processed_means_the_joined_row_is_readable(joining: Supervisor) -> None:
    events = q3_events()
    sends = [nexmark.ingest_records([e], id_prefix="join") for e in events]
    assert len(q3(events)) == 3
    assert processed_then_visible(joining, "nexmark_q3", sends, lambda i: q3(events[: i + 1])) == []

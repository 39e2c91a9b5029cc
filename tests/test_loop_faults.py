"""The shared transactional loop under kill -9, zombies, rebalances and broker restarts.

The stage is tests/harness/workers/keyed_counter.py: per-key counts in the changelog-backed
store and one output per input. After each scenario the checker demands: every input exactly
once in the output (read_committed), poison records exactly once in the DLQ, no hanging
transaction, and the changelog's table equal to the counts computed from the input itself."""

from __future__ import annotations

import random
import re
import time
from collections import Counter

import pytest

from onceflow.topology import Topic
from onceflow.txn.errors import EXIT_FENCED, EXIT_RESTART
from tests.conftest import Pipeline, eventually
from tests.harness import checker
from tests.harness.process import RestartOnRequest, ServiceProcess, restart_lone_broker
from tests.harness.workload import Item, items, produce_envelopes

pytestmark = [pytest.mark.foundation, pytest.mark.integration, pytest.mark.fault]

WORKER = "tests.harness.workers.keyed_counter"
POISON = [b"\x00not an envelope", b"\xff\xfe"]


def _counter(pipe: Pipeline, instance: str, **env: str) -> ServiceProcess:
    return pipe.process(f"counter-{instance}-{len(pipe.processes)}", WORKER, COUNTER_INSTANCE=instance, **env)


def _outputs(pipe: Pipeline) -> list[checker.TopicRecord]:
    return checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_RECORDS))


def _wait_processed(pipe: Pipeline, expected: int, timeout_s: float = 120) -> None:
    eventually(
        lambda: len({checker.record_id(r) for r in _outputs(pipe)}) >= expected,
        timeout_s,
        f"{expected} distinct outputs",
        interval_s=1.0,
    )


def _check_exactly_once(pipe: Pipeline, inputs: list[Item], poison: int) -> None:
    topics = [pipe.topic(t) for t in (Topic.DEDUP_RECORDS, Topic.DEDUP_CHANGELOG, Topic.DEDUP_DLQ)]
    assert checker.hanging_transactions(pipe.common, topics, wait_s=30) == {}
    report = checker.DeliveryReport.of(_outputs(pipe), [i.record_id for i in inputs])
    report.assert_exactly_once()
    assert len(checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_DLQ))) == poison
    # The state must equal a crash-free run's: counts per (input partition, key).
    by_id = {i.record_id: i.key for i in inputs}
    expected: Counter[tuple[int, bytes]] = Counter()
    for record in checker.read_committed(pipe.common, pipe.topic(Topic.INGEST_RECORDS)):
        if record.key != b"poison":
            expected[(record.partition, by_id[record.key.decode()])] += 1
    table = checker.latest_by_key(checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_CHANGELOG)))
    assert {k: int(v) for k, v in table.items()} == dict(expected)


@pytest.mark.parametrize("point", ["before_produce", "after_produce", "after_commit"])
def test_crash_inside_the_transaction_loses_and_duplicates_nothing(pipeline: Pipeline, point: str) -> None:
    inputs = items(f"crash-{point}", 3000)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs, POISON)
    worker = _counter(pipeline, "a", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="200")
    worker.start({"ONCEFLOW_FAULT": f"{point}@3"})
    assert worker.wait_exit(90) == -9, worker.log_tail()
    worker.start()
    _wait_processed(pipeline, len(inputs))
    assert worker.terminate() == 0, worker.log_tail()
    _check_exactly_once(pipeline, inputs, poison=len(POISON))


def test_kill9_at_random_moments_while_input_keeps_arriving(pipeline: Pipeline) -> None:
    rng = random.Random(20261121)
    inputs = items("random-kill", 4000)
    chunks = [inputs[i : i + 1000] for i in range(0, len(inputs), 1000)]
    worker = _counter(pipeline, "a", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="100")
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), chunks[0])
    worker.start()
    for chunk in chunks[1:]:
        time.sleep(rng.uniform(1.0, 3.0))
        produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), chunk)
        assert worker.kill9() == -9
        worker.start()
    _wait_processed(pipeline, len(inputs))
    assert worker.terminate() == 0, worker.log_tail()
    _check_exactly_once(pipeline, inputs, poison=0)


def test_zombie_is_fenced_and_its_later_writes_never_appear(pipeline: Pipeline) -> None:
    first, second = items("zombie-1", 2000), items("zombie-2", 1000)
    shared = {"COUNTER_TRANSACTIONAL_ID": pipeline.topic("counter-shared"), "ONCEFLOW_LOOP_MAX_BATCH_RECORDS": "50"}
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), first)
    old = _counter(pipeline, "old", **shared).start()
    eventually(lambda: len(_outputs(pipeline)) >= 100, 60, "the old instance to commit something")
    old.sigstop()
    new = _counter(pipeline, "new", **shared).start()
    _wait_processed(pipeline, len(first))
    old_writes = sum(r.header("instance") == b"old" for r in _outputs(pipeline))
    assert old_writes > 0

    woke_at = len(old.log_path.read_text(errors="replace"))
    old.sigcont()
    # The zombie learns it is fenced only when it next writes. Woken between batches, it first
    # rejoins the group and takes partitions back; input sent before that would all go to the
    # new instance, leaving the zombie idle and never fenced (seen in CI: py-spy showed it
    # polling two empty partitions). So send the second input once it is back, or gone.
    eventually(
        lambda: not old.alive() or re.search(r"assigned \[\d", old.log_path.read_text(errors="replace")[woke_at:]),
        60, "the zombie to be fenced or back in the group",
    )
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), second)
    assert old.wait_exit(90) == EXIT_FENCED, old.log_tail()
    _wait_processed(pipeline, len(first) + len(second))
    assert new.terminate() == 0, new.log_tail()
    assert sum(r.header("instance") == b"old" for r in _outputs(pipeline)) == old_writes
    _check_exactly_once(pipeline, first + second, poison=0)


def test_rebalance_moves_partitions_with_their_state(pipeline: Pipeline) -> None:
    inputs = items("rebalance", 6000)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs[:3000])
    a = _counter(pipeline, "a", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="100").start()
    eventually(lambda: len(_outputs(pipeline)) >= 500, 60, "a to make progress")
    b = _counter(pipeline, "b", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="100").start()
    b.wait_log("assigned [", 60)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs[3000:])
    assert a.terminate() == 0, a.log_tail()  # graceful leave: b takes a's partitions, restores them
    _wait_processed(pipeline, len(inputs))
    assert b.terminate() == 0, b.log_tail()
    _check_exactly_once(pipeline, inputs, poison=0)


def test_broker_restart_mid_stream(pipeline: Pipeline, broker) -> None:
    inputs = items("broker-restart", 3000)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs[:2000])
    worker = _counter(pipeline, "a", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="100").start()
    # librdkafka's consumer can stay without its coordinator after the broker returns (CI: no
    # committed offsets for a minute with the broker up); the loop then exits 4 for a restart.
    # A transaction open across the restart can outlive transaction.timeout.ms (10 s): the
    # reloaded coordinator aborts it with a new epoch, and the loop, which cannot tell that from
    # a newer instance, exits 3 as fenced (a fresh-clone run, 2026-11-26). A deployment's
    # supervisor restarts that exit too; exactly-once is judged the same either way.
    supervisor = RestartOnRequest(lambda: [worker], codes=(EXIT_RESTART, EXIT_FENCED)).start()
    eventually(lambda: len(_outputs(pipeline)) >= 300, 60, "progress before the restart")
    restart_lone_broker(broker, pipeline.processes)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs[2000:])
    try:
        # Usually done in under a minute. A client that stays stuck leaves through fixed costs:
        # the call's timeout (30 s), one resume (30 s), the abort's resumes (90 s), then exit 4,
        # restart and restore: about 160 s after the restart.
        _wait_processed(pipeline, len(inputs), timeout_s=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; restarted: {supervisor.restarts}\n{worker.log_tail()}\n{worker.stack_dump()}") from None
    finally:
        supervisor.stop()
    assert worker.terminate() == 0, f"restarted: {supervisor.restarts}\n{worker.log_tail()}"
    _check_exactly_once(pipeline, inputs, poison=0)

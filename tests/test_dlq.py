"""Dead letters against the real broker: letters written to a pipeline's dead-letter topics (by
hand, as the stages write them) are listed, filtered, shown and followed, through the SDK
(``onceflow_client.dlq.DeadLetters``) and the CLI (``onceflow dlq``); a letter of an aborted
transaction is never seen (read_committed). The decoding itself: libs/onceflow-client/tests/test_dlq_logic.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from confluent_kafka import Producer

from onceflow.topology import DLQS, Topic
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow_client.dlq import DLQ_TOPICS, DeadLetters, Letter, LetterFilter
from tests.conftest import Pipeline

pytestmark = pytest.mark.integration


def test_the_reader_knows_every_dead_letter_topic() -> None:
    assert set(DLQ_TOPICS) == {str(t) for t in DLQS} | {str(Topic.COMPUTE_LATE)}


def map_letter(record_id: str, message: str) -> bytes:
    original = Envelope(record_id=record_id, root_id=1, attempt=1, payload=b'{"amount":"12"}').SerializeToString()
    return DeadLetter(stage="compute", error_class="Rejected", message=message, original=original,
                      source_topic="dedup.records", failed_at_ms=1_700_000_000_000).SerializeToString()


def cli(*args: str) -> subprocess.Popen[str]:
    # Without COLUMNS (pytest's terminal may set it): a table in a pipe is printed whole.
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    return subprocess.Popen(
        [sys.executable, "-m", "onceflow_tools", "dlq", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )


def test_letters_are_listed_filtered_shown_and_followed(pipeline: Pipeline) -> None:
    bootstrap, prefix = pipeline.common.kafka_bootstrap, pipeline.common.topic_prefix
    writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}dlq-test"})
    writer.init_transactions(10)
    writer.begin_transaction()
    writer.produce(f"{prefix}compute.dlq", map_letter("aborted", "job orders failed on this record: never committed"))
    writer.flush(10)  # on the broker, so the abort has something to abort (else it is only purged)
    writer.abort_transaction(10)
    writer.begin_transaction()
    writer.produce(f"{prefix}compute.dlq", map_letter("o-1", "job orders failed on this record: bad amount"))
    writer.produce(f"{prefix}compute.dlq", map_letter("o-2", "a required field is missing"))
    writer.produce(f"{prefix}compute.dlq", DeadLetter(
        stage="compute-merge", error_class="ZeroDivisionError", message="division by zero",
        original=PartialAggregate(job="totals", key="u1", partials=b"[1,0]").SerializeToString(),
        source_topic=f"{prefix}compute.partials.totals",
    ).SerializeToString())
    writer.produce(f"{prefix}source.dlq", DeadLetter(
        stage="source", error_class="Rejected", message="no id field", original=b'{"amount": 5}'
    ).SerializeToString())
    writer.commit_transaction(10)

    with DeadLetters(bootstrap, prefix) as letters:
        every = letters.list()
        assert [(one.topic, one.record_id, one.job) for one in every] == [
            ("source.dlq", None, None), ("compute.dlq", "o-1", "orders"), ("compute.dlq", "o-2", None),
            ("compute.dlq", None, "totals"),
        ]
        assert [one.record_id for one in letters.list(LetterFilter(reason="required"))] == ["o-2"]
        first = every[1]
        assert letters.get("compute.dlq", first.partition, first.offset).record_id == "o-1"
        assert first.offset > 0
        with pytest.raises(LookupError):
            letters.get("compute.dlq", 0, 0)  # the aborted letter's offset holds nothing committed

    # The CLI, its commands at once (each run imports the whole CLI: seconds).
    args = ("--prefix", prefix, "--bootstrap", bootstrap)
    runs = {
        "listed": cli("list", "--json", *args, "--job", "orders"),
        "shown": cli("show", "compute.dlq", str(first.partition), str(first.offset), "--json", *args),
        "rows": cli("list", *args, "--topic", "compute.dlq"),
        "table": cli("list", *args, "--topic", "acker.dlq"),
        "wrong": cli("list", "--prefix", "no-such-prefix.", "--bootstrap", bootstrap),
        # tail: only letters committed after it started, until --max.
        "followed": cli("tail", "--json", "--max", "1", "--timeout", "30", *args, "--stage", "sink"),
    }
    try:
        followed = runs["followed"]
        assert followed.stderr is not None
        assert "following" in followed.stderr.readline()  # it has found where to start
        with DeadLetters(bootstrap, prefix, ["sink.dlq"]) as sdk:
            seen: list[Letter] = []
            new_letters = sdk.tail(most=1, timeout_s=30)  # starts here, not at the first next()
            reader = threading.Thread(target=lambda: seen.extend(new_letters))
            reader.start()
            plain = Producer({"bootstrap.servers": bootstrap})
            plain.produce(f"{prefix}sink.dlq", DeadLetter(stage="sink", error_class="InvalidResultChange",
                                                           message="no value").SerializeToString())
            plain.flush(10)
            reader.join(30)
        assert [one.error_class for one in seen] == ["InvalidResultChange"]
        done = {name: run.communicate(timeout=40) for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:  # a check above failed: end what this test started
                run.kill()
                run.wait()
    listed, shown, table, wrong = (done[name][0] for name in ("listed", "shown", "table", "wrong"))
    assert runs["listed"].returncode == 0, done["listed"][1]
    document = json.loads(listed)
    assert document["total"] == 1 and document["counts"] == {"compute: Rejected": 1}
    assert document["letters"][0]["original"]["payload"] == '{"amount":"12"}'
    assert json.loads(shown)["record_id"] == "o-1", done["shown"][1]
    rows = done["rows"][0]
    assert f"3 dead letter(s) in {prefix}compute.dlq" in rows and "2  compute: Rejected" in rows, done["rows"]
    assert "o-1" in rows and "division by zero" in rows and "totals" in rows
    assert runs["table"].returncode == 0 and f"no dead letters in {prefix}acker.dlq" in table
    assert runs["wrong"].returncode == 2 and "is the pipeline's topic prefix 'no-such-prefix.'" in wrong
    out, err = done["followed"]
    assert followed.returncode == 0, err
    assert [json.loads(line)["error_class"] for line in out.splitlines()] == ["InvalidResultChange"]

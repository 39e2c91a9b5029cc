"""Batch mode: a job over a bounded file as one Spark job gives the table computed here
independently (plain Python), whatever malformed records the file holds."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame
from typer.testing import CliRunner

from onceflow_compute import batch, jobs
from onceflow_compute.api import Aggregation, Avg, Count, Max, Min, Sum, Transform
from onceflow_compute.engine.spark import SparkEngine

pytestmark = pytest.mark.compute

# Lines no job can take: not JSON, not an object, two objects, a wrong type, a missing or
# null required field.
BAD_USERSUM = [
    "not json",
    '{"user": "ann", "amount": ',
    "[1, 2]",
    '{"user": "ann", "amount": 1} {"user": "ann", "amount": 1}',
    '{"user": "ann", "amount": 1.5}',
    '{"user": "ann", "amount": "12"}',
    '{"user": 7, "amount": 12}',
    '{"user": "ann"}',
    '{"amount": 3}',
    '{"user": null, "amount": 3}',
    '{"user": "ann", "amount": 3, "_event_time_ms": "soon"}',
]


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    """One Spark session for the module (it takes ~10 s to start)."""
    spark = batch.spark_engine("local[2]", shuffle_partitions=2)
    yield spark
    spark.close()


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _payments(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    users = [f"user-{i}" for i in range(12)] + ["ann", "Bob", "ümit", "a b"]
    # Amounts past 2**31 check that sums stay int64 (and Python ints) end to end.
    amounts = [rng.choice([rng.randint(-50, 500), rng.randint(2**31, 2**40)]) for _ in range(count)]
    return [{"user": rng.choice(users), "amount": amount} for amount in amounts]


def _usersum(payments: list[dict]) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for p in payments:
        first = {"user": p["user"], "total": 0, "count": 0, "smallest": p["amount"], "largest": p["amount"]}
        row = table.setdefault(p["user"], first)
        row["total"] += p["amount"]
        row["count"] += 1
        row["smallest"] = min(row["smallest"], p["amount"])
        row["largest"] = max(row["largest"], p["amount"])
    return table


def _mixed(good: list[str], bad: list[str], seed: int) -> list[str]:
    """The good lines in order with the bad ones and blank lines scattered between them."""
    rng = random.Random(seed)
    lines = list(good)
    for line in [*bad, "", "   "]:
        lines.insert(rng.randint(0, len(lines)), line)
    return lines


def _assert_same_types(actual: dict[str, dict], expected: dict[str, dict]) -> None:
    for key, row in expected.items():
        for column, value in row.items():
            assert type(actual[key][column]) is type(value), (key, column, actual[key][column])


def test_usersum_over_jsonl_with_malformed_lines(engine: SparkEngine, tmp_path: Path) -> None:
    payments = _payments(400, seed=1)
    good = [json.dumps(p) for p in payments]
    good[3] = json.dumps({**payments[3], "note": "extra fields are ignored", "_key": "k"})
    path = _write_lines(tmp_path / "payments.jsonl", _mixed(good, BAD_USERSUM, seed=2))

    result = batch.run_batch(jobs.load_job("usersum"), path, engine)

    expected = _usersum(payments)
    assert result.table == expected
    _assert_same_types(result.table, expected)
    assert (result.job, result.kind) == ("usersum", "aggregation")
    assert result.rows_in == len(good) + len(BAD_USERSUM)  # blank lines are not records
    assert result.dropped == len(BAD_USERSUM) == sum(result.reasons.values())
    assert result.reasons["a required field is missing"] == 3  # no amount, no user, null user
    bad_numbers = {i for i, line in enumerate(path.read_text().splitlines(), start=1) if line in BAD_USERSUM}
    assert {number for number, _reason in result.examples} == bad_numbers


def test_wordcount_over_jsonl(engine: SparkEngine, tmp_path: Path) -> None:
    rng = random.Random(3)
    vocabulary = ["the", "The", "quick", "brown", "fox's", "jumps", "over", "lazy", "dog", "42", "Café", "naïve"]
    texts = [
        " ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 12))) + rng.choice(["", ".", "!!", " -- ", "\t"])
        for _ in range(300)
    ]
    bad = ['{"text": 5}', '{"words": "no text field"}', '{"text": null}', "{{}"]
    path = _write_lines(tmp_path / "lines.jsonl", _mixed([json.dumps({"text": t}) for t in texts], bad, seed=4))

    result = batch.run_batch("wordcount", path, engine)

    counts: dict[str, int] = {}
    for text in texts:
        for word in re.split(r"[^a-z0-9']+", text.lower()):
            if word:
                counts[word] = counts.get(word, 0) + 1
    assert result.table == {word: {"word": word, "count": n} for word, n in counts.items()}
    _assert_same_types(result.table, {word: {"word": word, "count": n} for word, n in counts.items()})
    assert result.dropped == len(bad)


def test_usersum_over_parquet(engine: SparkEngine, tmp_path: Path) -> None:
    payments = _payments(200, seed=5)
    users = [p["user"] for p in payments] + [None, "ann"]
    # int32 in the file: cast to the schema's int64; a null required field drops the row.
    amounts = [p["amount"] % 2**31 for p in payments] + [5, None]
    path = tmp_path / "payments.parquet"
    pq.write_table(pa.table({"user": users, "amount": pa.array(amounts, pa.int64()).cast(pa.int32()), "other": range(202)}), path)

    result = batch.run_batch("usersum", path, engine)

    assert result.table == _usersum([{"user": u, "amount": a} for u, a in zip(users[:200], amounts[:200], strict=True)])
    assert (result.rows_in, result.dropped) == (202, 2)
    assert [number for number, _reason in result.examples] == [201, 202]

    # A value that does not fit the schema's type drops that row only.
    floats = tmp_path / "floats.data"
    pq.write_table(pa.table({"user": ["a", "a", "b", "a"], "amount": [1.0, 2.5, 3.0, 4.0]}), floats)
    result = batch.run_batch("usersum", floats, engine, input_format="parquet")
    assert result.table == _usersum([{"user": "a", "amount": 1}, {"user": "b", "amount": 3}, {"user": "a", "amount": 4}])
    assert result.dropped == 1 and result.examples[0][0] == 2


def test_bigspend_transform(engine: SparkEngine, tmp_path: Path) -> None:
    lines = [
        '{"user": "ann", "amount": 100, "_record_id": "r-1"}',
        '{"user": "bob", "amount": 99, "_record_id": "r-2"}',
        "",
        '{"user": "cat", "amount": 250}',  # no _record_id: its line number, 4
        '{"user": "dan", "amount": "lots"}',
        '{"user": "eve", "amount": 1000, "_record_id": "r-1"}',  # the same key again: the last row wins
        '{"user": "fay", "amount": 100000000000}',
    ]
    path = _write_lines(tmp_path / "payments.jsonl", lines)

    result = batch.run_batch("bigspend", path, engine)

    assert result.kind == "transform"
    assert result.table == {
        "r-1": {"_record_id": "r-1", "user": "eve", "amount": 1000},
        "4": {"_record_id": "4", "user": "cat", "amount": 250},
        "7": {"_record_id": "7", "user": "fay", "amount": 100000000000},
    }
    assert (result.rows_in, result.dropped) == (6, 1)


def test_a_job_spark_cannot_plan_fails_naming_the_column_not_the_plan(engine: SparkEngine, tmp_path: Path) -> None:
    """Issue 45: Status showed `AnalysisException: +- LogicalRDD , false`, the plan's last line;
    the reason is the first (`amount` cannot be resolved, and what was meant)."""
    from pyspark.sql import functions as F

    from onceflow_compute.engine.run import JobFailed

    schema = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount_cents", pa.int64(), nullable=False)])
    typo = Transform(name="typo", schema=schema, key="user", transform=lambda df: df.select("user", (F.col("amount") * 2).alias("x")))
    path = _write_lines(tmp_path / "cents.jsonl", ['{"user": "ann", "amount_cents": 5}', '{"user": "bob", "amount_cents": 7}'])
    with pytest.raises(JobFailed) as failed:
        batch.run_batch(typo, path, engine)
    message = str(failed.value)
    assert "Spark cannot plan it" in message and "`amount` cannot be resolved" in message, message
    assert "amount_cents" in message and "LogicalRDD" not in message, message


def _metadata(frame: DataFrame) -> DataFrame:
    return frame.select("_record_id", "_key", "_event_time_ms", "_ingest_time_ms", "v")


def test_metadata_columns_and_averages(engine: SparkEngine, tmp_path: Path) -> None:
    schema = pa.schema([pa.field("g", pa.string(), nullable=False), pa.field("v", pa.float64())])
    lines = [
        '{"g": "x", "v": 1, "_record_id": "a", "_key": "k1", "_event_time_ms": 1700000000000, "_ingest_time_ms": 5}',
        '{"g": "x", "v": 2.5}',
        '{"g": "x", "v": null}',
        '{"g": "y", "v": null}',
    ]
    path = _write_lines(tmp_path / "in.jsonl", lines)

    meta = Transform(name="meta", schema=schema, key="_record_id", transform=_metadata)
    assert batch.run_batch(meta, path, engine).table == {
        "a": {"_record_id": "a", "_key": "k1", "_event_time_ms": 1700000000000, "_ingest_time_ms": 5, "v": 1.0},
        "2": {"_record_id": "2", "_key": None, "_event_time_ms": None, "_ingest_time_ms": None, "v": 2.5},
        "3": {"_record_id": "3", "_key": None, "_event_time_ms": None, "_ingest_time_ms": None, "v": None},
        "4": {"_record_id": "4", "_key": None, "_event_time_ms": None, "_ingest_time_ms": None, "v": None},
    }

    stats = Aggregation(name="stats", schema=schema, key="g", aggregates=(Avg("v"), Sum("v"), Min("v"), Max("v"), Count()))
    assert batch.run_batch(stats, path, engine).table == {
        "x": {"g": "x", "avg_v": 1.75, "sum_v": 3.5, "min_v": 1.0, "max_v": 2.5, "count": 3},
        "y": {"g": "y", "avg_v": None, "sum_v": None, "min_v": None, "max_v": None, "count": 1},
    }


def test_cli_batch(engine: SparkEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow_tools.cli import app

    # The command's own Spark engine would be a second session; use the module's.
    monkeypatch.setattr(batch, "spark_engine", lambda *args, **kwargs: batch.SessionEngine(engine.session))
    payments = _payments(50, seed=6)
    path = _write_lines(tmp_path / "in.jsonl", _mixed([json.dumps(p) for p in payments], BAD_USERSUM[:3], seed=7))
    out = tmp_path / "table.jsonl"
    runner = CliRunner()

    done = runner.invoke(app, ["batch", "--job", "usersum", "--input", str(path), "--output", str(out)], terminal_width=200)

    assert done.exit_code == 0, done.output
    expected = _usersum(payments)
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [expected[key] for key in sorted(expected)]
    assert re.search(r"rows in\s+53\b", done.output) and re.search(r"dropped\s+3\b", done.output)
    assert re.search(rf"result rows\s+{len(expected)}\b", done.output)

    shown = runner.invoke(app, ["batch", "-j", "usersum", "-i", str(path), "--limit", "3"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert f"first 3 of {len(expected)} rows" in shown.output
    assert sorted(expected)[0] in shown.output

    unknown = runner.invoke(app, ["batch", "--job", "no_such_job", "--input", str(path)])
    assert unknown.exit_code == 2 and "no job 'no_such_job'" in unknown.output


def test_cli_imports_no_spark() -> None:
    """The CLI stays light: its commands and their help load neither the compute package nor
    pyspark (only running `onceflow batch` does)."""
    probe = """
import sys
from typer.testing import CliRunner
from onceflow_tools.cli import app
for command in (["batch", "--help"], ["admin", "compute", "--help"], ["admin", "compute", "state", "--help"]):
    done = CliRunner().invoke(app, command)
    assert done.exit_code == 0 and "Usage" in done.output, (command, done.output)
print("pyspark" in sys.modules, "onceflow_compute" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


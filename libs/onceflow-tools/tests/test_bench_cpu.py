"""The benches' CPU accounting: processes summed per kind, between two snapshots."""

import os

from onceflow_tools.bench.cpu import is_pipeline, label, snapshot, usage

TICK = os.sysconf("SC_CLK_TCK")


def test_kinds_of_process() -> None:
    assert label("/venv/bin/python -m onceflow_dedup") == "onceflow_dedup"
    assert label("/usr/bin/java -Xmx1g kafka.Kafka server.properties") == "Kafka broker"
    assert label("/usr/bin/java -cp pyspark/jars/* org.apache.spark.deploy.SparkSubmit") == "Spark JVM"
    assert label("/usr/bin/redis-server 127.0.0.1:16379") == "redis-server"
    assert label("/venv/bin/python bench/hop_batches.py", bench="hop_batches") == "this bench"


def test_usage_sums_a_kind_and_counts_new_processes_from_zero() -> None:
    before = {1: (10 * TICK, "python -m onceflow_sink"), 2: (5 * TICK, "python -m onceflow_sink")}
    after = {
        1: (12 * TICK, "python -m onceflow_sink"),
        2: (6 * TICK, "python -m onceflow_sink"),
        3: (TICK, "/usr/bin/redis-server"),  # started meanwhile
        4: (0, "idle"),
    }
    used = usage(before, after, elapsed_s=2.0)
    assert used.seconds == {"onceflow_sink": 3.0, "redis-server": 1.0}
    assert used.percent() == {"onceflow_sink": 150.0, "redis-server": 50.0}


def test_snapshot_sees_this_process() -> None:
    assert os.getpid() in snapshot()


def test_a_process_under_the_floor_is_left_out_before_summing() -> None:
    before = {1: (0, "python -m onceflow_sink"), 2: (0, "python -m onceflow_sink")}
    after = {1: (TICK, "python -m onceflow_sink"), 2: (TICK // 100, "python -m onceflow_sink")}
    assert usage(before, after, elapsed_s=10.0, min_process_percent=1).seconds == {"onceflow_sink": 1.0}


def test_the_pipeline_is_its_services_and_what_they_run_on() -> None:
    assert all(is_pipeline(k) for k in ("onceflow_dedup", "Kafka broker", "Spark JVM", "redis-server"))
    assert not any(is_pipeline(k) for k in ("this bench", "/usr/bin/python3 -c something", "java"))
    used = usage({}, {1: (2 * TICK, "python -m onceflow_acker"), 2: (3 * TICK, "python bench/x.py")}, 4.0, bench="x.py")
    assert used.pipeline_seconds() == 2.0

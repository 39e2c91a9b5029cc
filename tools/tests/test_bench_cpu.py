"""The benches' CPU accounting: processes summed per kind, between two snapshots."""

import os

from onceflow_tools.bench.cpu import (
    HopCpu, SpanMeter, busiest_python_thread_seconds, descendants, is_pipeline, label, snapshot, usage,
)

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


def test_a_process_tree_is_its_root_and_everything_below() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = descendants([os.getpid()])
        assert {os.getpid(), child.pid} <= found
        assert os.getppid() not in found
    finally:
        child.kill()
        child.wait()


def test_the_busiest_python_thread_is_named_like_its_process() -> None:
    before = {1: (0, "python"), 2: (0, "rdk:main"), 3: (TICK, "python")}
    after = {1: (TICK, "python"), 2: (5 * TICK, "rdk:main"), 3: (4 * TICK, "python"), 4: (TICK, "python")}
    # librdkafka's thread is busier, but it runs without the GIL: thread 3 is the bound.
    assert busiest_python_thread_seconds(1, before, after) == 3.0
    assert busiest_python_thread_seconds(1, {}, {1: (TICK, "java"), 2: (9 * TICK, "java")}) is None


def test_a_span_meter_sees_the_contender_spin_and_bounds_it_by_its_thread() -> None:
    import subprocess
    import sys

    # The contender spins 0.3 s of its own CPU between "go" and "done", however long a busy
    # machine takes to give it that much.
    spin = (
        "import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('done', flush=True)\nsys.stdin.readline()"
    )
    contender = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert contender.stdin is not None and contender.stdout is not None
    try:
        meter = SpanMeter([contender.pid])
        meter.start()
        contender.stdin.write("go\n")
        contender.stdin.flush()
        assert contender.stdout.readline().strip() == "done"
        cpu = meter.stop(records=1000)
    finally:
        contender.kill()
        contender.wait()
    # 0.3 s of one thread over 1,000 records: about 300 µs each, so at most about 3,333/s. The
    # process's and its threads' ticks are rounded apart: one tick (10 µs a record) of slack.
    tick_per_record_us = 1e6 / TICK / 1000
    assert cpu.busiest_thread_us is not None and 250 <= cpu.busiest_thread_us <= cpu.own_us + tick_per_record_us
    assert cpu.thread_bound_per_s is not None and cpu.thread_bound_per_s == 1e6 / cpu.busiest_thread_us
    assert HopCpu(10, None, 1, 1).thread_bound_per_s is None

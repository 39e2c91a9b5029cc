"""`onceflow demo` shows onceflow's own lines only: the Spark driver JVM it starts for the batch
answer writes its notices and warnings (log4j's profile, the hostname, the default log level,
the native-hadoop library) to the run's log folder, not to the terminal. The demo's step is run
on its own, in a child process whose whole output is what a terminal would show: one Spark
start, no Kafka or services."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.devex

# Lines the JVM prints when a Spark session starts, as they reached the demo's terminal.
NOISE = (
    "log4j", "WARN ", "Setting default log level", "sc.setLogLevel", "NativeCodeLoader",
    "SPARK_LOCAL_IP", "incubator modules",
)

SCRIPT = """
import sys
from pathlib import Path
from onceflow_tools.cli.demo import _batch_answer
from onceflow_tools.workloads import auctionbids, nexmark

arrivals = nexmark.arrival_order(nexmark.NexmarkConfig(events=300, rate=1_000, max_delay_ms=500, seed=3))
answer = _batch_answer(arrivals, Path(sys.argv[1]))
assert answer == auctionbids.fold_answer(arrivals), "the batch answer differs from the fold"
print(f"rows {len(answer)}")
"""


def test_the_demos_batch_answer_keeps_sparks_output_out_of_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "batch-spark.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    assert done.stdout.startswith("rows "), terminal
    assert [line for line in terminal.splitlines() if any(n in line for n in NOISE)] == []
    # It went to the log, so the test would see it if it reached the terminal again.
    assert any(n in log.read_text() for n in NOISE), log.read_text()

"""A process started inside ``stderr_to`` (as the Spark driver JVM is) writes its stderr to the log,
for as long as it lives; the terminal gets this process's stderr back afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onceflow_tools.jvm_output import stderr_to


def test_a_child_started_inside_keeps_writing_to_the_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "logs" / "spark.log"
    script = "import sys, time; print('WARN first', file=sys.stderr, flush=True); time.sleep(0.5); print('WARN later', file=sys.stderr)"
    with stderr_to(log):
        child = subprocess.Popen([sys.executable, "-c", script])
    print("ours", file=sys.stderr)
    assert child.wait(10) == 0
    assert log.read_text().splitlines() == ["WARN first", "WARN later"]
    terminal = capfd.readouterr().err
    assert "ours" in terminal and "WARN" not in terminal

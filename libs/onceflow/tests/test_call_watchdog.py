"""A producer call that hangs past its timeout ends the process with exit 4 (a restart), and one
that returns in time does not."""

from __future__ import annotations

import subprocess
import sys

from onceflow.txn.errors import EXIT_RESTART

_SCRIPT = """
import time
from onceflow.txn.producer import CallWatchdog
watchdog = CallWatchdog("test")
with watchdog.guard("quick", 5.0):
    time.sleep(0.1)
time.sleep(1.5)  # the watchdog looks once a second: it must have let the quick call be
print("survived the quick call", flush=True)
with watchdog.guard("hung send_offsets", 1.0):
    time.sleep(30)
print("never reached", flush=True)
"""


def test_a_hung_call_exits_for_a_restart_and_a_quick_one_does_not() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=20)
    assert done.returncode == EXIT_RESTART, done.stdout + done.stderr
    assert "survived the quick call" in done.stdout and "never reached" not in done.stdout
    assert "hung send_offsets" in done.stderr and "stuck past its timeout" in done.stderr

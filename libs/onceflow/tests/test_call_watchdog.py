"""A producer call that hangs past its timeout ends the process with exit 4 (a restart), and one
that returns in time does not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

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


_STOPPED_SCRIPT = """
import time
from onceflow.txn.producer import CallWatchdog
watchdog = CallWatchdog("test")
with watchdog.guard("send_offsets of a zombie", 5.0):
    print("in the call", flush=True)
    time.sleep(2.0)
time.sleep(1.5)
print("survived the stop", flush=True)
"""


def test_time_a_process_spends_stopped_does_not_count_against_its_call() -> None:
    # A SIGSTOPped instance (a zombie) must resume inside its call and meet its fence there.
    proc = subprocess.Popen([sys.executable, "-c", _STOPPED_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "in the call"
    proc.send_signal(signal.SIGSTOP)
    time.sleep(10.0)  # twice the call's limit
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, out + err
    assert "survived the stop" in out

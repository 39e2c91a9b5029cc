"""Process plumbing shared by the broker and Redis: detached start, pid files, stopping."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import string
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class InfraError(RuntimeError):
    """A component could not be installed, started or stopped; the message says where to look."""


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A killed child nobody has reaped yet (zombie) counts as dead:
    it holds no ports or files, and signalling it would "succeed"."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reaps it if it happens to be our child
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    if state not in ("Z", "X"):
        return True
    # The leader thread shows Z as soon as it exits, while the other threads may still be
    # tearing down (and holding the listening socket): dead only once it is the last one.
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_pid(pid_file: Path, marker: str) -> int | None:
    """The live pid recorded in ``pid_file`` if its command line contains ``marker``; a stale
    file (or a recycled pid that now belongs to something else) gives None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or not pid_alive(pid) or marker not in _cmdline(pid):
        return None
    return pid


def stop_pid(pid: int, timeout: float) -> bool:
    """SIGTERM, then SIGKILL if still alive after ``timeout``. True if it stopped cleanly."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_until(lambda: not pid_alive(pid), timeout, 0.05):
        return True
    kill_pid(pid)
    return False


def stop_recorded(pid_file: Path, marker: str, timeout: float) -> bool:
    """Stop the process ``pid_file`` records (``read_pid``) and forget it; False if none ran."""
    pid = read_pid(pid_file, marker)
    if pid is None:
        return False
    stop_pid(pid, timeout)
    pid_file.unlink(missing_ok=True)
    return True


def kill_pid(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_until(lambda: not pid_alive(pid), timeout, 0.02):
        raise InfraError(f"pid {pid} survived SIGKILL for {timeout:.0f}s")


def spawn_detached(cmd: list[str], out_path: Path, cwd: Path | None = None) -> int:
    """Start ``cmd`` in a new session, stdout/stderr appended to ``out_path``, and return its pid.

    A throwaway shell forks it and exits at once, so the process is not our child: it outlives
    the CLI, and a long-running caller (pytest) that kills it is not left holding a zombie.
    """
    out_path.parent.mkdir(parents=True, exist_ok=True)
    script = 'out=$1; shift; "$@" </dev/null >>"$out" 2>&1 & echo $!'
    res = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(out_path), *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    return int(res.stdout.strip())


def render(template: Path, dest: Path, values: dict[str, object]) -> Path:
    """Fill ``${name}`` placeholders; a missing value is an error, not an empty string."""
    text = string.Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(dest)
    return dest


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``path`` ('' if missing), read from the end."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            block, data = 8192, b""
            while size > 0 and data.count(b"\n") <= lines:
                step = min(block, size)
                size -= step
                f.seek(size)
                data = f.read(step) + data
    except OSError:
        return ""
    return b"\n".join(data.splitlines()[-lines:]).decode(errors="replace")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialises install/start/stop across processes (parallel test workers, two shells)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

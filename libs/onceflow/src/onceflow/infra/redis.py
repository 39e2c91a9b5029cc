"""The local Redis: Debian's redis-server binary, our own config, data and pid file."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from onceflow.infra import _proc
from onceflow.infra._proc import InfraError
from onceflow.infra.paths import display_path, infra_dir, runtime_dir
from onceflow.infra.settings import redis_port


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1 with AOF on. All state lives under ``home``."""

    port: int
    home: Path

    @classmethod
    def from_env(cls) -> RedisServer:
        return cls(port=redis_port(), home=runtime_dir() / "redis")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        return self.home / "redis.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "redis.pid"

    @property
    def conf_path(self) -> Path:
        return self.home / "redis.conf"

    @property
    def _lock(self) -> Path:
        return self.home / ".lock"

    @staticmethod
    def binary() -> str | None:
        return shutil.which("redis-server")

    def ensure_installed(self) -> bool:
        """Install redis-server from Debian's packages if missing; True if it was installed now."""
        if self.binary():
            return False
        res = subprocess.run(
            ["bash", str(infra_dir() / "redis" / "install.sh")], capture_output=True, text=True
        )
        if res.returncode != 0 or not self.binary():
            raise InfraError(f"could not install redis-server:\n{(res.stdout + res.stderr).strip()[-2000:]}")
        return True

    def pid(self) -> int | None:
        return _proc.read_pid(self.pid_file, "redis-server")

    def is_running(self) -> bool:
        return self.pid() is not None

    def is_healthy(self, timeout: float = 1.0) -> bool:
        """PING answers (a server still loading its AOF answers LOADING, which is not healthy)."""
        if not _proc.port_open(self.port, timeout=min(timeout, 0.5)):
            return False
        import redis as redis_py  # ~0.5 s to import: only when a server is there to ask

        client = redis_py.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            return bool(client.ping())
        except redis_py.RedisError:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 30.0) -> bool:
        """Start redis-server (it daemonizes itself) and wait for PING. False if already healthy."""
        with _proc.file_lock(self._lock):
            return self._start(timeout)

    def _start(self, timeout: float) -> bool:
        pid = self.pid()
        if pid is None:
            if _proc.port_open(self.port):
                raise InfraError(f"port {self.port} is taken by a process onceflow did not start")
            self.ensure_installed()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            _proc.render(
                infra_dir() / "redis" / "redis.conf",
                self.conf_path,
                {
                    "port": self.port,
                    "pid_file": self.pid_file,
                    "log_file": self.log_path,
                    "data_dir": self.data_dir,
                },
            )
            self.pid_file.unlink(missing_ok=True)
            res = subprocess.run(
                [self.binary() or "redis-server", str(self.conf_path)], capture_output=True, text=True
            )
            if res.returncode != 0:
                why = (res.stdout + res.stderr).strip()
                raise InfraError(f"redis-server refused to start: {why}; see {display_path(self.log_path)}")
        elif self.is_healthy():
            return False
        if not _proc.wait_until(self.is_healthy, timeout, 0.05):
            raise InfraError(
                f"redis did not answer PING on {self.address} within {timeout:.0f}s;"
                f" see {display_path(self.log_path)}"
            )
        return True

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (redis fsyncs the AOF and exits), SIGKILL after ``timeout``. False if not running."""
        with _proc.file_lock(self._lock):
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        _proc.stop_pid(pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL: at most the last second of writes is lost (appendfsync everysec)."""
        pid = self.pid()
        if pid is None:
            return False
        _proc.kill_pid(pid)
        return True

    def restart(self, hard: bool = False, timeout: float = 30.0) -> None:
        with _proc.file_lock(self._lock):
            if hard:
                self.kill()
            else:
                self._stop(timeout)
            self._start(timeout)

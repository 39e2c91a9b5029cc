"""The local Redis: Debian's redis-server binary, our own config, data and pid file."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow_tools.infra import access, plumbing, secure
from onceflow_tools.infra.paths import display_path, infra_dir, runtime_dir
from onceflow_tools.infra.plumbing import InfraError
from onceflow_tools.infra.settings import InfraSettings, redis_port, sentinel_port

if TYPE_CHECKING:
    import redis as redis_py  # ~0.5 s to import: imported where a server is there to ask

# The name Sentinel knows the primary by (the path of a redis+sentinel:// URL).
SENTINEL_MASTER = "onceflow"
# How long a just-started redis-server may go without a pid file before it counts as dead.
_PID_GRACE_S = 5.0


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1 with AOF on: a primary, a replica of ``replica_of``, or a
    Sentinel watching the primary on ``sentinel_of``. All state lives under ``home``."""

    port: int
    home: Path
    replica_of: int | None = None
    sentinel_of: int | None = None
    # TLS only (no plaintext port) and an ACL user with a password (onceflow_tools.infra.secure).
    secure: bool = False

    @classmethod
    def from_env(cls, secure: bool | None = None) -> RedisServer:
        """The primary (as started: after a failover the replica may be primary instead); in
        secure mode the secure one, in a home of its own."""
        if InfraSettings().secure if secure is None else secure:
            return cls(port=redis_port(), home=runtime_dir() / "redis-secure", secure=True)
        return cls(port=redis_port(), home=runtime_dir() / "redis")

    @property
    def role(self) -> str:
        return "sentinel" if self.sentinel_of else "replica" if self.replica_of else "primary"

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
        return plumbing.read_pid(self.pid_file, "redis-server")

    def is_running(self) -> bool:
        return self.pid() is not None

    def is_healthy(self, timeout: float = 1.0) -> bool:
        """PING answers (a server still loading its AOF answers LOADING, which is not healthy)."""
        if not plumbing.port_open(self.port, timeout=min(timeout, 0.5)):
            return False
        import redis as redis_py  # ~0.5 s to import: only when a server is there to ask

        client = self._client(timeout)
        try:
            return bool(client.ping())
        except redis_py.RedisError:
            return False
        finally:
            client.close()

    def live_role(self) -> str:
        """What the server says it is now: after a failover the replica is the primary."""
        import redis as redis_py

        client = self._client(1.0)
        try:
            if self.sentinel_of:
                host, port = primary_address(client)
                return f"Sentinel; primary {host}:{port}"
            info = client.info("replication") | client.info("persistence")
            role = "primary" if info.get("role") == "master" else f"replica of {info.get('master_port', '?')}"
            replicas = f", {info.get('connected_slaves', 0)} replica(s)" if role == "primary" else ""
            return f"{role}{replicas}, AOF {'on' if info.get('aof_enabled') else 'off'}"
        except redis_py.RedisError as exc:
            return f"role unknown ({exc})"
        finally:
            client.close()

    def _client(self, timeout: float) -> redis_py.Redis:
        import redis as redis_py

        if not self.secure:
            return redis_py.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)
        m = secure.material()
        return redis_py.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout,
            ssl=True, ssl_ca_certs=str(m.ca), username=secure.USER, password=m.redis_password,
        )

    def start(self, timeout: float = 30.0) -> bool:
        """Start redis-server (it daemonizes itself) and wait for PING. False if already healthy."""
        with plumbing.file_lock(self._lock):
            return self._start(timeout)

    def _start(self, timeout: float) -> bool:
        pid = self.pid()
        if pid is None:
            if plumbing.port_open(self.port):
                raise InfraError(f"port {self.port} is taken by a process onceflow did not start")
            self.ensure_installed()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._render_conf()
            self.pid_file.unlink(missing_ok=True)
            sentinel = ["--sentinel"] if self.sentinel_of else []
            res = subprocess.run(
                [self.binary() or "redis-server", str(self.conf_path), *sentinel], capture_output=True, text=True
            )
            if res.returncode != 0:
                why = (res.stdout + res.stderr).strip()
                raise InfraError(f"redis-server refused to start: {why}; see {display_path(self.log_path)}")
        elif self.is_healthy():
            return False
        since = time.monotonic()
        if not plumbing.wait_until(lambda: self._healthy_or_gone(since), timeout, 0.05):
            raise InfraError(
                f"redis did not answer PING on {self.address} within {timeout:.0f}s;"
                f" see {display_path(self.log_path)}"
            )
        return True

    def _healthy_or_gone(self, since: float) -> bool:
        """PING answers. redis-server writes its pid file once its ports are bound, before it
        loads any data: no live pid a few seconds after the start means it died starting (a
        port taken between our check and its bind, a bad config), an error now, not after the
        whole timeout."""
        if self.is_healthy():
            return True
        if self.pid() is None and time.monotonic() - since > _PID_GRACE_S:
            raise InfraError(
                f"redis-server on {self.address} exited while starting; the end of"
                f" {display_path(self.log_path)}:\n{plumbing.tail(self.log_path, 8)}"
            )
        return False

    def _render_conf(self) -> None:
        values: dict[str, object] = {
            "port": self.port, "pid_file": self.pid_file, "log_file": self.log_path, "data_dir": self.data_dir,
            "listen": f"port {self.port}", "security": "",
        }
        if self.secure:
            values |= self._security_values()
        if self.sentinel_of:
            if self.conf_path.exists():
                return  # Sentinel keeps what it learned (the primary after a failover) in it
            values |= {"master_name": SENTINEL_MASTER, "primary_port": self.sentinel_of}
            plumbing.render(infra_dir() / "redis" / "sentinel.conf", self.conf_path, values)
            return
        # A restarted old primary starts as a primary: Sentinel turns it into a replica of the
        # new one as soon as it sees it.
        replication = f"replicaof 127.0.0.1 {self.replica_of}" if self.replica_of else ""
        values |= {"replication": replication, "appendfsync": InfraSettings().redis_appendfsync}
        plumbing.render(infra_dir() / "redis" / "redis.conf", self.conf_path, values)

    def _security_values(self) -> dict[str, object]:
        """TLS on the one port (no plaintext listener) and the default user off: a client
        without the certificate's CA and the ACL user's password is refused."""
        m = secure.material()
        return {
            "listen": f"port 0\ntls-port {self.port}",
            "security": "\n".join([
                "# Secure mode (onceflow_tools.infra.secure).",
                f"tls-cert-file {m.server_cert}", f"tls-key-file {m.server_key}", f"tls-ca-cert-file {m.ca}",
                "tls-auth-clients no",
                "user default off",
                f"user {secure.USER} on >{m.redis_password} ~* &* +@all",
                "# Each service that uses Redis: its own keys only (ADR 0029).",
                *access.redis_acl_lines(m.service_passwords("redis", access.REDIS_KEYS)),
            ]),
        }

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (redis fsyncs the AOF and exits), SIGKILL after ``timeout``. False if not running."""
        with plumbing.file_lock(self._lock):
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        return plumbing.stop_recorded(self.pid_file, "redis-server", timeout)

    def kill(self) -> bool:
        """SIGKILL: at most the last second of writes is lost (appendfsync everysec)."""
        pid = self.pid()
        if pid is None:
            return False
        plumbing.kill_pid(pid)
        return True

    def restart(self, hard: bool = False, timeout: float = 30.0) -> None:
        with plumbing.file_lock(self._lock):
            if hard:
                self.kill()
            else:
                self._stop(timeout)
            self._start(timeout)


def topology(settings: InfraSettings | None = None) -> list[RedisServer]:
    """The servers ``ONCEFLOW_REDIS_TOPOLOGY`` asks for, in start order: the primary alone, or a
    primary, its replica (the next port) and one Sentinel."""
    settings = settings or InfraSettings()
    if settings.secure and settings.redis_topology == "sentinel":
        raise InfraError("secure mode runs one Redis (ONCEFLOW_SECURE with the Sentinel topology is not supported)")
    primary = RedisServer.from_env(secure=settings.secure)
    home = runtime_dir()
    sentinel_set = [
        primary,
        RedisServer(port=primary.port + 1, home=home / "redis-replica", replica_of=primary.port),
        RedisServer(port=sentinel_port(settings), home=home / "redis-sentinel", sentinel_of=primary.port),
    ]
    # Started as a sentinel set once, it stays one for status, logs and down.
    if settings.redis_topology == "sentinel" or sentinel_set[2].is_running():
        return sentinel_set
    return [primary]


def sentinel_of(servers: list[RedisServer]) -> RedisServer | None:
    return next((s for s in servers if s.sentinel_of), None)


def current_primary(servers: list[RedisServer]) -> RedisServer:
    """The server that is primary now: the one Sentinel names (after a failover, the replica)."""
    sentinel = sentinel_of(servers)
    if sentinel is None:
        return servers[0]
    import redis as redis_py

    client = redis_py.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=2.0)
    try:
        _host, port = primary_address(client)
    finally:
        client.close()
    return next(s for s in servers if s.port == port)


def primary_address(sentinel: redis_py.Redis) -> tuple[str, int]:
    """The (host, port) a Sentinel names as the primary. (redis-py types the reply as a pair, None
    or a bool: a bool only when asked with ``return_responses``, None when it knows no primary.)"""
    answer = sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
    if not isinstance(answer, tuple):
        raise InfraError(f"the Sentinel names no primary for {SENTINEL_MASTER!r} ({answer!r})")
    host, port = answer
    return host.decode() if isinstance(host, bytes) else host, int(port)

"""The local PostgreSQL: Debian's ``postgresql`` binaries, a cluster of our own (initdb) under
the runtime home, bound to 127.0.0.1 only, trust auth (a dev stack on loopback, like our Redis).

PostgreSQL refuses to run as root. As root (containers, CI) its server-side commands (initdb,
pg_ctl, the server itself) run as the ``postgres`` OS user Debian's package creates, and the
cluster's directories belong to it; otherwise they run as the current user."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from onceflow.config import CommonSettings
from onceflow_tools.infra import plumbing
from onceflow_tools.infra.paths import display_path, runtime_dir
from onceflow_tools.infra.plumbing import InfraError
from onceflow_tools.infra.settings import postgres_port

# The OS user a root caller runs the server as (Debian's package creates it).
OS_USER = "postgres"
# initdb's superuser: the same name whoever runs it, so provisioning never depends on $USER.
SUPERUSER = "postgres"
DEFAULT_USER = DEFAULT_DATABASE = "onceflow"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# A unix socket's path must fit sockaddr_un (108 bytes with the NUL); longer: TCP only.
_MAX_SOCKET_PATH = 100
# How long the server's other processes get to notice their postmaster died before we SIGKILL
# them: while one lives it holds the old shared memory and a new postmaster refuses to start.
_ORPHAN_GRACE_S = 10.0


@dataclass
class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1:``port``; data, config, socket and log under ``home``."""

    port: int
    home: Path
    user: str = DEFAULT_USER  # the role services log in as (a superuser: it creates schemas)
    database: str = DEFAULT_DATABASE

    @classmethod
    def from_env(cls) -> PostgresServer:
        """The cluster ``ONCEFLOW_POSTGRES_URL`` names (its port, user and database)."""
        parts = urlsplit(CommonSettings().postgres_url)
        user = parts.username or DEFAULT_USER
        database = parts.path.lstrip("/") or DEFAULT_DATABASE
        for what, name in (("user", user), ("database", database)):
            if not _IDENTIFIER.fullmatch(name):
                raise InfraError(f"ONCEFLOW_POSTGRES_URL's {what} {name!r}: want a plain lower-case identifier")
        return cls(port=postgres_port(), home=runtime_dir() / "postgres", user=user, database=database)

    name: ClassVar[str] = "postgres"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def socket_dir(self) -> Path:
        return self.home / "socket"

    @property
    def backup_dir(self) -> Path:
        """Where verify keeps the base backups it rolls back to."""
        return self.home / "backups"

    @property
    def log_path(self) -> Path:
        return self.home / "postgres.log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "postmaster.pid"

    @property
    def _lock(self) -> Path:
        return self.home / ".lock"

    # -- binaries -------------------------------------------------------------------------------

    @staticmethod
    def bin_dir() -> Path | None:
        """The directory of initdb, pg_ctl and postgres: initdb's on PATH (a symlink followed),
        else the newest of Debian's versioned ones. The client tools are taken from it too, so
        they always match the server's version."""
        found = shutil.which("initdb")
        if found and (Path(found).resolve().parent / "pg_ctl").exists():
            return Path(found).resolve().parent
        versions = []
        for candidate in Path("/usr/lib/postgresql").glob("*/bin"):
            if (candidate / "initdb").exists() and candidate.parent.name.isdigit():
                versions.append((int(candidate.parent.name), candidate))
        return max(versions)[1] if versions else None

    def _bin(self, name: str) -> str:
        directory = self.bin_dir()
        if directory is None:
            raise InfraError("PostgreSQL is not installed (onceflow infra up --postgres installs it)")
        return str(directory / name)

    def ensure_installed(self) -> bool:
        """Install Debian's ``postgresql`` package if initdb is missing; True if installed now.
        Its package may start a system cluster on 5432: not ours, left alone."""
        if self.bin_dir() is not None:
            return False
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        res = subprocess.run(install, capture_output=True, text=True, env=env)
        if res.returncode != 0:  # a stale package index: refresh it once and try again
            subprocess.run([*sudo, "apt-get", "update", "-qq"], capture_output=True, text=True, env=env)
            res = subprocess.run(install, capture_output=True, text=True, env=env)
        if res.returncode != 0 or self.bin_dir() is None:
            raise InfraError(f"could not install postgresql:\n{(res.stdout + res.stderr).strip()[-2000:]}")
        return True

    # -- running as the server's user -----------------------------------------------------------

    @staticmethod
    def _as_root() -> bool:
        return os.geteuid() == 0

    def _server_cmd(self, *argv: str) -> list[str]:
        """``argv`` as the user the server runs as: ``postgres`` when we are root."""
        if not self._as_root():
            return list(argv)
        _os_user()
        if shutil.which("runuser"):
            return ["runuser", "-u", OS_USER, "--", *argv]
        return ["setpriv", f"--reuid={OS_USER}", f"--regid={OS_USER}", "--init-groups", "--", *argv]

    def _run_server_cmd(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        # cwd: the home, which the server's user can enter (root's own cwd may not be).
        return subprocess.run(
            self._server_cmd(*argv), capture_output=True, text=True, cwd=self.home, timeout=timeout
        )

    def _own(self, path: Path, recursive: bool = False) -> None:
        """Give ``path`` to the server's user (only when we are root: otherwise it is ours)."""
        if not self._as_root():
            return
        account = _os_user()
        paths: Iterator[Path] = iter([path])
        if recursive:
            paths = (Path(root) / name for root, dirs, files in os.walk(path) for name in ["", *dirs, *files])
        for p in paths:
            os.lchown(p, account.pw_uid, account.pw_gid)

    def _make_traversable(self) -> None:
        """The server's user must reach its home: add search (x, not read) permission for others
        to each parent that lacks it (e.g. a 0700 home directory)."""
        if not self._as_root():
            return
        for parent in self.home.resolve().parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)

    # -- state ----------------------------------------------------------------------------------

    def pid(self) -> int | None:
        """The postmaster's pid (the first line of postmaster.pid) while it runs; None for a
        stale file (a killed server's, or a pid recycled by another program)."""
        try:
            pid = int(self.pid_file.read_text().split("\n", 1)[0].strip())
        except (OSError, ValueError):
            return None
        if pid <= 0 or not plumbing.pid_alive(pid):
            return None
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            return None
        return pid if Path(argv0.decode(errors="replace")).name in ("postgres", "postmaster") else None

    def is_running(self) -> bool:
        return self.pid() is not None

    def is_initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def is_healthy(self, timeout: float = 1.0) -> bool:
        """pg_isready: the server accepts connections to the database (not while it starts,
        recovers from a crash or shuts down)."""
        if self.bin_dir() is None or not plumbing.port_open(self.port, timeout=min(timeout, 0.5)):
            return False
        res = subprocess.run(
            # As initdb's superuser, to its database: both exist before provisioning, so the
            # check never fills the log with "role does not exist".
            [self._bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
             "-d", "postgres", "-t", str(max(1, round(timeout)))],
            capture_output=True, text=True,
        )
        return res.returncode == 0

    def version(self) -> str:
        try:
            return (self.data_dir / "PG_VERSION").read_text().strip()
        except OSError:
            return "?"

    # -- init, start, stop ----------------------------------------------------------------------

    def init(self) -> bool:
        """initdb the cluster if it has none yet (UTF8, C locale, trust on loopback, replication
        included for pg_basebackup) and write its config. True if initdb ran now."""
        with plumbing.file_lock(self._lock):
            return self._init()

    def _init(self) -> bool:
        self.ensure_installed()
        self.home.mkdir(parents=True, exist_ok=True)
        self._make_traversable()
        self._own(self.home)
        created = False
        if not self.is_initialized():
            shutil.rmtree(self.data_dir, ignore_errors=True)  # a half-made one from a failed initdb
            self.data_dir.mkdir(mode=0o700)
            self._own(self.data_dir)
            res = self._run_server_cmd(
                self._bin("initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "-E", "UTF8", "--locale=C",
                "--auth-local=trust", "--auth-host=trust",
            )
            if res.returncode != 0:
                raise InfraError(f"initdb failed:\n{(res.stdout + res.stderr).strip()[-2000:]}")
            created = True
        self._write_config()
        return created

    def _write_config(self) -> None:
        """postgresql.conf and pg_hba.conf, rewritten before each start: the port follows
        ONCEFLOW_POSTGRES_URL, and a restored backup brings its own (older) copies."""
        socket = str(self.socket_dir) if len(str(self.socket_dir / f".s.PGSQL.{self.port}")) <= _MAX_SOCKET_PATH else ""
        if socket:
            self.socket_dir.mkdir(exist_ok=True)
            self._own(self.socket_dir)
        conf = "\n".join([
            "# Written by onceflow (onceflow_tools.infra.postgres) before each start: edits are lost.",
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{socket}'",
            # Committed means on disk: a kill -9 (or a machine crash) loses nothing committed.
            "fsync = on",
            "synchronous_commit = on",
            "full_page_writes = on",
            # pg_basebackup streams WAL over the replication protocol: verify's rollback fault.
            "wal_level = replica",
            "max_wal_senders = 4",
            "max_connections = 100",
            "shared_buffers = 64MB",
            # Messages go to stderr, which pg_ctl -l appends to postgres.log in the home.
            "log_destination = 'stderr'",
            "logging_collector = off",
            "log_line_prefix = '%m [%p] '",
            "log_timezone = 'UTC'",
            "timezone = 'UTC'",
            "",
        ])
        hba = "\n".join([
            "# Written by onceflow: trust, on loopback only (listen_addresses is 127.0.0.1).",
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host all all ::1/128 trust",
            "local replication all trust",
            "host replication all 127.0.0.1/32 trust",
            "host replication all ::1/128 trust",
            "",
        ])
        for name, text in (("postgresql.conf", conf), ("pg_hba.conf", hba)):
            path = self.data_dir / name
            path.write_text(text)
            path.chmod(0o600)
            self._own(path)

    def start(self, timeout: float = 60.0) -> bool:
        """initdb if needed, start the server (pg_ctl -w) and create the role and database.
        False if it was already healthy. After a kill -9 the start includes crash recovery."""
        with plumbing.file_lock(self._lock):
            return self._start(timeout)

    def _start(self, timeout: float) -> bool:
        if self.pid() is not None:
            if self.is_healthy():
                return False
            self._wait_healthy(timeout)  # starting or recovering: wait for it, start nothing
            return False
        if plumbing.port_open(self.port):
            raise InfraError(f"port {self.port} is taken by a process onceflow did not start")
        self._init()
        self._reap_orphans()
        self._clear_stale_locks()
        self.log_path.touch()
        self._own(self.log_path)
        res = self._run_server_cmd(
            self._bin("pg_ctl"), "start", "-w", "-t", str(max(1, round(timeout))), "-D", str(self.data_dir),
            "-l", str(self.log_path), timeout=timeout + 10,
        )
        if res.returncode != 0:
            raise InfraError(
                f"PostgreSQL on {self.address} did not start: {(res.stdout + res.stderr).strip()}; the end of"
                f" {display_path(self.log_path)}:\n{plumbing.tail(self.log_path, 12)}"
            )
        self._wait_healthy(timeout)
        self._provision()
        return True

    def _wait_healthy(self, timeout: float) -> None:
        if not plumbing.wait_until(self.is_healthy, timeout, 0.1):
            raise InfraError(
                f"PostgreSQL on {self.address} did not accept connections within {timeout:.0f}s;"
                f" see {display_path(self.log_path)}"
            )

    def _provision(self) -> None:
        """The role the services log in as and its database, if missing (idempotent)."""
        script = "\n".join([
            f"SELECT 'CREATE ROLE {self.user} LOGIN SUPERUSER' WHERE NOT EXISTS"
            f" (SELECT FROM pg_roles WHERE rolname = '{self.user}')\\gexec",
            f"SELECT 'CREATE DATABASE {self.database} OWNER {self.user}' WHERE NOT EXISTS"
            f" (SELECT FROM pg_database WHERE datname = '{self.database}')\\gexec",
        ])
        res = subprocess.run(
            [self._bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", SUPERUSER, "-d", "postgres"],
            input=script, capture_output=True, text=True, timeout=60,
        )
        if res.returncode != 0:
            raise InfraError(f"could not create role {self.user} and database {self.database}: {res.stderr.strip()}")

    def stop(self, timeout: float = 60.0) -> bool:
        """pg_ctl stop -m fast (sessions end, a clean checkpoint); SIGKILL if it does not finish
        within ``timeout``. False if not running."""
        with plumbing.file_lock(self._lock):
            return self._stop(timeout)

    def _stop(self, timeout: float) -> bool:
        if self.pid() is None:
            return False
        res = self._run_server_cmd(
            self._bin("pg_ctl"), "stop", "-w", "-m", "fast", "-t", str(max(1, round(timeout))), "-D",
            str(self.data_dir), timeout=timeout + 10,
        )
        if res.returncode != 0 and self.pid() is not None:
            self._kill9()
        return True

    def kill9(self) -> bool:
        """SIGKILL of the postmaster, as a crash: nothing is flushed or checkpointed, and the next
        start runs crash recovery from the WAL. False if not running."""
        with plumbing.file_lock(self._lock):
            return self._kill9()

    def _kill9(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        plumbing.kill_pid(pid)
        self._reap_orphans()
        return True

    def _members(self) -> list[int]:
        """The pids of this cluster's processes: every one of them runs in its data directory
        (the postmaster chdirs there and its children inherit it). Orphans a killed postmaster
        left keep that cwd too."""
        data = str(self.data_dir.resolve()) if self.data_dir.exists() else None
        if data is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "cwd") == data:
                        pids.append(int(entry.name))
        return pids

    def _reap_orphans(self) -> None:
        """Wait for the processes of a killed postmaster to exit (each notices its parent's death
        within moments), SIGKILL those that do not: while one lives, it holds the old shared
        memory and a new postmaster refuses to start."""
        if plumbing.wait_until(lambda: not self._members(), _ORPHAN_GRACE_S, 0.05):
            return
        for pid in self._members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not plumbing.wait_until(lambda: not self._members(), _ORPHAN_GRACE_S, 0.05):
            raise InfraError(f"processes of the killed PostgreSQL on {self.address} survive: {self._members()}")

    def _clear_stale_locks(self) -> None:
        """A killed postmaster leaves its pid file and its socket's lock file. PostgreSQL ignores
        those whose pid is gone, but not one whose pid is a zombie its reaper has not collected
        yet (kill(pid, 0) still succeeds there) or a recycled pid. Called with none of the
        cluster's processes left (``_reap_orphans``), so they are stale."""
        self.pid_file.unlink(missing_ok=True)
        if self.socket_dir.is_dir():
            for lock in self.socket_dir.glob(".s.PGSQL.*.lock"):
                lock.unlink(missing_ok=True)

    def restart(self, hard: bool = False, timeout: float = 60.0) -> None:
        with plumbing.file_lock(self._lock):
            if hard:
                self._kill9()
            else:
                self._stop(timeout)
            self._start(timeout)

    # -- backups --------------------------------------------------------------------------------

    def base_backup(self, dest: Path, timeout: float = 120.0) -> Path:
        """pg_basebackup of the running cluster into ``dest`` (plain files, must not exist or be
        empty), its WAL streamed alongside (-X stream) so it is consistent on its own; -c fast:
        an immediate checkpoint rather than waiting for the next one."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            # --no-sync: a backup verify rolls back to within seconds need not reach the disk;
            # it saves a sync of every file on a busy machine.
            [self._bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-D", str(dest),
             "-X", "stream", "-c", "fast", "--no-sync"],
            capture_output=True, text=True, timeout=timeout,
        )
        if res.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            raise InfraError(f"pg_basebackup from {self.address} failed: {(res.stdout + res.stderr).strip()}")
        return dest

    def restore(self, backup: Path, timeout: float = 60.0) -> None:
        """Roll the cluster back to ``backup`` (a ``base_backup``): kill -9 the server, put a copy
        of the backup in place of the data directory, start again. The server replays the
        backup's WAL to its end and runs as a primary from there: every commit after the backup's
        moment is gone, as when a lagging replica is promoted or an older backup is restored."""
        if not (backup / "PG_VERSION").exists():
            raise InfraError(f"{display_path(backup)} is not a PostgreSQL base backup")
        with plumbing.file_lock(self._lock):
            self._kill9()
            # Copied beside it first: a failed copy leaves the old data whole.
            fresh = self.home / "data.restoring"
            shutil.rmtree(fresh, ignore_errors=True)
            shutil.copytree(backup, fresh, symlinks=True)
            self._own(fresh, recursive=True)
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            self._own(self.data_dir)
            # The data directory itself stays (its contents swapped): PostgreSQL keys its System V
            # shared memory on the directory's inode, and a new start then finds and reclaims the
            # killed server's segment instead of leaving one behind per rollback.
            for entry in list(self.data_dir.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            for entry in list(fresh.iterdir()):
                entry.rename(self.data_dir / entry.name)
            fresh.rmdir()
            self._start(timeout)


def _os_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(OS_USER)
    except KeyError:
        raise InfraError(
            f"PostgreSQL refuses to run as root and there is no {OS_USER!r} OS user to run it as"
            " (Debian's postgresql package creates it; or run onceflow as another user)"
        ) from None


def ensure_running(timeout: float = 60.0) -> PostgresServer:
    """The cluster ``ONCEFLOW_POSTGRES_URL`` names, installed, initialised and started if it is
    not (idempotent: on a healthy one only a check). What `infra up --postgres`, tests and verify call."""
    server = PostgresServer.from_env()
    server.start(timeout)
    return server


"""The fault schedule of a verify campaign: every ``every_s`` seconds one fault, of a kind and
on a service drawn from a seeded RNG. The first faults are one of each enabled kind (so a short
campaign still injects every kind), the rest are drawn at random.

Kinds: ``kill9`` (a random service, restarted on the spot), ``crash_in_txn`` (a random service
on the shared loop is restarted armed to kill -9 itself between producing a transaction's outputs
and committing it, the gap where a broken protocol loses or doubles data), ``zombie`` (a random service but
ingest: paused, replaced, resumed), ``broker`` (the Kafka broker, or one node of a cluster,
restarts, gracefully or by SIGKILL in turn; a lone broker with the services frozen while it goes
down, see ``restart_lone_broker``); on a 3-node cluster, faults aimed by ``kafka_faults``:
``leader-kill9`` (the leader of one of the run's partitions), ``coordinator-kill9`` (the
transaction coordinator of a live service's transactional.id), ``controller-kill9`` (the active
KRaft controller), each restarted at once, ``broker-pause`` (SIGSTOP for 20-40 s, then SIGCONT),
``rolling-restart`` (each node gracefully, waiting for full replication in between) and
``min-isr`` (two nodes down for a few seconds: producers must wait, nothing committed may be lost); and what Redis can do to the state it holds (``redis_faults``):
``redis-kill9`` (SIGKILL of redis-server, then a restart from its AOF), ``redis-rollback``
(a snapshot of every key of the run, and a few seconds later all of them put back to it
atomically, as a failover to a lagging replica does) and ``redis-flush`` (every key of the run
gone), and with the Sentinel topology ``redis-failover`` (kill -9 of the primary, Sentinel
promotes the replica, the old primary rejoins as a replica); with the Kafka source
(``onceflow verify --source``) ``recreate-source-topic`` (the user topic deleted and created
again under its name once the source copied it, ``source_mode.SourceTopic.recreate``); with the
sink's tables in PostgreSQL (``sink_store="postgres"``, ``postgres_faults``) ``postgres-kill``
(kill -9 of the server, restarted with crash recovery) and ``postgres-rollback`` (an older base
backup restored: one is taken at the first fault and again after each rollback). After each fault the campaign re-sends batches from before it (``on_fault``), so a lost
dedup id shows. Client retries are not scheduled: the clients re-send a share of their batches
all along."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from onceflow.config import CommonSettings
from onceflow.redis_client import connect
from onceflow_tools.infra.kafka import cluster as kafka_cluster
from onceflow_tools.infra.postgres import PostgresServer
from onceflow_tools.infra.redis import RedisServer, current_primary, sentinel_of
from onceflow_tools.infra.redis import topology as redis_topology
from onceflow_tools.process import restart_lone_broker
from onceflow_tools.verify import kafka_faults, postgres_faults, redis_faults, spark_faults
from onceflow_tools.verify.kafka_faults import CLUSTER_KINDS
from onceflow_tools.verify.spark_faults import SPARK_KINDS
from onceflow_tools.verify.source_mode import SourceTopic
from onceflow_tools.verify.supervisor import ZOMBIE_SERVICES, Supervisor

log = logging.getLogger(__name__)

KINDS = (
    "kill9", "crash_in_txn", "zombie", "broker", "clock-skew", *CLUSTER_KINDS, *SPARK_KINDS,
    "redis-kill9", "redis-rollback", "redis-flush", "redis-failover", "recreate-source-topic",
    "postgres-kill", "postgres-rollback",
)
SOURCE_KINDS = ("recreate-source-topic",)  # only with the Kafka source (``onceflow verify --source``)
POSTGRES_KINDS = ("postgres-kill", "postgres-rollback")  # only with the sink's tables in PostgreSQL
REDIS_KINDS = tuple(kind for kind in KINDS if kind.startswith("redis-"))


def available_kinds(source: bool = False, sink_store: str = "redis") -> tuple[str, ...]:
    """Every kind the running stack can take: a failover needs the Sentinel topology, the
    targeted broker faults a cluster, a recreated source topic the Kafka source (``source``),
    the PostgreSQL faults a sink that keeps its tables there (``sink_store``)."""
    missing = set() if source else set(SOURCE_KINDS)
    if sink_store != "postgres":
        missing.update(POSTGRES_KINDS)
    if sentinel_of(redis_topology()) is None:
        missing.add("redis-failover")
    if len(kafka_cluster()) < 3:
        missing.update(CLUSTER_KINDS)
    if not spark_faults.available():
        missing.update(SPARK_KINDS)
    return tuple(kind for kind in KINDS if kind not in missing)


def _primary_or_none(servers: list[RedisServer]) -> RedisServer | None:
    try:
        return current_primary(servers)
    except Exception:  # noqa: BLE001 - Sentinel answering nothing yet mid-failover
        return None
LOOP_SERVICES = ("acker", "dedup", "compute")


class FaultSchedule(threading.Thread):
    def __init__(
        self,
        supervisor: Supervisor,
        kinds: Sequence[str],
        every_s: float,
        seed: int,
        takeover_s: float,
        on_fault: Callable[[str], None] = lambda _note: None,
        source: SourceTopic | None = None,
        sink_store: str = "redis",
        focus: Sequence[str] = (),
    ) -> None:
        """``focus``: services under test (a sink beyond Redis): the first kill -9 and the
        first zombie of the run hit them, one each in turn, before the draw goes random."""
        super().__init__(name="faults", daemon=True)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        self.supervisor = supervisor
        self.kinds = list(kinds)
        self.every_s = every_s
        self.rng = random.Random(seed)
        self.takeover_s = takeover_s
        self.on_fault = on_fault
        self.source = source
        if source is None and set(kinds) & set(SOURCE_KINDS):
            raise ValueError(f"{', '.join(SOURCE_KINDS)} need the Kafka source (onceflow verify --source)")
        # The PostgreSQL faults' base backup, kept under the server's home (postgres_faults).
        self._pg_backups: postgres_faults.Backups | None = None
        if set(kinds) & set(POSTGRES_KINDS):
            if sink_store != "postgres":
                raise ValueError(f"{', '.join(POSTGRES_KINDS)} need the sink's tables in PostgreSQL (sink_store='postgres')")
            self._pg_backups = postgres_faults.Backups(PostgresServer.from_env(), supervisor.prefix)
        # The zombies in the other order, so two services under test each get one of both first.
        self._focus = {"kill9": list(focus), "zombie": [name for name in reversed(focus) if name in ZOMBIE_SERVICES]}
        self.injected: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._hard_broker = True  # toggled before each restart: graceful first

    def stop(self) -> None:
        """Stop once every kind has been injected at least once."""
        self._halt.set()

    def run(self) -> None:
        first = self.rng.sample(self.kinds, len(self.kinds))
        try:
            while True:
                time.sleep(self.every_s)  # faults keep their spacing, after a stop() too
                if self._halt.is_set() and not first:
                    return
                if self._pg_backups is not None and self._pg_backups.latest is None:
                    self._pg_backups.take()  # what a later postgres-rollback goes back to
                kind = first.pop(0) if first else self.rng.choice(self.kinds)
                self.on_fault(self._inject(kind))
                self.injected[kind] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the campaign
            log.exception("fault schedule failed")
            self.error = exc
        finally:
            if self._pg_backups is not None:
                self._pg_backups.discard()

    def _failover(self, servers: list[RedisServer], started: float) -> str:
        """kill -9 of the primary; Sentinel promotes the replica (whatever it had not yet received
        is lost: replication is asynchronous); the old primary then restarts and Sentinel makes it
        the new primary's replica."""
        old = current_primary(servers)
        old.kill()
        deadline = time.monotonic() + 60
        while (new := _primary_or_none(servers)) is None or new.port == old.port:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Sentinel promoted no replica within 60 s of killing the primary {old.port}")
            time.sleep(0.2)
        promoted_s = time.monotonic() - started
        old.start()
        return f"redis failover: primary {old.port} killed, {new.port} promoted after {promoted_s:.0f} s, {old.port} rejoined"

    def _postgres(self, kind: str) -> str:
        backups = self._pg_backups
        assert backups is not None and backups.latest is not None  # set up in __init__, taken in run()
        if kind == "postgres-kill":
            return postgres_faults.crash(backups.server)
        # A backup only just taken (the first fault) would lose nothing: let writes go on first,
        # and until the sink applied something after it.
        time.sleep(max(0.0, max(2.0, self.every_s / 2) - backups.age_s()))
        wrote = backups.wait_for_writes()
        age_s = backups.age_s()
        note = postgres_faults.rollback(backups.server, backups.latest)
        if not wrote:
            note += " (the sink applied nothing since the backup within 60 s: nothing was lost)"
        backups.take()  # the next rollback goes back to a moment after this one
        return f"{note}, {age_s:.0f} s back"

    def _victim(self, kind: str, services: Sequence[str]) -> str:
        focus = self._focus[kind]
        return focus.pop(0) if focus else self.rng.choice(services)

    def _inject(self, kind: str) -> str:
        started = time.monotonic()
        if kind == "kill9":
            name = self._victim(kind, self.supervisor.services)
            self.supervisor.kill9(name)
            return f"kill -9 {name}"
        if kind == "crash_in_txn":
            name, hit = self.rng.choice(LOOP_SERVICES), self.rng.randint(1, 3)
            self.supervisor.kill9(name, fault=f"after_produce@{hit}")
            return f"kill -9 {name}, restarted to crash between produce and commit of its transaction #{hit}"
        if kind == "zombie":
            name = self._victim(kind, [s for s in self.supervisor.services if s in ZOMBIE_SERVICES])
            outcome = self.supervisor.zombie(name, self.takeover_s)
            return f"zombie {name}: replaced, resumed, exited {outcome.exit_code} ({time.monotonic() - started:.0f} s)"
        if kind == "clock-skew":
            # Ingest's host clock 10 min to 2 h off, either way: the ingest_time it writes, and
            # the gate's horizon if that followed writers' clocks (docs/decisions/0022).
            skew_ms = self.rng.choice((-1, 1)) * self.rng.randint(10 * 60_000, 2 * 3_600_000)
            self.supervisor.skew_clock("ingest", skew_ms)
            return f"ingest restarted on a clock {skew_ms / 60_000:+.0f} min off"
        if kind == "broker":
            self._hard_broker = not self._hard_broker
            nodes = kafka_cluster()
            node = self.rng.choice(nodes)  # on a cluster: one node, the leader of some partitions
            how = "SIGKILL" if self._hard_broker else "graceful"
            if len(nodes) == 1:  # the services frozen while it goes down: see restart_lone_broker
                restart_lone_broker(node, self.supervisor.processes(), hard=self._hard_broker)
                how += ", services frozen while it went down"
            else:
                node.restart(hard=self._hard_broker)
            return f"{node.name} restart ({how}, {time.monotonic() - started:.0f} s)"
        if kind == "recreate-source-topic":
            assert self.source is not None  # checked in __init__
            return self.source.recreate(lambda: self.supervisor.kill9("source"))
        if kind in CLUSTER_KINDS:
            return kafka_faults.inject(kind, self.rng, self.supervisor.prefix)
        if kind in SPARK_KINDS:
            return spark_faults.inject(kind, self.rng)
        if kind in POSTGRES_KINDS:
            return self._postgres(kind)
        servers = redis_topology()
        if kind == "redis-kill9":
            primary = current_primary(servers)
            primary.restart(hard=True)
            return f"redis kill -9 of the primary ({primary.port}) and restart ({time.monotonic() - started:.0f} s)"
        if kind == "redis-failover":
            return self._failover(servers, started)
        client = connect(CommonSettings().redis_url)
        try:
            if kind == "redis-flush":
                return f"redis flush of the run's keys ({redis_faults.flush(client, self.supervisor.prefix)} keys)"
            saved = redis_faults.snapshot(client, self.supervisor.prefix)
            time.sleep(max(2.0, self.every_s / 2))  # writes go on meanwhile: these are what is lost
            replaced = redis_faults.roll_back(client, self.supervisor.prefix, saved)
            return f"redis rollback of {replaced} keys to a snapshot {time.monotonic() - started:.0f} s old"
        finally:
            client.close()

"""The sink follows ``jobs.registry`` (onceflow.versions, docs/services/sink.md#job-versions):
which version of each job readers see, and which versions are gone.

A version runs as a job of its own name (``orders@2``) and the sink writes its rows to its own
table like any job's. What only the sink can do is point the job's plain name at the live one
and drop what a retired one left, because it owns the tables:

- per job with a live version, the alias ``onceflow:{<prefix>sink}:alias:<job>`` (table, and the
  registry offset that said so) through a script that never moves it back to an older offset
  (``tables.py``), so a sink resumed from a SIGSTOP with an old view of the registry, or a
  second sink instance behind the first, cannot undo a promotion;
- per retired version, its table and table meta deleted; the worker skips its changes from
  then on (``retired()``), still acking their anchors so the trees behind them complete.

Redis holds what Kafka can rebuild: all of it is written again every ``REFRESH_S``, so a Redis
that lost writes, or was replaced, heals without a registry change. Redis errors are logged and
left to the next round; they never stop the sink.

``RegistryView`` is the pure part (the records folded); ``RegistryFollower`` the thread around it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.records import offset_of
from onceflow.kafka.registry import registry_topic
from onceflow.state.store import StoreUnavailable
from onceflow.topology import check_job_name, versioned
from onceflow.versions import JobRecord, VersionState

from onceflow.state.result_store import ResultStore

log = logging.getLogger(__name__)

# Everything written again this often, whether the registry changed or not.
REFRESH_S = 5.0
# How long the sink's start waits for the registry to be read through (so a sink that starts
# by replaying compute.results skips retired versions from its first batch); then it goes on.
READY_TIMEOUT_S = 10.0
# The reader's longest wait per poll: how quickly stop() is seen.
POLL_S = 0.5
POLL_RECORDS = 500


@dataclass(frozen=True)
class Alias:
    job: str
    table: str  # the live version's table; '' : none (the job's record was deleted)
    offset: int  # the registry offset of the record it comes from


class RegistryView:
    """The registry folded: each job's last record and the offset it came from."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[JobRecord | None, int]] = {}
        self.offset = -1  # the last registry offset taken

    def take(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        """One registry record (``value`` None: a tombstone, the job left the registry). A
        record that is not a job's changes nothing: ``ValueError`` with the reason."""
        self.offset = max(self.offset, offset)
        try:
            job = check_job_name((key or b"").decode())
        except ValueError as exc:  # UnicodeDecodeError included
            raise ValueError(f"key {key!r}: {exc}") from None
        if value is None:
            self._records[job] = (None, offset)
            return
        try:
            record = JobRecord.decode(value)
        except (ValueError, KeyError, TypeError) as exc:  # JSON, a field missing, an unknown one
            raise ValueError(f"job {job!r}: not a JobRecord ({type(exc).__name__}: {exc})") from None
        if record.job != job:
            raise ValueError(f"key {job!r} holds the record of job {record.job!r}")
        self._records[job] = (record, offset)

    def aliases(self) -> list[Alias]:
        """An alias per job with a live version, and a cleared one per deleted job."""
        out = []
        for job, (record, offset) in sorted(self._records.items()):
            if record is None:
                out.append(Alias(job, "", offset))
            elif record.live:
                out.append(Alias(job, record.live_name, offset))
        return out

    def retired(self) -> frozenset[str]:
        """The retired versions' names: ``orders@1``, ..."""
        return frozenset(
            versioned(job, number)
            for job, (record, _offset) in self._records.items()
            if record is not None
            for number, version in record.versions.items()
            if version.state is VersionState.RETIRED
        )


class RegistryFollower:
    """A daemon thread: ``jobs.registry`` (read_committed, group-less, from its start) into the
    aliases and the retired tables in Redis."""

    def __init__(self, common: CommonSettings, tables: ResultStore, refresh_s: float = REFRESH_S) -> None:
        self._common = common
        self._tables = tables
        self._topic = registry_topic(common)
        self._refresh_s = refresh_s
        self._view = RegistryView()
        self._retired: frozenset[str] = frozenset()
        self._ready = threading.Event()  # read through once, or found missing
        self._stopping = threading.Event()
        self._following = False  # assigned to the registry (it exists)
        self._end = 0  # the registry's end when the reader was assigned: read through once there
        self._missing = False  # the topic did not exist at the last look
        self._redis_trouble = ""  # the error class of the current run of failed rounds
        self._thread = threading.Thread(target=self._run, name="registry-follower", daemon=True)

    # -- for the service and the worker --------------------------------------------------------

    def retired(self) -> frozenset[str]:
        return self._retired

    @property
    def offset(self) -> int:
        """The last registry offset read (-1: none yet)."""
        return self._view.offset

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Whether the registry was read through (or found missing) within ``timeout_s``."""
        if self._ready.wait(timeout_s):
            return True
        log.warning("sink: %s not read through within %.0fs; starting anyway (retired versions are skipped once it is)",
                    self._topic, timeout_s)
        return False

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        reader = clients.reader(self._common, **{"fetch.wait.max.ms": int(POLL_S * 1000)})
        next_round = 0.0
        try:
            while not self._stopping.is_set():
                try:
                    if not self._following and time.monotonic() >= next_round:
                        self._follow(reader)
                    changed = self._poll(reader) if self._following else False
                    if changed or time.monotonic() >= next_round:
                        self._write()
                        next_round = time.monotonic() + self._refresh_s
                    if not self._following:
                        self._stopping.wait(max(0.0, next_round - time.monotonic()))
                except KafkaException as exc:  # the broker unreachable or restarting: the client reconnects
                    log.warning("sink: %s: %s; retrying in %.0fs", self._topic, exc, self._refresh_s)
                    self._stopping.wait(self._refresh_s)
                except Exception:  # noqa: BLE001 - a bug here must not stop the sink; the next round retries
                    log.exception("sink: following %s failed; retrying in %.0fs", self._topic, self._refresh_s)
                    self._stopping.wait(self._refresh_s)
        finally:
            reader.close()

    def _follow(self, reader: Consumer) -> None:
        """Read the registry from its start, if it exists. A stack from before job versions has
        none: say so once, let every job read its plain table, and look again each round.

        Its ends are asked first: that also connects the reader (a bare assign from
        OFFSET_BEGINNING took 0.5 s to a first record), and the registry counts as read through
        once the reader's position reaches the end it had (an end of partition comes only a
        fetch wait later, and never while a registry transaction is open)."""
        metadata = reader.list_topics(self._topic, timeout=5)
        topic = metadata.topics.get(self._topic)
        if topic is None or (topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            if not self._missing:
                log.warning("sink: no topic %s (a stack from before job versions? `onceflow infra topics` creates "
                            "it); every job reads its plain table; looking again every %.0fs", self._topic, self._refresh_s)
            self._missing = True
            self._ready.set()  # nothing to wait for
            return
        low, high = reader.get_watermark_offsets(TopicPartition(self._topic, 0), timeout=5, cached=False)
        if self._missing:
            log.info("sink: %s exists now; following it", self._topic)
        self._missing = False
        reader.assign([TopicPartition(self._topic, 0, low)])
        self._following, self._end = True, high
        if high <= low:
            self._read_through()

    def _read_through(self) -> None:
        if not self._ready.is_set():
            log.info("sink: %s read through offset %d: %d alias(es), %d retired version(s)",
                     self._topic, self._view.offset, len(self._view.aliases()), len(self._retired))
        self._ready.set()

    def _poll(self, reader: Consumer) -> bool:
        """Take what the reader holds; True if a record changed the view."""
        changed = at_end = False
        for message in clients.consume_ready(reader, POLL_RECORDS, POLL_S):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end = True
                else:
                    log.warning("sink: %s: %s", self._topic, error)
                continue
            try:
                self._view.take(message.key(), message.value(), offset_of(message))
            except ValueError as exc:
                log.warning("sink: %s offset %d ignored: %s", self._topic, offset_of(message), exc)
                continue
            changed = True
        if changed:
            # Before the tables are dropped (and before the start goes on, once read through): the
            # worker stops applying a version, then its table goes.
            self._retired = self._view.retired()
        if at_end or (not self._ready.is_set() and reader.position([TopicPartition(self._topic, 0)])[0].offset >= self._end):
            self._read_through()
        return changed

    def _write(self) -> None:
        """Every alias and every retired table, as the view stands; a Redis error is logged
        (once per kind in a row) and left to the next round."""
        try:
            for alias in self._view.aliases():
                if not self._tables.set_alias(alias.job, alias.table, alias.offset):
                    log.debug("sink: alias %s: Redis holds a newer registry record than offset %d", alias.job, alias.offset)
            for table in sorted(self._retired):
                self._tables.drop_table(table)
        except (redis.RedisError, StoreUnavailable) as exc:
            kind = type(exc).__name__
            if kind != self._redis_trouble:
                log.warning("sink: aliases not written: Redis %s (%s); retrying every %.0fs",
                            kind, str(exc).splitlines()[0][:200] if str(exc) else "", self._refresh_s)
            self._redis_trouble = kind
            return
        if self._redis_trouble:
            log.info("sink: aliases written again after Redis %s", self._redis_trouble)
            self._redis_trouble = ""

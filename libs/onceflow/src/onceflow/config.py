"""The one config loader. Every setting is an env var; every service adds its own prefix.

Common settings use ``ONCEFLOW_`` (``ONCEFLOW_KAFKA_BOOTSTRAP``, ``ONCEFLOW_TOPIC_PREFIX``, ...).
A service's own settings use ``ONCEFLOW_<SERVICE>_`` and embed the common ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow.redis_urls import parse_sentinel_url
from onceflow.topology import LOCALHOST, Hop, Service, hops_of


def repo_root() -> Path:
    """The checkout this code runs from (where infra/ and proto/ live)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "infra" / "topics.toml").exists():
            return parent
    return Path.cwd()


def runtime_dir() -> Path:
    """Jars, data, logs and pid files of the local stack, and the services' local caches
    (``<repo>/.onceflow``, gitignored; ``ONCEFLOW_HOME`` overrides)."""
    home = os.environ.get("ONCEFLOW_HOME")
    return Path(home).expanduser().resolve() if home else repo_root() / ".onceflow"


def secret(value: str, file: str, name: str) -> str:
    """A secret from its file (preferred: not visible in ``ps`` or the environment) or its
    value; ValueError naming ``name``_FILE if the file cannot give one."""
    if not file:
        return value
    try:
        token = Path(file).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{name}_FILE {file}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"{name}_FILE {file} is empty")
    return token


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    kafka_bootstrap: str = Field(
        default="127.0.0.1:19092", description="The Kafka brokers every client starts from (`host:port`, comma-separated)."
    )
    # "none" is the default because librdkafka's "rebootstrap" can leave an in-flight
    # send_offsets_to_transaction blocked past its timeout when the only broker restarts
    # (librdkafka #5511, #5456).
    kafka_metadata_recovery: Literal["none", "rebootstrap"] = Field(
        default="none",
        description="librdkafka's metadata recovery. `none`: keep reconnecting to the brokers it knows (the single "
        "local broker). `rebootstrap`: find the cluster again from the bootstrap list, for a cluster whose brokers "
        "can all be replaced.",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="How every Kafka client (services, CLI, infra checks) talks to the brokers: `PLAINTEXT` (for "
        "loopback only), `SSL` (TLS; with a client certificate, mutual TLS) or `SASL_SSL` (a SCRAM user over TLS).",
    )
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = Field(
        default="SCRAM-SHA-512", description="The SCRAM mechanism of `SASL_SSL`."
    )
    kafka_sasl_username: str = Field(default="", description="The SCRAM user of `SASL_SSL`.")
    kafka_sasl_password: str = Field(
        default="", description="The SCRAM user's password; the `_FILE` form is preferred and wins."
    )
    kafka_sasl_password_file: str = Field(
        default="",
        description="A file holding the SCRAM user's password: it keeps the password out of `ps` and the environment.",
    )
    kafka_ssl_ca_file: str = Field(
        default="", description="The CA that signed the brokers' certificates (PEM); empty: the system's."
    )
    kafka_ssl_cert_file: str = Field(
        default="", description="A client certificate (PEM) for mutual TLS with the brokers; set its key too."
    )
    kafka_ssl_key_file: str = Field(default="", description="The client certificate's private key (PEM).")
    redis_url: str = Field(
        default="redis://127.0.0.1:16379/0",
        description="Where Redis is: `redis://`, `rediss://` (TLS), `unix://`, or `redis+sentinel://host:port/onceflow/0`, "
        "which follows a Sentinel failover (docs/redis.md). An ACL user goes in the URL "
        "(`rediss://onceflow@host:port/0`), its password in `ONCEFLOW_REDIS_PASSWORD(_FILE)`, not in the URL.",
    )
    redis_password: str = Field(
        default="", description="The Redis ACL user's password; the `_FILE` form is preferred and wins."
    )
    redis_password_file: str = Field(
        default="", description="A file holding the Redis password: it keeps it out of `ps` and the environment."
    )
    redis_ssl_ca_file: str = Field(
        default="", description="The CA that signed the Redis server's certificate (`rediss://`); empty: the system's."
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        description="After each write to a Redis store, `WAIT` until this many replicas have it (0: don't wait). It "
        "narrows what a failover can lose; what it still loses, the stores' continuity check catches and rebuilds "
        "from Kafka (docs/redis.md).",
    )
    redis_wait_timeout_ms: int = Field(
        default=1000, ge=0, description="The longest such `WAIT`; a shortfall is logged, not fatal."
    )
    redis_socket_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long a Redis command may go unanswered. A stalled Redis (stopped, swapping, behind a "
        "partition) then fails the command, and the service turns NOT_SERVING and retries, instead of hanging "
        "its loop and its Query calls while it says SERVING (docs/redis.md). Longer than "
        "`ONCEFLOW_REDIS_WAIT_TIMEOUT_MS`.",
    )
    postgres_url: str = Field(
        default="postgresql://onceflow@127.0.0.1:15432/onceflow",
        description="Where PostgreSQL is, for a sink that keeps its tables there: a libpq `postgresql://` URL. "
        "`onceflow infra up --postgres` starts a local cluster on its port (docs/postgres.md).",
    )
    topic_prefix: str = Field(
        default="",
        description="Prepended to every topic name (and consumer group, transactional id and Redis key), so several "
        "pipelines, or tests, share one broker.",
    )
    event_time_max_ahead_ms: int = Field(
        default=3_600_000,
        ge=1_000,
        description="How far a record's event time may be ahead of the clock that takes it in. One record from the "
        "future would hold every windowed job's watermark there, and every later record would be late: ingest "
        "refuses it against its own clock (INVALID_ARGUMENT naming `event_time_ms`); compute's map hop dead-letters "
        "it without moving event time, against the broker's clock (the Kafka source's records, a payload's time "
        "column). Default 1 hour.",
    )
    history_retention_ms: int = Field(
        default=604_800_000,
        ge=-1,
        description="How long `dedup.records` keeps records, which is how far back a job version can rebuild its table "
        "(`onceflow job deploy --from`, `job reprocess`). -1: forever, at the cost of disk for every record the gate "
        "ever passed (docs/jobs.md#how-far-back). `onceflow infra topics` and `infra up` apply it, to a topic that "
        "exists too. Default 7 days.",
    )
    transaction_timeout_ms: int = Field(
        default=4_000,
        ge=1000,
        description="Kafka's `transaction.timeout.ms`: how long a killed producer's open transaction can hold readers "
        "back, and the longest a transaction may stay open (one holds only the batch's writes and its commit). A "
        "consuming service refuses to start unless it is below `ONCEFLOW_LOOP_SESSION_TIMEOUT_MS` by a heartbeat "
        "interval (a fifth of the session), so that a zombie's transaction has ended before its partitions move "
        "(docs/decisions/0021-takeover-order.md). The broker caps it at `transaction.max.timeout.ms`.",
    )
    admin_token: str = Field(
        default="",
        description="Bearer token for mutating admin calls (Pause, Resume, Drain, ...); empty: they are refused. The "
        "`_FILE` form is preferred and wins.",
    )
    admin_token_file: str = Field(
        default="", description="A file holding the admin token: it keeps it out of `ps` and the environment."
    )
    read_token: str = Field(
        default="",
        description="Bearer token for read calls (Status, stats, lookups, Query, reflection); empty: reads are open, "
        "fine on loopback. Set it before binding beyond (docs/admin.md, Threat model).",
    )
    read_token_file: str = Field(
        default="", description="A file holding the read token: it keeps it out of `ps` and the environment."
    )
    tls_cert_file: str = Field(
        default="",
        description="The certificate chain (PEM) for TLS on the service's gRPC port, with its key; both empty: "
        "plaintext, fine on loopback (docs/admin.md).",
    )
    tls_key_file: str = Field(default="", description="The private key (PEM) of `ONCEFLOW_TLS_CERT_FILE`.")
    tls_client_ca_file: str = Field(
        default="",
        description="With it, the gRPC port also requires client certificates signed by this CA (mutual TLS).",
    )
    log_level: str = Field(
        default="INFO", description="The least severe level logged: `DEBUG`, `INFO`, `WARNING` or `ERROR`."
    )
    processing_guarantee: Literal["exactly_once", "at_least_once"] = Field(
        default="exactly_once",
        description="`exactly_once`: every hop commits offsets, state and outputs in one Kafka transaction. "
        "`at_least_once`: the same pipeline without transactions (outputs flushed, then offsets committed: a crash "
        "re-sends a batch), to measure what exactly-once costs; a test-only switch, refused without "
        "`ONCEFLOW_ALLOW_TEST_SWITCHES=1` (docs/decisions/0010).",
    )

    @model_validator(mode="after")
    def _redis_waits_within_the_socket_timeout(self) -> CommonSettings:
        # A WAIT as long as the socket timeout would fail every store write as a stalled Redis.
        if self.redis_socket_timeout_s * 1000 <= self.redis_wait_timeout_ms:
            raise ValueError("ONCEFLOW_REDIS_SOCKET_TIMEOUT_S must be longer than ONCEFLOW_REDIS_WAIT_TIMEOUT_MS")
        return self

    @model_validator(mode="after")
    def _tls_is_complete(self) -> CommonSettings:
        # A half-configured TLS setup must fail at startup, not fall back to plaintext.
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("set both ONCEFLOW_TLS_CERT_FILE and ONCEFLOW_TLS_KEY_FILE, or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("ONCEFLOW_TLS_CLIENT_CA_FILE needs ONCEFLOW_TLS_CERT_FILE and ONCEFLOW_TLS_KEY_FILE")
        return self

    @model_validator(mode="after")
    def _token_files_are_readable(self) -> CommonSettings:
        secret(self.admin_token, self.admin_token_file, "ONCEFLOW_ADMIN_TOKEN")
        secret(self.read_token, self.read_token_file, "ONCEFLOW_READ_TOKEN")
        secret(self.kafka_sasl_password, self.kafka_sasl_password_file, "ONCEFLOW_KAFKA_SASL_PASSWORD")
        secret(self.redis_password, self.redis_password_file, "ONCEFLOW_REDIS_PASSWORD")
        return self

    @model_validator(mode="after")
    def _kafka_security_is_complete(self) -> CommonSettings:
        # Half a security setup must fail at startup, not connect in plaintext or hang in a handshake.
        protocol = self.kafka_security_protocol
        if protocol == "SASL_SSL" and not (self.kafka_sasl_username and (self.kafka_sasl_password or self.kafka_sasl_password_file)):
            raise ValueError("ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs ONCEFLOW_KAFKA_SASL_USERNAME and ONCEFLOW_KAFKA_SASL_PASSWORD(_FILE)")
        if bool(self.kafka_ssl_cert_file) != bool(self.kafka_ssl_key_file):
            raise ValueError("set both ONCEFLOW_KAFKA_SSL_CERT_FILE and ONCEFLOW_KAFKA_SSL_KEY_FILE, or neither")
        if protocol == "PLAINTEXT" and (self.kafka_sasl_username or self.kafka_ssl_ca_file or self.kafka_ssl_cert_file):
            raise ValueError("Kafka credentials or certificates are set but ONCEFLOW_KAFKA_SECURITY_PROTOCOL is PLAINTEXT")
        return self

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka's security settings for every client: services, CLI and infra checks."""
        config = {"security.protocol": self.kafka_security_protocol.lower()}
        if self.kafka_security_protocol == "SASL_SSL":
            config |= {
                "sasl.mechanisms": self.kafka_sasl_mechanism, "sasl.username": self.kafka_sasl_username,
                "sasl.password": secret(self.kafka_sasl_password, self.kafka_sasl_password_file, "ONCEFLOW_KAFKA_SASL_PASSWORD"),
            }
        if self.kafka_ssl_ca_file:
            config["ssl.ca.location"] = self.kafka_ssl_ca_file
        if self.kafka_ssl_cert_file:
            config |= {"ssl.certificate.location": self.kafka_ssl_cert_file, "ssl.key.location": self.kafka_ssl_key_file}
        return config

    @model_validator(mode="after")
    def _redis_url_is_usable(self) -> CommonSettings:
        # A typo in the URL must fail at startup with the reason, not at the first record.
        scheme = self.redis_url.split("://", 1)[0] if "://" in self.redis_url else ""
        if scheme == "redis+sentinel":
            parse_sentinel_url(self.redis_url)
        elif scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"ONCEFLOW_REDIS_URL {self.redis_url!r}: want redis://, rediss://, unix:// or redis+sentinel://"
            )
        return self

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"


class LoopSettings(BaseSettings):
    """How the shared transactional loop batches (ONCEFLOW_LOOP_*)."""

    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_LOOP_", extra="ignore")

    max_batch_records: int = Field(
        default=1000, ge=1, description="The most records one poll takes into a batch, and so into one transaction."
    )
    min_batch_records: int = Field(
        default=0,
        ge=0,
        description="Below `ONCEFLOW_LOOP_MAX_BATCH_RECORDS` the batch bound adapts between the two: it doubles after a "
        "full batch and halves after one under a quarter full. 0: fixed at the maximum.",
    )
    max_batch_ms: int = Field(
        default=100,
        ge=1,
        description="The longest an idle hop waits in one poll for a first record (pause and stop are seen within it).",
    )
    linger_ms: int = Field(
        default=5, ge=0, description="After a first record: how long a hop waits for more before it commits what it has."
    )
    min_cycle_ms: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="Under load (records already waiting when a batch begins), the least time from one batch's start to "
        "the next's: the batch takes records for that long unless its bound fills first. At most one batch per cycle, "
        "so for a hop whose per-batch cost or output does not shrink with the batch. 0: off. Consumer hops only (not "
        "ingest's group commit).",
    )
    session_timeout_ms: int = Field(
        default=10_000,
        ge=1000,
        description="The consumer's `session.timeout.ms`: a member of the group silent this long loses its partitions. "
        "The consumer heartbeats every fifth of it, and `ONCEFLOW_TRANSACTION_TIMEOUT_MS` must stay below it by one "
        "such interval.",
    )
    punctuate_ms: int = Field(
        default=1000,
        ge=10,
        description="How often a stage's `punctuate()` runs (timeouts, sweeps), in processing time.",
    )
    commit_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Bound on one commit or abort call; past it the call is made again, which resumes it, for up to 90 s, "
        "then the process exits 4 for a restart.",
    )
    retry_backoff_s: float = Field(
        default=1.0,
        gt=0,
        description="After a stage fails on a whole batch, the first retry waits this long and each further "
        "consecutive failure doubles it. The service reports `NOT_SERVING` meanwhile.",
    )
    max_retry_backoff_s: float = Field(
        default=30.0, gt=0, description="The longest wait between retries of a failing batch."
    )

    @model_validator(mode="after")
    def _batch_bounds(self) -> LoopSettings:
        if self.min_batch_records > self.max_batch_records:
            raise ValueError(
                f"ONCEFLOW_LOOP_MIN_BATCH_RECORDS ({self.min_batch_records}) exceeds "
                f"ONCEFLOW_LOOP_MAX_BATCH_RECORDS ({self.max_batch_records})"
            )
        return self


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """The group consumer's ``heartbeat.interval.ms``: a fifth of its session (Kafka asks for at
    most a third). Set, not left at librdkafka's 3 s, because the takeover order's margin is one
    interval (`takeover_order_problem`)."""
    return max(100, session_timeout_ms // 5)


def takeover_order_problem(common: CommonSettings, loop: LoopSettings) -> str | None:
    """Why these settings would let a zombie commit after its partitions moved on, or None.

    A member stopped (SIGSTOP, a VM pause) with a transaction open loses its partitions one
    session after its last heartbeat, which can be a heartbeat interval before the stop; its
    transaction is aborted by the broker one transaction timeout after it began, at the latest at
    the stop. So the transaction has ended before the partitions move only if the transaction
    timeout plus a heartbeat interval is below the session timeout. Otherwise a zombie with
    another transactional id (another instance name) can still commit once its successor has
    restored its state (docs/decisions/0021-takeover-order.md)."""
    txn, session = common.transaction_timeout_ms, loop.session_timeout_ms
    heartbeat = heartbeat_interval_ms(session)
    if txn + heartbeat < session:
        return None
    return (
        f"ONCEFLOW_TRANSACTION_TIMEOUT_MS={txn} is not below ONCEFLOW_LOOP_SESSION_TIMEOUT_MS={session} by a "
        f"heartbeat interval ({heartbeat} ms, a fifth of the session): a stopped instance's transaction could then "
        f"outlive its session and commit after another instance took its partitions over. Lower the transaction "
        f"timeout below {session - heartbeat} ms or raise the session timeout above {txn + heartbeat} ms "
        "(docs/decisions/0021-takeover-order.md)"
    )


# Where a service listens and what it is called: the same four settings in every service, declared
# through these so that their defaults come from `onceflow.topology.SERVICES` and their
# descriptions and bounds are written once.


def host_setting() -> Any:
    return Field(
        default=LOCALHOST,
        description="The address the gRPC and metrics ports bind to (loopback unless you say otherwise).",
    )


def grpc_port_setting(service: Service) -> Any:
    apis = ", ".join((*service.apis, "Admin", "health", "reflection"))
    return Field(default=service.grpc_port, ge=0, le=65535, description=f"The gRPC port: {apis}.")


def metrics_port_setting(service: Service) -> Any:
    return Field(default=service.metrics_port, ge=0, le=65535, description="Prometheus `/metrics`; 0 disables it.")


def instance_setting(service: Service) -> Any:
    ids = [f"`{hop.transactional_id('', '<instance>', job='<job>')}`" for hop in hops_of(service.name)]
    named = f"the transactional.id {ids[0]} derives" if len(ids) == 1 else f"the transactional ids {' and '.join(ids)} derive"
    return Field(
        default=f"{service.name}-0",
        description=f"A name stable across restarts: {named} from it, so a restarted instance fences its own zombie.",
    )


class ServiceSettings(BaseSettings):
    """What every service's settings share. A service declares its own `common` (saying which of
    the common settings it uses), `port`, `metrics_port` and `instance` (their defaults are the
    service's, from `topology.SERVICES`) and whatever else is its own; its consumer groups and
    transactional ids are derived from the topology's hops here, never spelt out."""

    common: CommonSettings
    host: str = host_setting()
    instance: str

    def group_id_of(self, hop: Hop, job: str = "") -> str:
        return hop.group_id(self.common.topic_prefix, job)

    def transactional_id_of(self, hop: Hop, job: str = "", instance: str = "") -> str:
        """``instance``: another name than this instance's (a source on another cluster is one
        owner per topic, named by the cluster's id)."""
        return hop.transactional_id(self.common.topic_prefix, instance or self.instance, job)

"""The one config loader. Every setting is an env var; every service adds its own prefix.

Common settings use ``ONCEFLOW_`` (``ONCEFLOW_KAFKA_BOOTSTRAP``, ``ONCEFLOW_TOPIC_PREFIX``, ...).
A service's own settings use ``ONCEFLOW_<SERVICE>_`` and embed the common ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    kafka_bootstrap: str = "127.0.0.1:19092"
    # librdkafka's metadata recovery. "none" (the default, for the single local broker): keep
    # reconnecting to the brokers it knows; librdkafka's "rebootstrap" can leave an in-flight
    # send_offsets_to_transaction blocked past its timeout when the only broker restarts
    # (librdkafka #5511, #5456). On a cluster whose brokers can all be replaced, "rebootstrap"
    # lets clients find the cluster again from the bootstrap list.
    kafka_metadata_recovery: Literal["none", "rebootstrap"] = "none"
    # How every Kafka client (services, CLI, infra checks) talks to the brokers. PLAINTEXT is
    # for loopback only. SASL_SSL with SCRAM: a user and password (the _FILE form wins) over
    # TLS. SSL with a client certificate and key: mutual TLS. The CA file verifies the brokers.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = "SCRAM-SHA-512"
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = ""
    kafka_sasl_password_file: str = ""
    kafka_ssl_ca_file: str = ""
    kafka_ssl_cert_file: str = ""
    kafka_ssl_key_file: str = ""
    # redis:// or, for TLS, rediss://; an ACL user goes in the URL (rediss://onceflow@host:port/0)
    # and its password in ONCEFLOW_REDIS_PASSWORD(_FILE), not in the URL.
    redis_url: str = "redis://127.0.0.1:16379/0"
    redis_password: str = ""
    redis_password_file: str = ""
    # The CA that signed the Redis server's certificate (rediss://); empty: the system's.
    redis_ssl_ca_file: str = ""
    # After each write to a Redis store, WAIT until this many replicas have it (0: don't wait).
    # It narrows what a failover can lose; what it still loses, the stores' continuity check
    # catches and rebuilds from Kafka (docs/redis.md).
    redis_wait_replicas: int = Field(default=0, ge=0)
    redis_wait_timeout_ms: int = Field(default=1000, ge=0)
    # Prepended to every topic name, so several pipelines (or tests) share one broker.
    topic_prefix: str = ""
    # Short, so a killed producer's open transaction stops holding back the last stable offset
    # soon enough for recovery (and tests) not to crawl. The broker caps it at
    # transaction.max.timeout.ms.
    transaction_timeout_ms: int = 10_000
    # Bearer token for mutating admin calls. Empty means mutating calls are refused. The _FILE
    # form (a file holding the token) keeps it out of `ps` and the environment, and wins.
    admin_token: str = ""
    admin_token_file: str = ""
    # Bearer token for read calls (Status, stats, lookups, Query, reflection). Empty: reads are
    # open, fine on loopback; set it before binding beyond (docs/admin.md, "Threat model").
    read_token: str = ""
    read_token_file: str = ""
    # TLS for the service's gRPC port (PEM files). Empty cert and key = plaintext, fine on
    # loopback; with a client CA the server also requires client certificates signed by it.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    log_level: str = "INFO"
    # exactly_once: every hop commits offsets, state and outputs in one Kafka transaction.
    # at_least_once: the same pipeline without transactions (outputs flushed, then offsets
    # committed): a crash re-sends a batch. It exists to measure what exactly-once costs
    # (onceflow bench); never run production on it (docs/decisions/0010).
    processing_guarantee: Literal["exactly_once", "at_least_once"] = "exactly_once"

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
            from onceflow.redis_client import parse_sentinel_url

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

    max_batch_records: int = Field(default=1000, ge=1)
    # Below max_batch_records the batch bound adapts: it doubles after a full batch and halves
    # after one under a quarter full, between these two bounds. 0 = fixed at the maximum.
    min_batch_records: int = Field(default=0, ge=0)
    # The longest an idle hop waits in one poll for a first record (pause and stop are seen
    # within it).
    max_batch_ms: int = Field(default=100, ge=1)
    # After a first record: how long a hop waits for more before it commits what it has.
    linger_ms: int = Field(default=5, ge=0)
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    # How often a stage's punctuate() runs (timeouts, sweeps), in processing time.
    punctuate_ms: int = Field(default=1000, ge=10)
    # Bound on one commit/abort call; past it the outcome is indefinite and the producer is
    # recreated.
    commit_timeout_s: float = Field(default=30.0, gt=0)
    # After a stage fails on a whole batch: the first retry waits this long, each further
    # consecutive failure doubles it, up to the maximum. The service reports NOT_SERVING meanwhile.
    retry_backoff_s: float = Field(default=1.0, gt=0)
    max_retry_backoff_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _batch_bounds(self) -> LoopSettings:
        if self.min_batch_records > self.max_batch_records:
            raise ValueError(
                f"ONCEFLOW_LOOP_MIN_BATCH_RECORDS ({self.min_batch_records}) exceeds "
                f"ONCEFLOW_LOOP_MAX_BATCH_RECORDS ({self.max_batch_records})"
            )
        return self

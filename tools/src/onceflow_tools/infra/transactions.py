"""Transactions that hold a partition's last stable offset back, found and aborted with Kafka's own
admin tooling (KIP-664: kafka-tools' TransactionsCommand, from the pinned jars), for
`onceflow infra abort-hanging`.

A read_committed consumer cannot read past the first record of a transaction that is neither
committed nor aborted. The broker aborts a transaction its producer abandons once the
transaction timeout passes; a *hanging* one (KIP-664, e.g. KAFKA-9144) is one the coordinator no
longer knows, so nothing ever ends it and every hop reading that partition stalls: a restore
that never reaches the end, a hop whose lag never falls.

Aborting a transaction writes an abort marker: its records are never read, which is what
exactly-once wants of a transaction no one will commit. A transaction whose producer is alive
is another matter: aborting it makes that producer's commit fail and its hop retry from its
committed offsets (nothing lost, nothing doubled), but it is that producer's to end, so it is
only aborted when the operator says so (``force``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onceflow.config import CommonSettings, secret
from onceflow.kafka.inspect import hanging_transactions
from onceflow_tools.infra.kafka import KafkaBroker, java_executable
from onceflow_tools.infra.plumbing import InfraError

TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction open on one partition, as DescribeProducers reports it."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    last_timestamp_ms: int
    hanging: bool  # find-hanging lists it: the coordinator does not know it, nothing will end it


def java_client_properties(common: CommonSettings) -> dict[str, str]:
    """The Java client's form of onceflow's Kafka security settings (what librdkafka gets from
    `CommonSettings.kafka_client_config`): SASL_SSL with SCRAM, or mutual TLS, with PEM files."""
    protocol = common.kafka_security_protocol
    props: dict[str, str] = {"security.protocol": protocol}
    if protocol == "SASL_SSL":
        password = secret(common.kafka_sasl_password, common.kafka_sasl_password_file, "ONCEFLOW_KAFKA_SASL_PASSWORD")
        props |= {
            "sasl.mechanism": common.kafka_sasl_mechanism,
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{common.kafka_sasl_username}" password="{password}";',
        }
    if common.kafka_ssl_ca_file:
        props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": common.kafka_ssl_ca_file}
    return props


def run_tool(broker: KafkaBroker, common: CommonSettings, *args: str, timeout_s: float = 120.0) -> str:
    """TransactionsCommand's output; InfraError with its own words when it fails."""
    with tempfile.TemporaryDirectory(prefix="onceflow-transactions-") as folder:
        config = Path(folder) / "client.properties"  # holds a password: readable by this user only
        config.touch(mode=0o600)
        props = java_client_properties(common)
        if common.kafka_ssl_cert_file:  # a PEM keystore is the key and the certificate in one file
            keystore = Path(folder) / "keystore.pem"
            keystore.touch(mode=0o600)
            keystore.write_text(Path(common.kafka_ssl_key_file).read_text() + Path(common.kafka_ssl_cert_file).read_text())
            props |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}
        config.write_text("".join(f"{name}={value}\n" for name, value in props.items()))
        command = [
            java_executable(), "-cp", f"{broker.libs_dir}/*", TRANSACTIONS_COMMAND, "--bootstrap-server", common.kafka_bootstrap,
            "--command-config", str(config), *args,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise InfraError(f"TransactionsCommand {' '.join(args)}: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def _rows(output: str) -> list[dict[str, str]]:
    """The tool's table (a header line, then whitespace-separated rows) as dicts by column."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def find_hanging(broker: KafkaBroker, common: CommonSettings, topic: str, partition: int) -> set[tuple[str, int, int]]:
    """(topic, partition, producer id) of every transaction open on the partition with no
    coordinator state behind it (older than the largest transaction timeout)."""
    rows = _rows(run_tool(broker, common, "find-hanging", "--topic", topic, "--partition", str(partition)))
    return {(row["Topic"], int(row["Partition"]), int(row["ProducerId"])) for row in rows if "Topic" in row}


def describe_open(broker: KafkaBroker, common: CommonSettings, topic: str, partition: int, hanging: set[tuple[str, int, int]]) -> list[OpenTransaction]:
    """The transactions open on ``topic``/``partition`` (a producer with a current transaction)."""
    found = []
    for row in _rows(run_tool(broker, common, "describe-producers", "--topic", topic, "--partition", str(partition))):
        start = row.get("CurrentTransactionStartOffset", "-1")
        if not re.fullmatch(r"\d+", start):
            continue  # None or -1: this producer holds no transaction open
        producer = int(row["ProducerId"])
        found.append(OpenTransaction(
            topic, partition, producer, int(row.get("ProducerEpoch", "-1")), int(start), int(row.get("LastTimestamp", "-1")),
            (topic, partition, producer) in hanging,
        ))
    return found


def abort(broker: KafkaBroker, common: CommonSettings, transaction: OpenTransaction) -> None:
    run_tool(
        broker, common, "abort", "--topic", transaction.topic, "--partition", str(transaction.partition),
        "--start-offset", str(transaction.start_offset),
    )


def stalled(common: CommonSettings, topics: list[str], older_than_s: float) -> dict[str, list[int]]:
    """Partitions whose last stable offset stays below the high watermark for ``older_than_s``."""
    return hanging_transactions(common, topics, wait_s=older_than_s)

"""Least privilege on the secure stack (issue 39, docs/decisions/0029): one Kafka principal and
one Redis user per service, each allowed only what its hops read and write.

What a service may touch is derived from `onceflow.topology` (a hop's input, outputs, dead letters,
changelog, consumer group and transactional ids), plus the few control-plane reads and writes
no hop declares, each listed below with its reason. Kafka matches ACLs by literal name or name
prefix only, so a topic prefix (a verify campaign's, a test's) gets its own grants: whoever
creates a namespace's topics grants its ACLs too (`grant`).

The admin user (`secure.USER`) and the broker's own certificate are super users; the CLI, the
console, `onceflow verify`'s checker and the topics job run as the admin."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from onceflow import topology
from onceflow.topology import Topic

# The services that hold a Kafka principal of their own (every one that runs a hop).
SERVICES: tuple[str, ...] = tuple(dict.fromkeys(hop.service for hop in topology.HOPS))
# The two that use Redis, and the part of the key space each owns (docs/key-layouts.md): a glob
# on the key, whatever the topic prefix inside the hash tag.
REDIS_KEYS: dict[str, str] = {"dedup": "onceflow:{*dedup:*", "sink": "onceflow:{*sink}:*"}
# Commands a service's Redis user may not run, though its keys are its own: the @dangerous
# category (FLUSHALL, CONFIG, KEYS, DEBUG, ACL, SHUTDOWN, ...) less INFO, which the stores read
# for replication and memory.
REDIS_COMMANDS = "+@all -@dangerous +info"

_READ = (AclOperation.READ, AclOperation.DESCRIBE)
_WRITE = (AclOperation.WRITE, AclOperation.DESCRIBE)
_READ_WRITE = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)


def principal(service: str) -> str:
    """The Kafka user name (SCRAM) and the Redis user of ``service``."""
    return f"onceflow-{service}"


@dataclass(frozen=True)
class Grant:
    """Operations on every resource whose name starts with ``name`` (the topic prefix included)."""

    resource: ResourceType
    name: str
    operations: tuple[AclOperation, ...]
    why: str

    def bindings(self, service: str) -> Iterator[AclBinding]:
        for operation in self.operations:
            yield AclBinding(
                self.resource, self.name, ResourcePatternType.PREFIXED, f"User:{principal(service)}", "*",
                operation, AclPermissionType.ALLOW,
            )


def _stem(name: str) -> str:
    """A name up to its ``{job}`` slot: every job's topic or group starts with it."""
    return name.split("{", 1)[0]


def _topic(prefix: str, topic: Topic, operations: tuple[AclOperation, ...], why: str) -> Grant:
    # PREFIXED on the whole name also covers a named stream's topic (`dedup.records.orders`).
    return Grant(ResourceType.TOPIC, prefix + _stem(topic.value), operations, why)


def _hop_grants(hop: topology.Hop, prefix: str) -> Iterator[Grant]:
    stem = prefix + _stem(hop.name)
    if hop.input is not None:
        yield _topic(prefix, hop.input, _READ, f"{hop.name} reads it")
        yield Grant(ResourceType.GROUP, stem, _READ, f"{hop.name}'s consumer group")
    for output in (*hop.outputs, hop.dlq):
        yield _topic(prefix, output, _WRITE, f"{hop.name} writes it")
    if hop.changelog is not None:
        yield _topic(prefix, hop.changelog, _READ_WRITE, f"{hop.name}'s state: written, and read back on restore")
    # A hop's transactional ids are its group's name and an instance: `onceflow-dedup-0`.
    yield Grant(ResourceType.TRANSACTIONAL_ID, stem, _WRITE, f"{hop.name}'s transactions")


def _control_grants(service: str, prefix: str) -> Iterator[Grant]:
    """What no hop declares: the control plane's topics, and the admin calls a service makes."""
    # Assigned readers (restores, checks) carry a group id they never join or commit
    # (onceflow.kafka.clients.reader); the client still looks up its coordinator.
    yield Grant(ResourceType.GROUP, "onceflow-reader", (AclOperation.DESCRIBE,), "assigned reads look up a coordinator")
    if service == "ingest":
        yield _topic(prefix, Topic.DEDUP_RECORDS, (AclOperation.DESCRIBE,), "a named stream exists (its topic)")
    if service in ("ingest", "source"):
        yield _topic(prefix, Topic.ACKER_EVENTS, _READ, "waits for PROCESSED outcomes (assigned, no group)")
    if service == "source":
        yield _topic(prefix, Topic.SOURCE_OFFSETS, _READ, "restores a foreign topic's positions")
    if service == "dedup":
        yield _topic(prefix, Topic.STREAM_READERS, _READ, "which jobs read each stream (one ack edge per reader)")
    if service == "compute":
        yield _topic(prefix, Topic.STREAM_READERS, _READ_WRITE, "registers the streams its job reads")
        for template in (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_CHANGELOG):
            yield _topic(
                prefix, template, (AclOperation.CREATE, AclOperation.DESCRIBE_CONFIGS),
                "creates its job's own topics at start",
            )
    if service == "sink":
        yield _topic(prefix, Topic.JOBS_REGISTRY, _READ_WRITE, "follows the live versions; Promote and Retire write it")
        yield Grant(
            ResourceType.TRANSACTIONAL_ID, prefix + "onceflow-jobs-registry", _WRITE, "the registry's one writer (fences a concurrent change)"
        )
        for template in (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_CHANGELOG):
            yield _topic(prefix, template, (AclOperation.DESCRIBE, AclOperation.DELETE), "Retire deletes a version's topics")
        yield _topic(prefix, Topic.DEDUP_RECORDS, (AclOperation.DESCRIBE,), "Promote compares a version's position")
        yield Grant(
            ResourceType.GROUP, prefix + _stem(topology.COMPUTE_MAP.name), (AclOperation.DESCRIBE, AclOperation.DELETE),
            "Promote reads a version's groups; Retire deletes them",
        )


def grants(service: str, prefix: str = "") -> list[Grant]:
    """Everything ``service`` may do on topic prefix ``prefix``."""
    if service not in SERVICES:
        raise KeyError(f"no service named {service!r} (known: {', '.join(SERVICES)})")
    found = [grant for hop in topology.hops_of(service) for grant in _hop_grants(hop, prefix)]
    return found + list(_control_grants(service, prefix))


def bindings(prefix: str = "", services: Iterable[str] = SERVICES) -> list[AclBinding]:
    unique: dict[tuple[object, ...], AclBinding] = {}
    for service in services:
        for grant in grants(service, prefix):
            for binding in grant.bindings(service):
                unique[(binding.restype, binding.name, binding.principal, binding.operation)] = binding
    return list(unique.values())


def scram_upsertions(passwords: dict[str, str], iterations: int = 8192) -> list[UserScramCredentialAlteration]:
    """Upsertions, typed as the alterations ``AdminClient.alter_user_scram_credentials`` takes."""
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations)
    return [UserScramCredentialUpsertion(user, info, password.encode()) for user, password in passwords.items()]


def redis_acl_lines(passwords: dict[str, str]) -> list[str]:
    """redis.conf `user` lines for the services that use Redis: their keys, no pub/sub channels."""
    return [
        f"user {principal(service)} on >{passwords[service]} resetchannels ~{pattern} {REDIS_COMMANDS}"
        for service, pattern in REDIS_KEYS.items()
    ]


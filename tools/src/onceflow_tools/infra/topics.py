"""Every onceflow topic, from ``infra/topics.toml``: the specs and their creation are the core's
(``onceflow.kafka.topics``, since compute creates its job's topics); counting brokers and
deleting a namespace are the tools'."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from onceflow.kafka.topics import (
    CHANGELOG_CONFIG,
    TopicReplicationError,
    TopicSpec,
    admin_client,
    ensure_topics,
    is_declared,
    job_specs,
    load_specs,
    shared_specs,
    topics_file,
)
from onceflow_tools.infra import secure

__all__ = [
    "CHANGELOG_CONFIG", "TopicReplicationError", "TopicSpec", "count_brokers", "delete_topics", "ensure_topics",
    "job_specs", "load_specs", "provision", "shared_specs", "topics_file",
]


def provision(bootstrap: str, prefix: str = "", history_retention_ms: int | None = None) -> list[str]:
    """A namespace's topics, and on the secure stack each service's ACLs on them (ADR 0029):
    what `infra up`, `onceflow verify`, the benches and the tests' pipelines start from."""
    created = ensure_topics(bootstrap, prefix, history_retention_ms=history_retention_ms)
    if secure.enabled():
        secure.grant_access(bootstrap, prefix)
    return created


def count_brokers(bootstrap: str, timeout: float = 10.0) -> int:
    """How many brokers the cluster at ``bootstrap`` lists (0: none answered)."""
    try:
        return len(admin_client(bootstrap).list_topics(timeout=timeout).brokers)
    except KafkaException:
        return 0


def delete_topics(bootstrap: str, prefix: str, timeout: float = 30.0) -> list[str]:
    """Delete every topic whose name starts with ``prefix`` (tests' private namespaces). An
    empty prefix deletes only the declared topics (every job's per-job ones too), never internal
    or foreign ones."""
    admin = admin_client(bootstrap)
    names = set(admin.list_topics(timeout=timeout).topics)
    if prefix:
        doomed = sorted(n for n in names if n.startswith(prefix))
    else:
        specs = load_specs()
        doomed = sorted(n for n in names if is_declared(n, specs))
    if not doomed:
        return []
    for fut in admin.delete_topics(doomed, request_timeout=timeout).values():
        try:
            fut.result()
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    return doomed

"""Where a fault on a replicated Kafka cluster hurts a running pipeline: the brokers leading the
partitions it writes, and those coordinating its open transactions. Read from the cluster
itself (metadata, and the keys of ``__transaction_state``), never from naming conventions."""

from __future__ import annotations

import random
import struct
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from onceflow.kafka.clients import plain_config
from onceflow.kafka.records import offset_of, partition_of
from onceflow_tools.infra.kafka import active_controller
from onceflow_tools.infra.kafka import cluster as kafka_cluster

TRANSACTION_STATE = "__transaction_state"
# The faults only a replicated cluster can take (verify's schedule and bench/kafka_cluster.py).
CLUSTER_KINDS = ("leader-kill9", "coordinator-kill9", "controller-kill9", "broker-pause", "rolling-restart", "min-isr")
# How long a paused broker stays silent: past its session (3 s) and past the clients' request
# timeouts, so leaderships move and its connections go stale before it wakes.
PAUSE_S = (20.0, 40.0)
# Two nodes down (min.insync.replicas unmet, and no controller quorum either) this long.
MIN_ISR_OUTAGE_S = (5.0, 12.0)


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(plain_config(bootstrap, log_level=3))


def partition_leaders(bootstrap: str, topic_prefix: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the id of the broker leading it, for every topic of ``topic_prefix``
    that has a leader right now."""
    topics = _admin(bootstrap).list_topics(timeout=10).topics
    return {
        (name, partition.id): partition.leader
        for name, topic in topics.items()
        if name.startswith(topic_prefix)
        for partition in topic.partitions.values()
        if partition.leader >= 0
    }


def transactional_id_of(key: bytes | None) -> str | None:
    """A ``__transaction_state`` record key: version (int16), then the transactional.id as a
    length-prefixed (int16) UTF-8 string."""
    if key is None or len(key) < 4:
        return None
    (length,) = struct.unpack_from(">h", key, 2)
    if length < 0 or len(key) < 4 + length:
        return None
    return key[4 : 4 + length].decode("utf-8", errors="replace")


def coordinators(bootstrap: str, id_prefix: str, tail: int = 200, timeout_s: float = 10.0) -> dict[str, int]:
    """transactional.id -> the broker coordinating it, for the ids starting with ``id_prefix``
    that wrote transaction state lately (the last ``tail`` records of each partition)."""
    state = _admin(bootstrap).list_topics(TRANSACTION_STATE, timeout=10).topics.get(TRANSACTION_STATE)
    if state is None or state.error is not None:
        return {}
    leaders = {p.id: p.leader for p in state.partitions.values()}
    consumer = Consumer(plain_config(bootstrap, **{"group.id": "onceflow-verify-coordinators", "enable.auto.commit": False, "log_level": 3}))
    found: dict[str, int] = {}
    try:
        ends: dict[int, int] = {}
        starts = []
        for partition in leaders:
            low, high = consumer.get_watermark_offsets(TopicPartition(TRANSACTION_STATE, partition), timeout=5)
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(TRANSACTION_STATE, partition, max(low, high - tail)))
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            txn_id = transactional_id_of(message.key())
            partition = partition_of(message)
            if txn_id is not None and txn_id.startswith(id_prefix) and leaders[partition] >= 0:
                found[txn_id] = leaders[partition]
            if offset_of(message) + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
    finally:
        consumer.close()
    return found


def under_replicated(bootstrap: str) -> int:
    """Partitions with fewer replicas in sync than assigned, or with no leader."""
    topics = _admin(bootstrap).list_topics(timeout=10).topics
    return sum(
        1 for topic in topics.values() for p in topic.partitions.values() if p.leader < 0 or len(p.isrs) < len(p.replicas)
    )


def wait_fully_replicated(bootstrap: str, timeout_s: float = 120.0) -> None:
    """Until every partition has all its replicas in sync again: a rolling restart that moves
    on earlier takes a partition below min.insync.replicas on purpose."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if under_replicated(bootstrap) == 0:
                return
        except Exception:  # noqa: BLE001 - metadata unanswered mid-election
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions still under-replicated {timeout_s:.0f} s after a restart")
        time.sleep(0.5)


def inject(kind: str, rng: random.Random, topic_prefix: str) -> str:
    """One of ``CLUSTER_KINDS`` on the running cluster, aimed at the run on ``topic_prefix``
    (whose topics and transactional.ids start with it); what was done, for the log."""
    if kind not in CLUSTER_KINDS:
        raise ValueError(f"unknown cluster fault {kind!r}; known: {', '.join(CLUSTER_KINDS)}")
    started = time.monotonic()
    nodes = kafka_cluster()
    by_id = {node.node_id: node for node in nodes}
    bootstrap = ",".join(node.bootstrap for node in nodes)
    if kind == "leader-kill9":
        leaders = partition_leaders(bootstrap, topic_prefix)
        (topic, partition), leader = rng.choice(sorted(leaders.items()))
        by_id[leader].restart(hard=True)
        return f"kill -9 of {by_id[leader].name}, leader of {topic}[{partition}], and restart ({time.monotonic() - started:.0f} s)"
    if kind == "coordinator-kill9":
        live = coordinators(bootstrap, topic_prefix)
        if not live:
            raise RuntimeError(f"no transactional.id of {topic_prefix!r} in {TRANSACTION_STATE}")
        txn_id, coordinator = rng.choice(sorted(live.items()))
        by_id[coordinator].restart(hard=True)
        return f"kill -9 of {by_id[coordinator].name}, coordinator of {txn_id}, and restart ({time.monotonic() - started:.0f} s)"
    if kind == "controller-kill9":
        controller = active_controller(nodes)
        if controller is None:
            raise RuntimeError("no active KRaft controller to kill")
        controller.restart(hard=True)
        return f"kill -9 of {controller.name}, the active controller, and restart ({time.monotonic() - started:.0f} s)"
    if kind == "broker-pause":
        node, pause_s = rng.choice(nodes), rng.uniform(*PAUSE_S)
        node.pause()
        try:
            time.sleep(pause_s)
        finally:
            node.resume()
        return f"{node.name} paused (SIGSTOP) for {pause_s:.0f} s, then resumed"
    if kind == "rolling-restart":
        for node in nodes:
            node.restart(hard=False)
            wait_fully_replicated(bootstrap)
        return f"rolling restart of {len(nodes)} nodes ({time.monotonic() - started:.0f} s)"
    down, outage_s = rng.sample(nodes, 2), rng.uniform(*MIN_ISR_OUTAGE_S)
    for node in down:
        node.kill()
    time.sleep(outage_s)
    for node, pid in [(node, node.spawn()) for node in down]:
        if pid is not None:
            node.wait_ready(pid)
    names = " and ".join(node.name for node in down)
    return f"kill -9 of {names} (min.insync.replicas unmet) for {outage_s:.0f} s, then restart ({time.monotonic() - started:.0f} s)"

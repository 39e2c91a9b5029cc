"""onceflow.topology against what creates and documents the topics: a topic added, renamed or
re-partitioned in one place and not the others fails here."""

from __future__ import annotations

import re
import tomllib

import pytest

from onceflow import topology
from onceflow.config import repo_root
from onceflow.topology import HOPS, Topic, job_topic

ROOT = repo_root()


def declared() -> dict[str, dict]:
    return {t["name"]: t for t in tomllib.loads((ROOT / "infra" / "topics.toml").read_text())["topic"]}


def test_topics_toml_declares_exactly_the_topology_topics() -> None:
    assert set(declared()) == {str(t) for t in Topic}


def test_every_topic_is_used_by_a_hop() -> None:
    used = {t for hop in HOPS for t in (hop.input, hop.changelog, hop.dlq, *hop.outputs) if t is not None}
    assert used | set(topology.CONTROL) == set(Topic)
    assert not used & set(topology.CONTROL)


def test_a_changelog_has_its_inputs_partitions_and_is_compacted() -> None:
    specs = declared()
    for hop in HOPS:
        if hop.changelog is not None:
            spec = specs[hop.changelog]
            assert spec.get("partitions_of") == hop.input, f"{hop.changelog} must follow {hop.input}"
            assert spec.get("compacted") is True, hop.changelog


def test_every_input_is_written_by_an_earlier_hop() -> None:
    """The hops listed in the order a record meets them: nothing reads a topic no one wrote."""
    written: set[Topic] = set()
    for hop in HOPS:
        if hop.input is not None:
            assert hop.input in written, f"{hop.name} reads {hop.input}, which no earlier hop writes"
        written.update(hop.outputs)


def test_docs_topics_table_lists_every_topic() -> None:
    rows = re.findall(r"^\| `([\w.{}]+)` \|", (ROOT / "docs" / "topics.md").read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(str(t) for t in Topic)


def test_group_and_transactional_ids() -> None:
    assert topology.DEDUP.group_id("t-") == "t-onceflow-dedup"
    assert topology.COMPUTE_MAP.group_id("", job="usersum") == "onceflow-compute-usersum-map"
    assert topology.COMPUTE_MERGE.transactional_id("p-", "a", job="wc") == "p-onceflow-compute-wc-merge-a"
    assert topology.INGEST_REPLAYER.transactional_id("", "0") == "onceflow-ingest-replayer-0"
    # The Kafka source's slot is the user's topic: one group per topic copied.
    assert topology.SOURCE.transactional_id("p.", "s0", job="orders") == "p.onceflow-source-orders-s0"


def test_a_jobs_shuffle_and_state_are_its_own_topics() -> None:
    assert job_topic(Topic.COMPUTE_PARTIALS, "nexmark_q7") == "compute.partials.nexmark_q7"
    assert job_topic(Topic.COMPUTE_CHANGELOG, "word-count") == "compute.changelog.word-count"
    assert job_topic(Topic.COMPUTE_RESULTS, "wordcount") == "compute.results"  # shared by every job
    assert {t for t in Topic if t.per_job} == {Topic.COMPUTE_PARTIALS, Topic.COMPUTE_CHANGELOG}
    # A name that would make an invalid (or colliding: '.' is '_' in Kafka's metrics) topic name.
    for bad in ("", "a.b", "a b", "wörter", "x" * 101, "{job}"):
        with pytest.raises(ValueError, match="names the job's topics"):
            job_topic(Topic.COMPUTE_PARTIALS, bad)


def test_describe_names_every_hop() -> None:
    text = topology.describe()
    assert all(hop.name in text for hop in HOPS)
    assert "onceflow-sink: compute.results -> Redis tables" in text


def test_architecture_doc_shows_the_topology() -> None:
    assert topology.describe() in (ROOT / "docs" / "architecture.md").read_text()


def test_every_hop_runs_in_a_declared_service_and_no_two_services_share_a_port() -> None:
    names = {service.name for service in topology.SERVICES}
    assert {hop.service for hop in HOPS} == names
    ports = [port for service in topology.SERVICES for port in (service.grpc_port, service.metrics_port)]
    assert len(ports) == len(set(ports))
    assert topology.service("sink").address() == "127.0.0.1:15055"


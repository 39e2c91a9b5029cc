"""How many replicas a declared topic gets, on one broker and on a cluster."""

from __future__ import annotations

import pytest

from onceflow.topology import Topic
from onceflow_tools.infra.topics import TopicReplicationError, TopicSpec, load_specs


def test_by_default_a_topic_is_replicated_as_far_as_the_cluster_allows() -> None:
    spec = TopicSpec(Topic.INGEST_RECORDS, 4)
    assert spec.replication_for(1) == (1, 1)
    assert spec.replication_for(2) == (2, 1)
    assert spec.replication_for(3) == (3, 2)  # a committed write survives the loss of one broker
    assert spec.replication_for(5) == (3, 2)


def test_a_declared_replication_is_kept_or_refused_with_the_reason() -> None:
    assert TopicSpec("t", 1, replication_factor=2, min_insync_replicas=2).replication_for(3) == (2, 2)
    with pytest.raises(TopicReplicationError, match="declares 3 replicas; the cluster has 1"):
        TopicSpec("t", 1, replication_factor=3).replication_for(1)
    with pytest.raises(TopicReplicationError, match="min_insync_replicas 4 with 3 replicas"):
        TopicSpec("t", 1, replication_factor=3, min_insync_replicas=4).replication_for(3)


def test_the_declared_topics_take_the_cluster_defaults() -> None:
    assert all(spec.replication_for(3) == (3, 2) for spec in load_specs())

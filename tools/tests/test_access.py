"""The secure stack's per-service grants (ADR 0029), as pure logic: derived from the topology, so a
hop that reads or writes a topic gets it, and no service may write another hop's output or take
its transactional ids. The broker enforcing them is tests/test_secure_stack.py."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from onceflow import topology
from onceflow_tools.infra import access


def _allowed(service: str, resource: ResourceType, name: str, operation: AclOperation, prefix: str = "") -> bool:
    return any(
        g.resource == resource and name.startswith(g.name) and operation in g.operations
        for g in access.grants(service, prefix)
    )


@pytest.mark.parametrize("hop", topology.HOPS, ids=lambda hop: hop.name)
def test_every_hop_may_do_what_the_topology_says_it_does(hop: topology.Hop) -> None:
    prefix, job = "p.", "orders"
    topic = lambda t: prefix + topology.job_topic(t, job)  # noqa: E731
    if hop.input is not None:
        assert _allowed(hop.service, ResourceType.TOPIC, topic(hop.input), AclOperation.READ, prefix)
        assert _allowed(hop.service, ResourceType.GROUP, hop.group_id(prefix, job), AclOperation.READ, prefix)
    for output in (*hop.outputs, hop.dlq):
        assert _allowed(hop.service, ResourceType.TOPIC, topic(output), AclOperation.WRITE, prefix)
    assert _allowed(hop.service, ResourceType.TRANSACTIONAL_ID, hop.transactional_id(prefix, "0", job), AclOperation.WRITE, prefix)


def test_no_service_writes_a_topic_no_hop_of_it_writes() -> None:
    for service in access.SERVICES:
        mine = {t for hop in topology.hops_of(service) for t in (*hop.outputs, hop.dlq, hop.changelog) if t is not None}
        extra = {"compute": {topology.Topic.STREAM_READERS}, "sink": {topology.Topic.JOBS_REGISTRY}}.get(service, set())
        for topic in topology.Topic:
            name = topology.job_topic(topic, "orders")
            if topic not in mine | extra:
                assert not _allowed(service, ResourceType.TOPIC, name, AclOperation.WRITE), (service, name)


def test_no_service_takes_another_services_transactional_ids() -> None:
    for service in access.SERVICES:
        for hop in topology.HOPS:
            if hop.service != service:
                assert not _allowed(service, ResourceType.TRANSACTIONAL_ID, hop.transactional_id("", "0", "orders"), AclOperation.WRITE)


def test_a_prefix_scopes_every_grant_but_the_readers_coordinator_lookup() -> None:
    for service in access.SERVICES:
        for grant in access.grants(service, "team-a."):
            assert grant.name.startswith("team-a.") or grant.name == "onceflow-reader", grant
    assert not _allowed("dedup", ResourceType.TOPIC, "team-b.ingest.records", AclOperation.READ, "team-a.")


def test_only_the_services_that_use_redis_get_a_user_and_only_their_keys() -> None:
    lines = access.redis_acl_lines({"dedup": "d" * 32, "sink": "s" * 32})
    assert [line.split()[1] for line in lines] == ["onceflow-dedup", "onceflow-sink"]
    assert all("-@dangerous" in line and "~*" not in line for line in lines)
    with pytest.raises(KeyError):
        access.grants("console")

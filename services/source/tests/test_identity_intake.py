"""The identity intake notices a recreated topic while no batch comes (pure: fakes for the
intake, the admin client's answer and the clock)."""

from __future__ import annotations

import pytest

from onceflow_client.kafka_identity import KafkaOrigin
from onceflow_source import identity
from onceflow_source.identity import IdentityIntake, TopicRecreated

pytestmark = pytest.mark.edges


class Inner:
    observed = 0

    def observe(self, consumer: object) -> None:
        self.observed += 1


def test_an_idle_source_whose_topic_was_recreated_exits_for_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    topic_id = ["old-id"]
    monkeypatch.setattr(identity.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(identity, "read_topic_id", lambda admin, topic: topic_id[0])
    intake = IdentityIntake(Inner(), admin=None, topic="orders", origin=KafkaOrigin("cluster", "old-id"))  # type: ignore[arg-type]
    intake.observe(None)  # type: ignore[arg-type]
    now[0] += identity.IDLE_CHECK_S
    intake.observe(None)  # type: ignore[arg-type]  # same id: nothing happens
    topic_id[0] = "new-id"
    now[0] += 1.0
    intake.observe(None)  # type: ignore[arg-type]  # not due yet: no admin call per poll
    now[0] += identity.IDLE_CHECK_S
    with pytest.raises(TopicRecreated, match="old-id -> new-id"):
        intake.observe(None)  # type: ignore[arg-type]

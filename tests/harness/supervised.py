"""The whole pipeline under ``onceflow verify``'s supervisor, on a topic prefix of its own, for
a test: started, handed over, then stopped and its topics deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

from onceflow.config import CommonSettings
from onceflow.faults import ALLOW_ENV
from onceflow_tools.infra.topics import delete_topics, provision
from onceflow_tools.verify.supervisor import Supervisor
from tests.conftest import TEST_SESSION_TIMEOUT_MS


def supervised(tmp_path: Path, settings: dict[str, dict[str, str]], env: dict[str, str]) -> Iterator[Supervisor]:
    """``settings``: per service, its own (without the ``ONCEFLOW_<NAME>_`` prefix); ``env``:
    for every process."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    provision(common.kafka_bootstrap, prefix=prefix)
    supervisor = Supervisor(
        prefix, tmp_path, settings=settings,
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            ALLOW_ENV: "1", **env,
        },
    )
    try:
        supervisor.start_all()
        yield supervisor
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

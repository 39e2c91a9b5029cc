"""Fixtures shared by the cross-service tests: the real infra (once per run), an isolated
topic set per test, and subprocesses that are always cleaned up."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from onceflow.config import CommonSettings, repo_root
from onceflow.infra import stack
from onceflow.infra.kafka import KafkaBroker
from onceflow.infra.topics import delete_topics, ensure_topics
from tests.harness.process import ServiceProcess, free_port

# Short enough that a SIGSTOPped member leaves the group quickly in zombie tests.
TEST_SESSION_TIMEOUT_MS = 6000


@pytest.fixture(scope="session")
def infra() -> Iterator[None]:
    """Real Kafka (KRaft) and Redis, started by the project's own scripts."""
    already_up = all(component.healthy for component in stack.status())
    stack.up(create_topics=False)
    yield
    if not already_up:
        stack.down()


@pytest.fixture(scope="session")
def broker(infra: None) -> KafkaBroker:
    return KafkaBroker.from_env()


@dataclass
class Pipeline:
    """An isolated set of onceflow topics (a unique prefix) and the env that points at it."""

    common: CommonSettings
    log_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            "ONCEFLOW_TOPIC_PREFIX": self.common.topic_prefix,
            "ONCEFLOW_KAFKA_BOOTSTRAP": self.common.kafka_bootstrap,
            "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            "ONCEFLOW_ADMIN_TOKEN": "test-token",
        }

    def topic(self, name: str) -> str:
        return self.common.topic(name)

    def process(self, name: str, module: str, *args: str, **env: str) -> ServiceProcess:
        proc = ServiceProcess(name, module, {**self.env, **env}, self.log_dir, cwd=repo_root(), args=args)
        self.processes.append(proc)
        return proc


@pytest.fixture
def pipeline(infra: None, tmp_path: Path) -> Iterator[Pipeline]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    pipe = Pipeline(common, tmp_path)
    yield pipe
    for proc in pipe.processes:
        proc.ensure_dead()
    delete_topics(common.kafka_bootstrap, prefix=prefix)



def eventually(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)

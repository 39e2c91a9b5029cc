"""The broker's jars are checked against their pinned sha256 before they reach the classpath
(issue 39, supply chain): a swapped, an extra or a missing jar is refused, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.config import repo_root
from onceflow_tools.infra.kafka import InfraError, KafkaBroker


def test_the_installed_jars_are_the_pinned_ones_and_a_swapped_one_is_refused(tmp_path: Path) -> None:
    broker = KafkaBroker(port=0, controller_port=0, home=repo_root() / ".onceflow" / "kafka")
    broker.install()  # a no-op once make setup has run; checks the pins when it does run
    jars = sorted(broker.libs_dir.glob("*.jar"))
    assert jars
    broker.check_jars(broker.libs_dir)
    copy = tmp_path / "libs"
    copy.mkdir()
    for jar in jars:
        (copy / jar.name).symlink_to(jar)
    victim = jars[0].name
    (copy / victim).unlink()
    (copy / victim).write_bytes(b"not the jar Maven Central serves")
    (copy / "extra-1.0.jar").write_bytes(b"x")
    (copy / jars[1].name).unlink()
    with pytest.raises(InfraError) as refused:
        broker.check_jars(copy)
    message = str(refused.value)
    assert f"{victim}: sha256" in message and "extra-1.0.jar: not pinned" in message
    assert f"{jars[1].name}: pinned, not assembled" in message

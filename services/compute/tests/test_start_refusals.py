"""What a compute worker refuses at start, before it touches Kafka, Redis or Spark."""

from __future__ import annotations

import logging

import pytest

from onceflow.service_main import EXIT_USAGE

from onceflow_compute import service
from onceflow_compute.config import ComputeSettings

pytestmark = pytest.mark.compute


def test_a_job_naming_nothing_exits_2_naming_it_and_what_there_is(caplog: pytest.LogCaptureFixture) -> None:
    """Exit 2, which supervise does not restart: `tilt ci` and a deploy fail at once."""
    with caplog.at_level(logging.ERROR):
        assert service.run(ComputeSettings(job="no_such_job")) == EXIT_USAGE
    assert "no job 'no_such_job': not a built-in (" in caplog.text and "usersum" in caplog.text, caplog.text

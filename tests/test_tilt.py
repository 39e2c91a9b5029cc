"""`tilt ci` on the project's Tiltfile, with the Tilt that `make tilt` built: every resource
(setup, infra, the five services) must reach ready, and a broken one must make it fail."""

from __future__ import annotations

import os
import subprocess

import pytest

from onceflow import topology
from onceflow.config import repo_root
from onceflow_tools.infra.plumbing import port_open
from tests.conftest import eventually

pytestmark = [pytest.mark.devex, pytest.mark.integration]

ROOT = repo_root()
TILT = ROOT / ".tools" / "bin" / "tilt"
PIPELINE_PORTS = tuple(service.grpc_port for service in topology.SERVICES)
METRICS_PORTS = tuple(service.metrics_port for service in topology.SERVICES)


def wait_pipeline_gone() -> None:
    """Every port the Tiltfile's services bind, gRPC and metrics, closed: their processes are
    gone (the metrics server lives until the process exits; a CI run's second tilt ci met the
    first one's acker still holding 9102)."""
    eventually(lambda: not any(port_open(port) for port in PIPELINE_PORTS + METRICS_PORTS), 60, "the services tilt started to stop")


def tilt_ci(**env: str) -> subprocess.CompletedProcess[str]:
    assert TILT.is_file(), "no .tools/bin/tilt: `make test` builds it (make tilt)"
    return subprocess.run(
        [str(TILT), "ci", "--port", "0", "--timeout", "5m"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_tilt_ci_brings_every_resource_up_then_stops_them(infra: None) -> None:
    result = tilt_ci()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "SUCCESS. All workloads are healthy." in output, output[-4000:]
    for name in ("acker", "dedup", "compute", "sink", "ingest", "console"):
        assert f"{name} │" in output or f"{name} |" in output, f"no log lines from {name}"
    # tilt ci stops what it started (each service shuts down gracefully on its SIGTERM).
    wait_pipeline_gone()


# A second `tilt ci` (about 25 s of a worker): in make test-extended. That a job naming nothing
# is refused at start (exit 2, naming it) stays in make test (services/compute/tests/test_start_refusals.py).
@pytest.mark.extended
def test_a_resource_that_cannot_start_fails_tilt_ci(infra: None) -> None:
    wait_pipeline_gone()  # whatever ran before (the test above) is gone, so only the job can fail
    result = tilt_ci(ONCEFLOW_COMPUTE_JOB="no_such_job")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "no job 'no_such_job'" in output, output[-4000:]

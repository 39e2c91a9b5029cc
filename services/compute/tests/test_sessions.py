"""Which errors mean Spark is out of reach (a new session, no record to blame) and which are the
job's own; and a Connect URL whose server is down is refused at once."""

from __future__ import annotations

import pytest

from onceflow_tools.process import free_port

from onceflow_compute.engine import sessions

pytestmark = pytest.mark.compute


@pytest.mark.parametrize(
    "message",
    [
        "<_InactiveRpcError of RPC that terminated with: status = StatusCode.UNAVAILABLE details = \"failed to connect\">",
        "[INVALID_HANDLE.SESSION_NOT_FOUND] The handle 1234 is invalid. Session not found.",
        "[INVALID_HANDLE.SESSION_CHANGED] The existing Spark server driver instance has restarted.",
        "[NO_ACTIVE_SESSION] No active Spark session found.",
    ],
)
def test_a_lost_connect_server_is_told_apart(message: str) -> None:
    assert sessions.connect_lost(RuntimeError(message))
    assert not sessions.classic_lost(RuntimeError(message))


@pytest.mark.parametrize(
    "message",
    [
        "[DIVIDE_BY_ZERO] Division by zero.",
        "PythonException: ModuleNotFoundError: No module named 'userjobs'",
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `amont` cannot be resolved.",
    ],
)
def test_a_failing_job_is_not_a_lost_server(message: str) -> None:
    assert not sessions.connect_lost(RuntimeError(message))
    assert not sessions.classic_lost(RuntimeError(message))


def test_a_stopped_classic_context_is_lost() -> None:
    assert sessions.classic_lost(RuntimeError("java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext."))


def test_a_connect_url_with_no_server_is_refused_by_the_probe() -> None:
    """ConnectServerDown comes from the probe, before the client's own retries (minutes)."""
    with pytest.raises(sessions.ConnectServerDown, match="no Spark Connect server answers"):
        sessions.build_session(f"sc://127.0.0.1:{free_port()}", "t", 1, "1g", "")


def test_a_standalone_master_that_does_not_answer_is_refused_and_counts_as_lost() -> None:
    with pytest.raises(sessions.ConnectServerDown, match="no Spark master answers at 127.0.0.1") as caught:
        sessions.build_session(f"spark://127.0.0.1:{free_port()},127.0.0.1:{free_port()}", "t", 1, "1g", "")
    assert sessions.classic_lost(caught.value)


def test_the_url_decides_the_kind() -> None:
    assert sessions.is_connect("sc://host:15002/;user_id=a")
    assert not sessions.is_connect("spark://host:7077") and not sessions.is_connect("local[*]")

"""Ingest ends with the code of whatever part of it stopped, so a supervisor restarts it."""

from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART

from onceflow_ingest.service import EXIT_FAILED, exit_code_for


def test_serves_on_while_every_part_runs() -> None:
    assert exit_code_for(False, False, []) is None


def test_a_stuck_replayer_ends_ingest_for_a_restart() -> None:
    assert exit_code_for(False, False, [EXIT_RESTART]) == EXIT_RESTART


def test_a_fenced_replayer_or_committer_ends_ingest_as_fenced() -> None:
    assert exit_code_for(False, False, [EXIT_FENCED]) == EXIT_FENCED
    assert exit_code_for(False, True, []) == EXIT_FENCED


def test_a_replayer_that_returned_unasked_is_a_failure() -> None:
    assert exit_code_for(False, False, [EXIT_OK]) == EXIT_FAILED
    assert exit_code_for(True, False, [EXIT_RESTART]) == EXIT_FAILED

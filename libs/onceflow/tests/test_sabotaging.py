"""`faults.sabotaging`: a bench's in-process switch of sabotages, restored after the block."""

from __future__ import annotations

import pytest

from onceflow import faults

pytestmark = pytest.mark.foundation


def test_the_block_runs_with_exactly_the_sabotages_named() -> None:
    before = faults.sabotaged("redis_unchecked")
    with faults.sabotaging("redis_unchecked"):
        assert faults.sabotaged("redis_unchecked")
        assert not faults.sabotaged("read_uncommitted")
        with faults.sabotaging():
            assert not faults.sabotaged("redis_unchecked")
        assert faults.sabotaged("redis_unchecked")
    assert faults.sabotaged("redis_unchecked") is before


def test_the_environments_sabotages_come_back_after_a_failure() -> None:
    before = faults.sabotaged("redis_unchecked")
    with pytest.raises(RuntimeError), faults.sabotaging("redis_unchecked"):
        raise RuntimeError("the timed block failed")
    assert faults.sabotaged("redis_unchecked") is before


def test_an_unknown_sabotage_is_refused() -> None:
    with pytest.raises(AssertionError), faults.sabotaging("no_such_sabotage"):
        pass

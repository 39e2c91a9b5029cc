"""Admin controls over a service's hops: Pause, Resume and Drain reach every hop (issue 40)."""

from __future__ import annotations

from onceflow.admin.loop_controls import LoopControls
from onceflow.txn.driver import ConsumerDriver


class _Hop(ConsumerDriver):
    """Only the controls: a hop that drains in time, or not."""

    def __init__(self, drains: bool) -> None:  # no super().__init__: nothing here consumes
        self.drains = drains
        self.asked: list[str] = []

    def pause(self) -> None:
        self.asked.append("pause")

    def resume(self) -> None:
        self.asked.append("resume")

    def drain(self, timeout_s: float) -> bool:
        self.asked.append("drain")
        return self.drains


def test_drain_asks_every_hop_even_after_one_did_not_drain_in_time() -> None:
    lagging, merge = _Hop(drains=False), _Hop(drains=True)
    assert LoopControls([lagging, merge]).drain(0.1) == ("DRAINING", False)
    assert merge.asked == ["drain"]  # was never asked while the first hop lagged


def test_drain_is_done_once_every_hop_drained() -> None:
    hops = [_Hop(drains=True), _Hop(drains=True)]
    assert LoopControls(hops).drain(0.1) == ("DRAINED", True)


def test_pause_and_resume_reach_every_hop() -> None:
    hops = [_Hop(drains=True), _Hop(drains=True)]
    controls = LoopControls(hops)
    assert (controls.pause(), controls.resume()) == ("PAUSED", "RUNNING")
    assert all(hop.asked == ["pause", "resume"] for hop in hops)

"""Admin controls for any service built on the shared consumer driver (one hop, or one per hop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from onceflow.admin.server import StatusSnapshot
from onceflow.txn.driver import ConsumerDriver, LoopState


class LoopControls:
    """With several loops, Status sums their counters and lists every hop's partitions; the
    state is the first loop's unless a hop is FENCED or STOPPED; Pause/Resume/Drain act on all."""

    def __init__(
        self, loops: ConsumerDriver | Sequence[ConsumerDriver], gauges: Callable[[], dict[str, float]] = dict
    ) -> None:
        self._loops = [loops] if isinstance(loops, ConsumerDriver) else list(loops)
        self._gauges = gauges

    def status(self) -> StatusSnapshot:
        states = [loop.state for loop in self._loops]
        state = next((s for s in (LoopState.FENCED, LoopState.STOPPED) if s in states), states[0])
        every = [loop.stats for loop in self._loops]
        return StatusSnapshot(
            state=state.value,
            partitions=[(p.topic, p.partition, p.position, p.lag) for stats in every for p in stats.partitions],
            transactions_committed=sum(s.committed for s in every),
            transactions_aborted=sum(s.aborted for s in every),
            records_in=sum(s.records_in for s in every),
            records_out=sum(s.records_out for s in every),
            last_error="; ".join(s.last_error for s in every if s.last_error),
            gauges=self._gauges(),
        )

    def pause(self) -> str:
        for loop in self._loops:
            loop.pause()
        return "PAUSED"

    def resume(self) -> str:
        for loop in self._loops:
            loop.resume()
        return "RUNNING"

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        # Every hop is asked, even after one has not drained in time: `all()` over a generator
        # stopped at the first, and left a compute merge hop running when its map hop lagged.
        drained = [loop.drain(timeout_s) for loop in self._loops]
        return ("DRAINED" if all(drained) else "DRAINING"), all(drained)

"""When and how: windowed, keyed aggregation with triggers and accumulation modes.

One :class:`WindowedAggregation` holds, per key and window, a pane: the merged partial
aggregate of the window's records and what was last emitted for it. The caller feeds it records
(with the watermark as it stood before their batch), then advances the watermark and asks it to
fire at the end of each batch:

- **on time**: when the watermark reaches the window's end (never for the global window);
- **early**: every ``early_every_ms`` of processing time while the window is open and has new
  data (0: at every batch);
- **late**: after the on-time pane, once per batch that brought data for the window, as long
  as the watermark has not passed ``end + allowed_lateness``. A record whose every window is
  past that is **too late**: :meth:`add` refuses it and the caller dead-letters it to
  ``compute.late``. A window past it is dropped from state.

What a firing carries depends on the accumulation mode:

- **discarding**: the pane's records since the last firing only (the partial starts over);
- **accumulating**: everything so far, as an upsert of the window's row;
- **accumulating and retracting**: everything so far, plus a retraction of what was emitted
  before, so a table folding the changes always holds each window's latest row exactly once.
  When sessions merge, the rows emitted for the sessions that merged away are retracted too.

Pure: state is plain data (:meth:`snapshot` / :meth:`restore` give it as JSON values for a
changelog), and processing time is passed in.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onceflow_compute.dataflow.windows import GLOBAL, MIN_TIME, Window, WindowFn, merge_overlapping

Partial = Any
Row = Any


class Accumulation(str, enum.Enum):
    DISCARDING = "discarding"
    ACCUMULATING = "accumulating"
    RETRACTING = "accumulating_retracting"


class Timing(str, enum.Enum):
    EARLY = "early"
    ON_TIME = "on_time"
    LATE = "late"


@dataclass(frozen=True)
class Trigger:
    # Processing-time early firings while the window is open: every N ms (0: every batch).
    early_every_ms: int | None = None
    # One firing per batch that brings data after the on-time pane (within allowed lateness).
    late: bool = True

    def __post_init__(self) -> None:
        if self.early_every_ms is not None and self.early_every_ms < 0:
            raise ValueError("early_every_ms must be >= 0")


@dataclass
class _Pane:
    acc: Partial | None = None
    # The row last emitted for this window (what a retraction withdraws), if any.
    emitted: Row | None = None
    # Rows emitted for windows that merged into this one, not yet retracted: (window, row).
    merged_away: list[tuple[Window, Row]] = field(default_factory=list)
    fired_on_time: bool = False
    dirty: bool = False
    last_fired_ms: int | None = None
    index: int = 0


@dataclass(frozen=True)
class Firing:
    key: str
    window: Window
    timing: Timing
    index: int  # 0 for the window's first pane, then 1, 2, ...
    row: Row  # the result of this pane
    partial: Partial  # the pane's partial (discarding: only what it adds)
    # Accumulating and retracting: rows to withdraw first, (window, row) (merged sessions included).
    retractions: tuple[tuple[Window, Row], ...] = ()


class WindowedAggregation:
    def __init__(
        self,
        windows: WindowFn,
        merge: Callable[[Partial, Partial], Partial],
        result: Callable[[str, Window, Partial], Row],
        *,
        trigger: Trigger | None = None,
        accumulation: Accumulation = Accumulation.RETRACTING,
        allowed_lateness_ms: int = 0,
    ) -> None:
        if allowed_lateness_ms < 0:
            raise ValueError("allowed_lateness_ms must be >= 0")
        self.windows = windows
        self.trigger = trigger or Trigger()
        self.accumulation = accumulation
        self.allowed_lateness_ms = allowed_lateness_ms
        self._merge = merge
        self._result = result
        self.watermark = MIN_TIME
        self._panes: dict[str, dict[Window, _Pane]] = {}
        # (window end, key, window) of panes still to fire on time, and (expiry, key, window) for GC.
        self._on_time: list[tuple[int, str, Window]] = []
        self._expiry: list[tuple[int, str, Window]] = []
        self._dirty: set[tuple[str, Window]] = set()
        # Keys whose state changed since the caller last took them (its changelog's to-do).
        self.changed_keys: set[str] = set()
        self.too_late = 0

    # -- input -------------------------------------------------------------------------------

    def is_expired(self, window: Window) -> bool:
        return window != GLOBAL and self.watermark >= window.end + self.allowed_lateness_ms

    def add(self, key: str, event_time_ms: int, partial: Partial) -> bool:
        """Add one record's partial to its windows. False: too late for every window (beyond
        allowed lateness); nothing changed."""
        windows = [w for w in self.windows.assign(event_time_ms) if not self.is_expired(w)]
        if not windows:
            self.too_late += 1
            return False
        panes = self._panes.setdefault(key, {})
        for window in windows:
            if self.windows.merging:
                window = self._merge_into(key, panes, window)
            pane = panes.get(window)
            if pane is None:
                pane = panes[window] = _Pane(fired_on_time=window != GLOBAL and self.watermark >= window.end)
                self._schedule(key, window, pane)
            pane.acc = partial if pane.acc is None else self._merge(pane.acc, partial)
            pane.dirty = True
            self._dirty.add((key, window))
        self.changed_keys.add(key)
        return True

    def _merge_into(self, key: str, panes: dict[Window, _Pane], window: Window) -> Window:
        """Merge ``window`` with the key's windows it overlaps; returns the merged window, whose
        pane holds the merged partials and owes the retraction of every row emitted before."""
        overlapping = [w for w in panes if self.windows.joins(w, window)]
        if not overlapping:
            return window
        ((merged, parts),) = merge_overlapping([window, *overlapping], self.windows.joins)
        target = _Pane(fired_on_time=self.watermark >= merged.end)
        for part in parts:
            pane = panes.pop(part, None)
            if pane is None:
                continue
            self._dirty.discard((key, part))
            if pane.acc is not None:
                target.acc = pane.acc if target.acc is None else self._merge(target.acc, pane.acc)
            target.merged_away.extend(pane.merged_away)
            if pane.emitted is not None:
                target.merged_away.append((part, pane.emitted))
            target.index = max(target.index, pane.index)
            target.dirty = target.dirty or pane.dirty
        panes[merged] = target
        self._schedule(key, merged, target)
        return merged

    def _schedule(self, key: str, window: Window, pane: _Pane) -> None:
        if window == GLOBAL:
            return
        if not pane.fired_on_time:
            heapq.heappush(self._on_time, (window.end, key, window))
        heapq.heappush(self._expiry, (window.end + self.allowed_lateness_ms, key, window))

    # -- time --------------------------------------------------------------------------------

    def advance_watermark(self, watermark: int | None) -> None:
        """The watermark after a batch; it never goes back."""
        if watermark is not None and watermark > self.watermark:
            self.watermark = watermark

    def fire(self, now_ms: int) -> list[Firing]:
        """Every pane due at the current watermark and processing time, then drop what expired.
        Call once per batch, after :meth:`add` and :meth:`advance_watermark`."""
        firings: list[Firing] = []
        while self._on_time and self._on_time[0][0] <= self.watermark:
            _end, key, window = heapq.heappop(self._on_time)
            pane = self._panes.get(key, {}).get(window)
            if pane is None or pane.fired_on_time:
                continue  # merged away, expired, or already fired
            pane.fired_on_time = True
            if pane.dirty and (firing := self._fire(key, window, pane, Timing.ON_TIME, now_ms)):
                firings.append(firing)
            self.changed_keys.add(key)
        for key, window in sorted(self._dirty):
            pane = self._panes.get(key, {}).get(window)
            if pane is None or not pane.dirty:
                continue
            if pane.fired_on_time:
                if not self.trigger.late:
                    continue
                timing = Timing.LATE
            else:
                every = self.trigger.early_every_ms
                if every is None or (pane.last_fired_ms is not None and now_ms - pane.last_fired_ms < every):
                    continue
                timing = Timing.EARLY
            if firing := self._fire(key, window, pane, timing, now_ms):
                firings.append(firing)
        self._collect_expired()
        return firings

    def _fire(self, key: str, window: Window, pane: _Pane, timing: Timing, now_ms: int) -> Firing | None:
        """The pane's firing; None when it would only repeat the row its last firing emitted
        (a refinement that left the result as it was: retracting and re-adding it says nothing)."""
        assert pane.acc is not None
        row = self._result(key, window, pane.acc)
        if self.accumulation is not Accumulation.DISCARDING and row == pane.emitted and not pane.merged_away:
            pane.dirty = False
            self._dirty.discard((key, window))
            self.changed_keys.add(key)
            return None
        retractions: tuple[tuple[Window, Row], ...] = ()
        if self.accumulation is Accumulation.RETRACTING:
            retractions = tuple(pane.merged_away)
            if pane.emitted is not None:
                retractions += ((window, pane.emitted),)
        firing = Firing(key, window, timing, pane.index, row, pane.acc, retractions)
        pane.emitted = row
        pane.merged_away = []
        pane.dirty = False
        pane.last_fired_ms = now_ms
        pane.index += 1
        if self.accumulation is Accumulation.DISCARDING:
            pane.acc = None
        self._dirty.discard((key, window))
        self.changed_keys.add(key)
        return firing

    def _collect_expired(self) -> None:
        while self._expiry and self._expiry[0][0] <= self.watermark:
            _expiry, key, window = heapq.heappop(self._expiry)
            panes = self._panes.get(key)
            if panes is None or window not in panes:
                continue
            del panes[window]
            self._dirty.discard((key, window))
            if not panes:
                del self._panes[key]
            self.changed_keys.add(key)

    # -- state -------------------------------------------------------------------------------

    def windows_of(self, key: str) -> dict[Window, Partial | None]:
        return {w: p.acc for w, p in sorted(self._panes.get(key, {}).items())}

    def keys(self) -> list[str]:
        return sorted(self._panes)

    def snapshot(self, key: str) -> list[list[Any]] | None:
        """The key's panes as JSON values (None: the key has no state left)."""
        panes = self._panes.get(key)
        if not panes:
            return None
        return [
            [
                w.start, w.end, p.acc, p.emitted, [[m.start, m.end, row] for m, row in p.merged_away],
                p.fired_on_time, p.dirty, p.last_fired_ms, p.index,
            ]
            for w, p in sorted(panes.items())
        ]

    def restore(self, key: str, snapshot: list[list[Any]] | None) -> None:
        """Replace the key's state with a snapshot (None drops it)."""
        self._panes.pop(key, None)
        for entry in snapshot or []:
            start, end, acc, emitted, merged_away, fired_on_time, dirty, last_fired_ms, index = entry
            window = Window(start, end)
            pane = _Pane(acc, emitted, [(Window(s, e), row) for s, e, row in merged_away], fired_on_time, dirty, last_fired_ms, index)
            self._panes.setdefault(key, {})[window] = pane
            self._schedule(key, window, pane)
            if dirty:
                self._dirty.add((key, window))

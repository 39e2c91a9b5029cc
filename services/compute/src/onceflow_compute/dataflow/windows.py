"""Where in event time: window assignment (the Dataflow model's "where").

A window is a half-open interval ``[start, end)`` of event time in ms. Tumbling and hopping
windows are fixed by the event time alone; session windows start as ``[t, t + gap)`` per record
and merge with every window of the same key they overlap, so a session is the union of records
closer than ``gap`` to each other. The global window holds everything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MIN_TIME = -(2**62)
MAX_TIME = 2**62


@dataclass(frozen=True, order=True)
class Window:
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"empty window [{self.start}, {self.end})")

    @property
    def max_timestamp(self) -> int:
        """The last event time in the window: the watermark passing it closes the window."""
        return self.end - 1

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    def touches(self, other: Window) -> bool:
        """Overlapping, or one ending where the other starts."""
        return self.start <= other.end and other.start <= self.end

    def span(self, other: Window) -> Window:
        return Window(min(self.start, other.start), max(self.end, other.end))

    def label(self) -> str:
        """The window in a result key: ``start-end`` (``global`` for the global window)."""
        return "global" if self == GLOBAL else f"{self.start}-{self.end}"


GLOBAL = Window(MIN_TIME, MAX_TIME)


class WindowFn:
    """How records are assigned to windows. ``merging``: windows of a key may merge (sessions)."""

    merging = False

    def assign(self, event_time_ms: int) -> list[Window]:
        raise NotImplementedError

    def joins(self, a: Window, b: Window) -> bool:
        """Merging windows: ``a`` and ``b`` become one."""
        return a.overlaps(b)

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class GlobalWindows(WindowFn):
    def assign(self, event_time_ms: int) -> list[Window]:
        return [GLOBAL]

    def describe(self) -> str:
        return "global"


@dataclass(frozen=True)
class Tumbling(WindowFn):
    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError("size_ms must be > 0")

    def assign(self, event_time_ms: int) -> list[Window]:
        start = (event_time_ms - self.offset_ms) // self.size_ms * self.size_ms + self.offset_ms
        return [Window(start, start + self.size_ms)]

    def describe(self) -> str:
        return f"tumbling({self.size_ms} ms)"


@dataclass(frozen=True)
class Hopping(WindowFn):
    """Windows of ``size_ms`` starting every ``slide_ms``: a record is in ``size / slide`` of
    them (sliding windows, in Beam's words)."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0 or self.slide_ms > self.size_ms:
            raise ValueError("need 0 < slide_ms <= size_ms")

    def assign(self, event_time_ms: int) -> list[Window]:
        last_start = (event_time_ms - self.offset_ms) // self.slide_ms * self.slide_ms + self.offset_ms
        windows = []
        start = last_start
        while start > event_time_ms - self.size_ms:
            windows.append(Window(start, start + self.size_ms))
            start -= self.slide_ms
        return windows[::-1]

    def describe(self) -> str:
        return f"hopping({self.size_ms} ms every {self.slide_ms} ms)"


@dataclass(frozen=True)
class Sessions(WindowFn):
    gap_ms: int
    # A record exactly gap_ms after a session's last one joins it (Spark's session_window):
    # sessions that touch merge, not only those that overlap.
    merge_touching: bool = False
    merging = True

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise ValueError("gap_ms must be > 0")

    def assign(self, event_time_ms: int) -> list[Window]:
        return [Window(event_time_ms, event_time_ms + self.gap_ms)]

    def joins(self, a: Window, b: Window) -> bool:
        return a.touches(b) if self.merge_touching else a.overlaps(b)

    def describe(self) -> str:
        return f"sessions(gap {self.gap_ms} ms{', touching sessions merge' if self.merge_touching else ''})"


def time_grain(windows: WindowFn) -> tuple[int, int]:
    """``(grain, offset)`` such that all event times in one bucket ``[offset + k * grain,
    offset + (k + 1) * grain)`` belong to the same windows: the map hop pre-aggregates each key
    per bucket and the merge hop assigns the bucket's start to windows. Sessions need the exact
    time (a 1 ms grain); the global window needs none (one bucket)."""
    if isinstance(windows, Tumbling):
        return windows.size_ms, windows.offset_ms % windows.size_ms
    if isinstance(windows, Hopping):
        grain = math.gcd(windows.size_ms, windows.slide_ms)
        return grain, windows.offset_ms % grain
    if isinstance(windows, Sessions):
        return 1, 0
    return MAX_TIME, 0


def bucket(event_time_ms: int, grain: tuple[int, int]) -> int:
    size, offset = grain
    return (event_time_ms - offset) // size * size + offset


def merge_overlapping(windows: Iterable[Window], joins: Callable[[Window, Window], bool] = Window.overlaps) -> list[tuple[Window, list[Window]]]:
    """Each maximal union of overlapping windows (``joins``: of windows that merge), with the
    windows it was made of (in order)."""
    merged: list[tuple[Window, list[Window]]] = []
    for window in sorted(set(windows)):
        if merged and joins(merged[-1][0], window):
            span, parts = merged[-1]
            merged[-1] = (span.span(window), [*parts, window])
        else:
            merged.append((window, [window]))
    return merged

"""Fault-injection points that tests switch on through the environment.

``ONCEFLOW_FAULT`` holds comma-separated rules:

- ``<point>@<n>``: SIGKILL this process the n-th time it reaches ``<point>``;
- ``<point>@<n>:stop``: SIGSTOP it there instead, to make a zombie at an exact gap (a test
  starts the replacement, then SIGCONTs it);
- ``random@<probability>@<seed>``: SIGKILL at any point with that probability per hit.

A crash is ``kill -9`` of our own pid: no finally blocks, no flushes, exactly what an operator's
``kill -9`` or the OOM killer does. Named points live where the transaction protocol has a gap
worth testing (see ``POINTS``).

``ONCEFLOW_SABOTAGE`` builds a deliberately broken pipeline, so a checker can prove it fails:

- ``offsets_outside_txn``: the shared loop commits its consumer offsets directly, before the
  transaction's outputs, instead of inside the transaction (a crash between loses the batch);
- ``read_uncommitted``: the shared loop's consumers read aborted transactions' records too;
- ``redis_unchecked``: the Redis stores (the gate's exact ids, the sink's tables) trust Redis
  blindly: no continuity check on writes or deciding reads, so a Redis that went back in time
  lets duplicates through and leaves wrong rows;
- ``postgres_unchecked``: the sink's PostgreSQL tables skip the offset fence (the continuity
  check): a database restored from an older backup is written on as if nothing happened;
- ``sink_drops_acks``: the sink applies result changes but never acks their anchors, so no tree
  behind them completes (proof that ``wait=PROCESSED`` waits for the sink).

``ONCEFLOW_TEST_CLOCK_SKEW_MS`` shifts this process's wall clock, as on a host whose clock is
wrong (``onceflow.codec.now_ms``).

Never set these outside tests: a service refuses to start with any test-only switch (a fault,
a sabotage, a skewed clock, or the processing guarantee ``at_least_once``, however it is spelled: the guard reads
the parsed setting) unless
``ONCEFLOW_ALLOW_TEST_SWITCHES=1`` is set too (the test harness, ``onceflow verify`` and the
bench set it). Every service logs the switches it runs with (``guard_switches``) and its Admin
``Status`` lists them (``test_switches``), so a leftover ``export`` in a shell cannot quietly
turn a pipeline into a broken one.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

POINTS = (
    "before_produce",  # transaction begun, nothing produced
    "after_produce",  # outputs and changelog produced, offsets not sent, not committed
    "after_commit",  # committed, state store not yet updated
    "after_dead_letters",  # sink: dead letters and offsets committed, batch not yet in Redis
    "before_apply",  # sink: about to write a batch to Redis
    "after_apply",  # sink: batch in Redis, its acks not yet sent
    "before_job",  # compute: micro-batch decoded, the engine (Spark) job not yet run
    "after_job",  # compute: the Spark job ran, nothing produced or committed
)

ENV = "ONCEFLOW_FAULT"
SABOTAGE_ENV = "ONCEFLOW_SABOTAGE"
# What `onceflow verify --sabotage` builds: each breaks exactly-once, so its checker must fail.
VERIFY_SABOTAGES = ("offsets_outside_txn", "read_uncommitted", "redis_unchecked", "postgres_unchecked")
# sink_drops_acks keeps exactly-once (trees time out, replays are dropped as duplicates): only
# the wait=PROCESSED test uses it (tests/test_processed.py).
SABOTAGES = (*VERIFY_SABOTAGES, "sink_drops_acks")
ALLOW_ENV = "ONCEFLOW_ALLOW_TEST_SWITCHES"
# Milliseconds added to this process's wall clock (`onceflow.codec.now_ms`): a host whose clock
# is wrong, for the tests and the verify fault that show it cannot move the dedup horizon.
CLOCK_SKEW_ENV = "ONCEFLOW_TEST_CLOCK_SKEW_MS"
# Not a fault, but as weakening: the bench's at-least-once twin of every producer.
GUARANTEE_ENV = "ONCEFLOW_PROCESSING_GUARANTEE"
log = logging.getLogger(__name__)


class _Rules:
    def __init__(self, spec: str) -> None:
        self.at_hit: dict[str, int] = {}
        self.signal_at: dict[str, signal.Signals] = {}
        self.probability = 0.0
        self.rng = random.Random()
        for rule in filter(None, (part.strip() for part in spec.split(","))):
            name, _, rest = rule.partition("@")
            if name == "random":
                probability, _, seed = rest.partition("@")
                self.probability = float(probability)
                self.rng.seed(int(seed or 0))
            else:
                count, _, action = rest.partition(":")
                self.at_hit[name] = int(count or 1)
                self.signal_at[name] = signal.SIGSTOP if action == "stop" else signal.SIGKILL
        self.hits: Counter[str] = Counter()


_rules = _Rules(os.environ.get(ENV, ""))


def point(name: str, before_crash: Callable[[], object] | None = None) -> None:
    """Mark a fault-injection point; crashes here if a rule says so. ``before_crash`` runs first
    when it does: the loops flush their produced records there, so a crash "after produce" leaves
    an open transaction's records on the broker (the case read_committed must hide), not only in
    the client's buffer, where they would die with the process unseen."""
    if not _rules.at_hit and not _rules.probability:
        return
    _rules.hits[name] += 1
    if _rules.at_hit.get(name) == _rules.hits[name]:
        sig = _rules.signal_at[name]
    elif _rules.probability and _rules.rng.random() < _rules.probability:
        sig = signal.SIGKILL
    else:
        return
    if before_crash is not None:
        try:
            before_crash()
        except Exception as exc:  # noqa: BLE001 - the crash comes next either way
            log.warning("fault injection: before the crash at %s: %s", name, exc)
    log.warning("fault injection: %s at %s (hit %d)", sig.name, name, _rules.hits[name])
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), sig)


def reload(spec: str | None = None) -> None:
    """Re-read the rules (unit tests)."""
    global _rules
    _rules = _Rules(os.environ.get(ENV, "") if spec is None else spec)


# Read once, like the fault rules: the loop asks on every batch.
_sabotages = frozenset(os.environ.get(SABOTAGE_ENV, "").split(","))


def sabotaged(name: str) -> bool:
    """Whether the deliberately broken behaviour ``name`` (one of ``SABOTAGES``) is switched on
    (a comma-separated list in ``ONCEFLOW_SABOTAGE``)."""
    assert name in SABOTAGES, name
    return name in _sabotages


@contextmanager
def sabotaging(*names: str) -> Iterator[None]:
    """Within the block this process runs with exactly the sabotages ``names`` (none: none at
    all), whatever ``ONCEFLOW_SABOTAGE`` says; the environment's after it. For a bench that times
    one code path with and without a sabotage in one process (``bench/sink_apply.py``), never for
    a service: a service's sabotages come from its environment, where the guard sees them."""
    global _sabotages
    for name in names:
        assert name in SABOTAGES, name
    saved, _sabotages = _sabotages, frozenset(names)
    try:
        yield
    finally:
        _sabotages = saved


class SwitchesNotAllowed(RuntimeError):
    """A test-only switch is set without the explicit allow setting beside it."""


# The processing guarantee of the settings this process runs with, once service_main has parsed
# them. pydantic takes a setting under any case (`onceflow_processing_guarantee`) and inside a
# group's JSON (`ONCEFLOW_DEDUP_COMMON='{"processing_guarantee": ...}'`), so the environment's
# spelling cannot say which guarantee runs: only the parsed value can (issue 39).
_parsed_guarantee: str | None = None


def note_settings(processing_guarantee: str | None) -> None:
    """Record the parsed ``common.processing_guarantee`` (service_main, while the service runs)
    for the guard and for Status; None: not known."""
    global _parsed_guarantee
    _parsed_guarantee = processing_guarantee


def _guarantee() -> str:
    if _parsed_guarantee is not None:
        return _parsed_guarantee
    # Not started through service_main (a test's in-process server): the common settings as
    # pydantic reads them, which is every spelling but a service group's JSON; the producer
    # itself refuses that one (`txn.producer.open_producer`).
    from pydantic import ValidationError

    from onceflow.config import CommonSettings

    try:
        return CommonSettings().processing_guarantee
    except ValidationError:  # the service itself refuses these settings, with the reason
        return os.environ.get(GUARANTEE_ENV, "exactly_once")


def active_switches() -> list[str]:
    """The test-only switches this process runs with, as ``NAME=value``."""
    switches = [f"{name}={os.environ[name]}" for name in (ENV, SABOTAGE_ENV, CLOCK_SKEW_ENV) if os.environ.get(name)]
    guarantee = _guarantee()
    if guarantee != "exactly_once":
        switches.append(f"{GUARANTEE_ENV}={guarantee}")
    return switches


def refuse_weaker_guarantee(processing_guarantee: str) -> None:
    """The last line: a producer without transactions is built only when explicitly allowed,
    whoever parsed the settings."""
    if processing_guarantee != "exactly_once" and os.environ.get(ALLOW_ENV) != "1":
        raise SwitchesNotAllowed(
            f"{GUARANTEE_ENV}={processing_guarantee}: test-only (a weaker guarantee); a producer is built with it "
            f"only if {ALLOW_ENV}=1 is set too"
        )


def guard_switches(service: str) -> list[str]:
    """Say loudly which test-only switches ``service`` runs with; refuse any that was not
    explicitly allowed. The switches, for Status."""
    switches = active_switches()
    if switches and os.environ.get(ALLOW_ENV) != "1":
        raise SwitchesNotAllowed(
            f"{'; '.join(switches)}: test-only (crashes on purpose, a deliberately broken build, or a weaker "
            f"guarantee); {service} starts with them only if {ALLOW_ENV}=1 is set too. Unset them for a real pipeline"
        )
    if switches:
        log.warning("%s runs with test-only switches: %s", service, "; ".join(switches))
    return switches

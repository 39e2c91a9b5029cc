"""A loop service run in the foreground of a CLI command (`onceflow source kafka`, `onceflow sink
kafka`): a progress line every two seconds until Ctrl-C or SIGTERM, then the exit code."""

from __future__ import annotations

import threading
from collections.abc import Callable

import typer
from rich.console import Console

from onceflow.admin import ServiceServer
from onceflow.runner import Worker, run_loop_service

PROGRESS_S = 2.0


def run_with_progress(
    console: Console, worker: Worker, server: ServiceServer, metrics_port: int, host: str,
    progress: Callable[[], str], summary: Callable[[], str],
) -> None:
    """Run ``worker`` behind ``server`` as the service would, printing ``progress()`` every
    PROGRESS_S and ``summary()`` once it stopped; exits the command with the service's code."""
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_S):
            console.print(progress())

    threading.Thread(target=report, name="progress", daemon=True).start()
    try:
        code = run_loop_service(worker, server, metrics_port, host)
    finally:
        done.set()
    console.print(f"stopped (exit {code}): {summary()}")
    raise typer.Exit(code)

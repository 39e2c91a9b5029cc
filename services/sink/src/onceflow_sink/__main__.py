"""`onceflow-sink` / `python -m onceflow_sink`: run one sink instance: compute.results applied into Redis tables, served by Query."""

from __future__ import annotations

from onceflow import service_main

from onceflow_sink.config import SinkSettings
from onceflow_sink.service import run


def main() -> None:
    service_main.main("sink", "Run one sink instance: compute.results applied into Redis tables, served by Query.", SinkSettings, run)


if __name__ == "__main__":
    main()

"""`onceflow-dedup` / `python -m onceflow_dedup`: run one dedup gate instance: Bloom filters over a fenced exact store in Redis."""

from __future__ import annotations

from onceflow import service_main

from onceflow_dedup.config import DedupSettings
from onceflow_dedup.service import run


def main() -> None:
    service_main.main("dedup", "Run one dedup gate instance: Bloom filters over a fenced exact store in Redis.", DedupSettings, run)


if __name__ == "__main__":
    main()

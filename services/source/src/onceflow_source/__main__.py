"""`onceflow-source` / `python -m onceflow_source`: copy a user's Kafka topic into ingest.records, exactly once."""

from __future__ import annotations

from onceflow import service_main

from onceflow_source.config import SourceSettings
from onceflow_source.service import run


def main() -> None:
    service_main.main(
        "source", "Copy a user's Kafka topic into ingest.records, exactly once (offsets in the same transaction).",
        SourceSettings, run,
    )


if __name__ == "__main__":
    main()

"""`onceflow-ingest` / `python -m onceflow_ingest`: run one ingest instance: the gRPC front door
that commits client records to ingest.records in group transactions."""

from __future__ import annotations

from onceflow import service_main

from onceflow_ingest.config import IngestSettings
from onceflow_ingest.service import IngestService


def main() -> None:
    service_main.main(
        "ingest", "Run one ingest instance: client records committed to ingest.records in group transactions.",
        IngestSettings, lambda settings: IngestService(settings).run(),
    )


if __name__ == "__main__":
    main()

"""`onceflow-ingest` / `python -m onceflow_ingest`: run one ingest instance."""

from __future__ import annotations

import sys

from onceflow import logs

from onceflow_ingest.config import IngestSettings
from onceflow_ingest.service import IngestService


def main() -> None:
    settings = IngestSettings()
    logs.setup("ingest", settings.instance, settings.common.log_level)
    sys.exit(IngestService(settings).run())


if __name__ == "__main__":
    main()

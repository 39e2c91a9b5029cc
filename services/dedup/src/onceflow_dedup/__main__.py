"""`onceflow-dedup` / `python -m onceflow_dedup`: run one dedup gate instance."""

from __future__ import annotations

import sys

from onceflow import logs

from onceflow_dedup.config import DedupSettings
from onceflow_dedup.service import run


def main() -> None:
    settings = DedupSettings()
    logs.setup("dedup", settings.instance, settings.common.log_level)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()

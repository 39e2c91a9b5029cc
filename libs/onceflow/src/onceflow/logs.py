"""Log setup shared by services: one line per event, service and instance in every line."""

from __future__ import annotations

import logging
import sys


def setup(service: str, instance: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)-7s {service}[{instance}] %(name)s: %(message)s",
        force=True,
    )

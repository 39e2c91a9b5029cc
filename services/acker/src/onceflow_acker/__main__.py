"""`onceflow-acker` / `python -m onceflow_acker`: run one acker instance: Storm-style XOR tuple trees over acker.acks."""

from __future__ import annotations

from onceflow import service_main

from onceflow_acker.config import AckerSettings
from onceflow_acker.service import run


def main() -> None:
    service_main.main("acker", "Run one acker instance: Storm-style XOR tuple trees over acker.acks.", AckerSettings, run)


if __name__ == "__main__":
    main()

"""Local infrastructure for development and tests: one Kafka broker (KRaft) and one Redis on
127.0.0.1, driven by ``onceflow infra`` and by test fixtures."""

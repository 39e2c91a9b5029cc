"""onceflow Kafka source: a user's existing topic into ingest.records, exactly once."""

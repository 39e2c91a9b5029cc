"""onceflow ingest service."""

"""onceflow acker service."""

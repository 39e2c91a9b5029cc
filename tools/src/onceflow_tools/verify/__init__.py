"""``onceflow verify``: a chaos campaign over the whole pipeline, and the checker that says
whether every record took effect exactly once (docs/verification.md)."""

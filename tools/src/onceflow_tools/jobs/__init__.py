"""`onceflow job`: a job's versions, deployed beside the live one, promoted, retired
(docs/jobs.md#versions-and-bluegreen, docs/decisions/0024)."""

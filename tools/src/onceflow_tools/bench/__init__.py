"""``onceflow bench``: the pipeline end to end (exactly-once vs at-least-once, a sweep of offered
rates), its hops on a backlog, and the peers a user would otherwise pick (a plain transactional
copier, Quix Streams), all measured side by side in one run (docs/performance.md)."""

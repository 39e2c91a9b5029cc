"""`onceflow console`: the live pipeline as a web page (docs/console.md).

It reads the fleet only through the Admin, Query and per-service admin gRPC calls, and Kafka's
own topics for what the services no longer hold (decided trees, dead letters): no new source
of truth. A poller keeps the last answer of every service, so a service that is down or hangs
costs the page nothing; it shows as DOWN once the fleet deadline has passed."""

"""onceflow's client: send records to a pipeline and read its results (docs/client.md).

    from onceflow_client import IngestClient, QueryClient

    with IngestClient("127.0.0.1:15051") as ingest:
        ingest.ingest([{"record_id": "order-1", "key": "u1", "payload": {"user": "u1", "amount": 5}}],
                      wait="processed")
    with QueryClient("127.0.0.1:15055") as query:
        print(query.get("usersum", "u1"))
"""

from onceflow_client.ingest import AsyncIngestClient, IngestClient, RecordsRejected, Rejection, RetryPolicy
from onceflow_client.query import AsyncQueryClient, Page, QueryClient, decode
from onceflow_client.records import to_record
from onceflow_client.tail import AsyncResultsTail, Change, ResultsTail, TailSnapshot
from onceflow_client.tls import ClientTLS

__all__ = [
    "AsyncIngestClient", "AsyncQueryClient", "AsyncResultsTail", "Change", "ClientTLS", "IngestClient", "Page",
    "QueryClient", "RecordsRejected", "Rejection", "ResultsTail", "RetryPolicy", "TailSnapshot", "decode", "to_record",
]
__version__ = "0.1.0"

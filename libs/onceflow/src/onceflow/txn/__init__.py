"""The shared transactional loop and the stage API."""

from onceflow.txn.batch import Batch, Output, RecordStage, Stage
from onceflow.txn.errors import FencedError, TxnErrorClass, classify
from onceflow.txn.loop import EXIT_FENCED, EXIT_OK, LoopState, TransactionalLoop

__all__ = [
    "EXIT_FENCED",
    "EXIT_OK",
    "Batch",
    "FencedError",
    "LoopState",
    "Output",
    "RecordStage",
    "Stage",
    "TransactionalLoop",
    "TxnErrorClass",
    "classify",
]

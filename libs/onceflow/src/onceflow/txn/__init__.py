"""The shared consumer driver, the transactional loop on it, and the stage API."""

from onceflow.txn.batch import Batch, Output, RecordStage, Stage
from onceflow.txn.driver import ConsumerDriver, LoopState
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART, FencedError, TxnErrorClass, classify
from onceflow.txn.loop import TransactionalLoop

__all__ = [
    "EXIT_FENCED",
    "EXIT_OK",
    "EXIT_RESTART",
    "Batch",
    "ConsumerDriver",
    "FencedError",
    "LoopState",
    "Output",
    "RecordStage",
    "Stage",
    "TransactionalLoop",
    "TxnErrorClass",
    "classify",
]

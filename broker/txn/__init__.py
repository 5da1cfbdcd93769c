"""Kafka's transaction coordinator: transactional ids, their state in `__transaction_state`, the
markers that end each transaction, and the deadlines that abort or forget them."""

from broker.txn.coordinator import (
    InitProducerIdResult,
    ListTransactionsResult,
    TransactionCoordinator,
    TransactionDescription,
    TransactionListing,
    TxnConfig,
)
from broker.txn.state_log import TOPIC
from broker.txn.transaction_metadata import TransactionMetadata, TransactionState, TxnTransit

__all__ = [
    "TOPIC",
    "InitProducerIdResult",
    "ListTransactionsResult",
    "TransactionCoordinator",
    "TransactionDescription",
    "TransactionListing",
    "TransactionMetadata",
    "TransactionState",
    "TxnConfig",
    "TxnTransit",
]

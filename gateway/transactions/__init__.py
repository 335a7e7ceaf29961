"""Transactions (KIP-98): the coordinator's state machine (`coordinator`) and the markers
that end a decided transaction on its partitions (`markers`)."""

from .coordinator import ProducerIdAndEpoch, TransactionCoordinator, TxnError
from .markers import MarkerWriter

__all__ = ["MarkerWriter", "ProducerIdAndEpoch", "TransactionCoordinator", "TxnError"]

"""Transactions (KIP-98): the coordinator's state machine (`coordinator`), the markers
that end a decided transaction on its partitions (`markers`), and the requests held while
they are written (`held`)."""

from .coordinator import ProducerIdAndEpoch, TransactionCoordinator, TxnError
from .markers import MarkerWriter

__all__ = ["MarkerWriter", "ProducerIdAndEpoch", "TransactionCoordinator", "TxnError"]

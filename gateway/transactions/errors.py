"""How a transaction operation fails: with a Kafka error code."""

from __future__ import annotations

from stratalog.gateway.protocol.error_codes import ErrorCode


class TxnError(Exception):
    """An operation answered with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


class BeingCompleted(TxnError):
    """The previous transaction's markers are being written: the request is held until it
    completes (`held`), and told CONCURRENT_TRANSACTIONS if that takes too long."""

    def __init__(self, message: str = "the previous transaction is being completed"):
        super().__init__(ErrorCode.CONCURRENT_TRANSACTIONS, message)

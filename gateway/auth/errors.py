"""What authentication refuses; the SASL handlers map these to Kafka's codes."""

from __future__ import annotations


class AuthenticationFailed(Exception):
    """Wrong credentials or a malformed exchange: SASL_AUTHENTICATION_FAILED, then the
    connection is closed. The message never contains a secret."""


class IllegalSaslState(Exception):
    """A SASL message out of order (ILLEGAL_SASL_STATE)."""

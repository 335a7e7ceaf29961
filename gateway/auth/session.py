"""One connection's authentication: its listener, its principal and the SASL exchange.

On a SASL listener a connection may send only ApiVersions, SaslHandshake and
SaslAuthenticate until an exchange succeeds (the server closes it otherwise); a failed
exchange is answered SASL_AUTHENTICATION_FAILED and the connection closed. Principals are
Kafka's `User:<name>`: the SASL user, the (mapped) certificate subject of an mTLS client,
or `User:ANONYMOUS`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from stratalog.coordinator.model import ScramCredential

from .errors import AuthenticationFailed, IllegalSaslState
from .listeners import Listener
from .scram import MECHANISMS as SCRAM_MECHANISMS, ScramExchange, password_matches

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)


@dataclass(eq=False)
class Session:
    listener: Listener
    principal: str = ANONYMOUS
    authenticated: bool = field(default=False)
    mechanism: str | None = None
    closing: bool = False  # answer the current request, then close
    raw_tokens: bool = False  # after SaslHandshake v0: tokens without request headers
    _scram: ScramExchange | None = None

    def __post_init__(self) -> None:
        self.authenticated = not self.listener.sasl

    def start(self, mechanism: str, enabled: tuple[str, ...], *, raw_tokens: bool = False) -> None:
        """SaslHandshake: choose the mechanism of the exchange that follows (v0: carried in
        bare length-framed tokens, v1: in SaslAuthenticate requests)."""
        if not self.listener.sasl or self.authenticated or self.mechanism is not None:
            raise IllegalSaslState("SaslHandshake is not expected now")
        if mechanism not in enabled:
            raise ValueError(mechanism)
        self.mechanism = mechanism
        self.raw_tokens = raw_tokens
        if mechanism in SCRAM_MECHANISMS:
            self._scram = ScramExchange(mechanism)

    async def step(self, store, token: bytes) -> bytes:
        """One SaslAuthenticate round trip; returns the server's token."""
        if self.mechanism is None or self.authenticated:
            raise IllegalSaslState("SaslAuthenticate without a SaslHandshake first")
        try:
            if self._scram is None:
                return await self._plain(store, token)
            if self._scram.user is None:
                user = self._scram.client_first(token)
                credential = await store.scram_credential(user, self.mechanism)
                if credential is None:
                    raise AuthenticationFailed("invalid credentials")
                return self._scram.server_first(credential)
            reply = self._scram.client_final(token)
            self._authenticated(self._scram.user)
            return reply
        except (AuthenticationFailed, IllegalSaslState):
            self.closing = True
            raise

    async def _plain(self, store, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("malformed PLAIN message")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN message is not UTF-8") from None
        if not user or (authzid and authzid != user):
            raise AuthenticationFailed("PLAIN authorization id differs from the user name")
        credential = await _any_credential(store, user)
        # PBKDF2 takes milliseconds: off the event loop.
        if credential is None or not await asyncio.to_thread(password_matches, credential, password):
            raise AuthenticationFailed("invalid credentials")
        self._authenticated(user)
        return b""

    def _authenticated(self, user: str) -> None:
        self.authenticated = True
        self.raw_tokens = False
        self.principal = f"User:{user}"


async def _any_credential(store, user: str) -> ScramCredential | None:
    """PLAIN passwords are checked against the user's SCRAM credential, strongest first."""
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
        credential = await store.scram_credential(user, mechanism)
        if credential is not None:
            return credential
    return None

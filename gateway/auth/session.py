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
from .oauth import bearer_token
from .scram import MECHANISMS as SCRAM_MECHANISMS, ScramExchange, password_matches

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS, "OAUTHBEARER")


@dataclass(eq=False)
class Session:
    listener: Listener
    principal: str = ANONYMOUS
    authenticated: bool = field(default=False)
    mechanism: str | None = None
    closing: bool = False  # answer the current request, then close
    raw_tokens: bool = False  # after SaslHandshake v0: tokens without request headers
    expires_ms: int | None = None  # when the credentials end (token expiry, connections.max.reauth.ms)
    _previous: str | None = None  # the principal a re-authentication must keep (KIP-368)
    _scram: ScramExchange | None = None

    def __post_init__(self) -> None:
        self.authenticated = not self.listener.sasl

    def start(self, mechanism: str, enabled: tuple[str, ...], *, raw_tokens: bool = False) -> None:
        """SaslHandshake: choose the mechanism of the exchange that follows (v0: carried in
        bare length-framed tokens, v1: in SaslAuthenticate requests)."""
        if not self.listener.sasl or (self.mechanism is not None and not self.authenticated):
            raise IllegalSaslState("SaslHandshake is not expected now")
        if mechanism not in enabled:
            raise ValueError(mechanism)
        if self.authenticated:  # re-authentication (KIP-368): same mechanism, same principal
            if mechanism != self.mechanism or raw_tokens:
                raise IllegalSaslState("re-authentication must use the same mechanism and SaslAuthenticate")
            self._previous, self.authenticated = self.principal, False
        self.mechanism = mechanism
        self.raw_tokens = raw_tokens
        if mechanism in SCRAM_MECHANISMS:
            self._scram = ScramExchange(mechanism)

    async def step(self, store, token: bytes, *, oauth=None, now_ms: int = 0, reauth_ms: int = 0) -> bytes:
        """One SaslAuthenticate round trip; returns the server's token. `oauth` validates
        OAUTHBEARER tokens; `reauth_ms` (connections.max.reauth.ms) bounds every session."""
        if self.mechanism is None or self.authenticated:
            raise IllegalSaslState("SaslAuthenticate without a SaslHandshake first")
        try:
            if self.mechanism == "OAUTHBEARER":
                if oauth is None:
                    raise AuthenticationFailed("OAUTHBEARER is not configured")
                user, expires_ms = await oauth.validate(bearer_token(token))
                self._authenticated(user, now_ms, reauth_ms, expires_ms)
                return b""
            if self._scram is None:
                return await self._plain(store, token, now_ms, reauth_ms)
            if self._scram.user is None:
                user = self._scram.client_first(token)
                credential = await store.scram_credential(user, self.mechanism)
                if credential is None:
                    raise AuthenticationFailed("invalid credentials")
                return self._scram.server_first(credential)
            reply = self._scram.client_final(token)
            self._authenticated(self._scram.user, now_ms, reauth_ms)
            return reply
        except (AuthenticationFailed, IllegalSaslState):
            self.closing = True
            raise

    async def _plain(self, store, token: bytes, now_ms: int, reauth_ms: int) -> bytes:
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
        self._authenticated(user, now_ms, reauth_ms)
        return b""

    def _authenticated(self, user: str, now_ms: int, reauth_ms: int, expires_ms: int | None = None) -> None:
        principal = f"User:{user}"
        if self._previous is not None and principal != self._previous:
            raise AuthenticationFailed(f"re-authentication as {principal} on a connection of {self._previous}")
        if self.mechanism in SCRAM_MECHANISMS:
            self._scram = ScramExchange(self.mechanism)  # fresh, for a re-authentication
        if reauth_ms > 0:
            expires_ms = min(expires_ms, now_ms + reauth_ms) if expires_ms else now_ms + reauth_ms
        self.authenticated, self.raw_tokens, self.principal = True, False, principal
        self.expires_ms, self._previous = expires_ms, None

    def lifetime_ms(self, now_ms: int) -> int:
        """What SaslAuthenticate v1+ tells the client: re-authenticate within this (0: never)."""
        return 0 if self.expires_ms is None else max(1, self.expires_ms - now_ms)

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms >= self.expires_ms


async def _any_credential(store, user: str) -> ScramCredential | None:
    """PLAIN passwords are checked against the user's SCRAM credential, strongest first."""
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
        credential = await store.scram_credential(user, mechanism)
        if credential is not None:
            return credential
    return None

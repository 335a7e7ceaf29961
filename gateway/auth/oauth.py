"""SASL/OAUTHBEARER (RFC 7628) with JWTs checked as Kafka's OAuth validator checks them.

The client's message is a GS2 header and `auth=Bearer <token>` among \\x01-separated
key-value pairs. The token must be a JWT signed by a key of the JWKS at
`sasl.oauthbearer.jwks.endpoint.url` (`file://` or `https://`; reloaded every
`sasl.oauthbearer.jwks.endpoint.refresh.ms` and when a token names an unknown key), with
an `exp` in the future, the expected issuer and audience when those are configured, and
the principal's name in `sasl.oauthbearer.sub.claim.name` (default `sub`). Unsigned
tokens (`alg: none`) and symmetric algorithms are refused.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import jwt

from stratalog.gateway.config import ConfigError

from .errors import AuthenticationFailed

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
UNKNOWN_KEY_RELOAD_S = 10.0  # a token naming an unknown key reloads the JWKS at most this often


def bearer_token(message: bytes) -> str:
    """The token of an RFC 7628 client initial response."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("OAUTHBEARER message is not UTF-8") from None
    gs2, sep, rest = text.partition("\x01")
    if not sep or not gs2.startswith(("n,", "y,")) or not rest.endswith("\x01\x01"):
        raise AuthenticationFailed("malformed OAUTHBEARER message")
    for pair in rest[:-2].split("\x01"):
        key, _, value = pair.partition("=")
        if key == "auth":
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise AuthenticationFailed("OAUTHBEARER auth is not 'Bearer <token>'")
            return token.strip()
    raise AuthenticationFailed("OAUTHBEARER message has no auth=Bearer token")


class JwtValidator:
    def __init__(self, config):
        self.url = config["sasl.oauthbearer.jwks.endpoint.url"]
        if not self.url:
            raise ConfigError("OAUTHBEARER needs sasl.oauthbearer.jwks.endpoint.url (file:// or https://)")
        if urlparse(self.url).scheme not in ("file", "https", "http"):
            raise ConfigError(f"sasl.oauthbearer.jwks.endpoint.url {self.url!r}: use file://, https:// or http://")
        self.issuer = config["sasl.oauthbearer.expected.issuer"] or None
        audience = [a.strip() for a in config["sasl.oauthbearer.expected.audience"].split(",") if a.strip()]
        self.audience = audience or None
        self.sub_claim = config["sasl.oauthbearer.sub.claim.name"]
        self.skew_s = config["sasl.oauthbearer.clock.skew.seconds"]
        self.refresh_s = config["sasl.oauthbearer.jwks.endpoint.refresh.ms"] / 1000
        self._keys: dict[str, jwt.PyJWK] = {}
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()

    def _fetch(self) -> dict[str, jwt.PyJWK]:
        parsed = urlparse(self.url)
        if parsed.scheme == "file":
            text = Path(parsed.path).read_text()
        else:
            with urllib.request.urlopen(self.url, timeout=10) as r:
                text = r.read().decode()
        keys = {}
        for k in jwt.PyJWKSet.from_json(text).keys:
            keys[k.key_id or ""] = k
        return keys

    async def _load(self, *, force: bool) -> None:
        async with self._lock:
            age = time.monotonic() - self._loaded_at
            if age < (UNKNOWN_KEY_RELOAD_S if force else self.refresh_s):
                return
            try:
                self._keys = await asyncio.to_thread(self._fetch)
            except (OSError, ValueError, jwt.PyJWTError) as e:
                raise AuthenticationFailed(f"the JWKS at {self.url} could not be read: {e}") from None
            finally:
                self._loaded_at = time.monotonic()

    async def validate(self, token: str) -> tuple[str, int]:
        """(principal name, expiry in epoch milliseconds) of a valid token."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise AuthenticationFailed(f"not a JWT: {e}") from None
        if header.get("alg") not in ALGORITHMS:
            raise AuthenticationFailed(f"JWT algorithm {header.get('alg')!r} is not accepted")
        kid = header.get("kid") or ""
        await self._load(force=False)
        if kid not in self._keys:
            await self._load(force=True)
        key = self._keys.get(kid) or (next(iter(self._keys.values())) if len(self._keys) == 1 and not kid else None)
        if key is None:
            raise AuthenticationFailed(f"no key {kid!r} in the JWKS")
        try:
            claims = jwt.decode(token, key.key, algorithms=[header["alg"]], audience=self.audience,
                                issuer=self.issuer, leeway=self.skew_s,
                                options={"require": ["exp"], "verify_aud": self.audience is not None})
        except jwt.PyJWTError as e:
            raise AuthenticationFailed(f"JWT refused: {e}") from None
        subject = claims.get(self.sub_claim)
        if not isinstance(subject, str) or not subject:
            raise AuthenticationFailed(f"the JWT has no {self.sub_claim!r} claim")
        return subject, int(claims["exp"] * 1000)


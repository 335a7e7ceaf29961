"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them: the server
side of the exchange, and the credential a password turns into.

The coordinator keeps only a credential (salt, iterations, StoredKey, ServerKey); a client
proves it knows the password without sending it, and the server's final message proves
to the client that the server holds the credential. No channel binding (Kafka offers
none): the GS2 header must be `n,,` or `y,,`, optionally with an authzid equal to the user.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from stratalog.coordinator.model import ScramCredential

from .errors import AuthenticationFailed, IllegalSaslState


@dataclass(frozen=True)
class Mechanism:
    name: str
    hash: str  # hashlib name
    min_iterations: int = 4096  # Kafka's bounds for a stored credential
    max_iterations: int = 16384


MECHANISMS = {m.name: m for m in (Mechanism("SCRAM-SHA-256", "sha256"), Mechanism("SCRAM-SHA-512", "sha512"))}
DEFAULT_ITERATIONS = 8192


def _hmac(mech: Mechanism, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, mech.hash).digest()


def _salted(mech: Mechanism, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(mech.hash, password.encode("utf-8"), salt, iterations)


def make_credential(password: str, mechanism: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """The credential to store for a password; ValueError for a bad mechanism or count."""
    mech = MECHANISMS.get(mechanism)
    if mech is None:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}: {', '.join(MECHANISMS)}")
    if not mech.min_iterations <= iterations <= mech.max_iterations:
        raise ValueError(f"{mechanism} iterations must be {mech.min_iterations}-{mech.max_iterations}, "
                         f"got {iterations}")
    if not password:
        raise ValueError("the password is empty")
    salt = salt if salt is not None else os.urandom(32)
    return credential_from_salted(mechanism, salt, iterations, _salted(mech, password, salt, iterations))


def credential_from_salted(mechanism: str, salt: bytes, iterations: int, salted: bytes) -> ScramCredential:
    """The credential of a salted password (AlterUserScramCredentials sends that, never
    the password itself)."""
    mech = MECHANISMS[mechanism]
    client_key = _hmac(mech, salted, b"Client Key")
    return ScramCredential(mechanism, salt, iterations, hashlib.new(mech.hash, client_key).digest(),
                           _hmac(mech, salted, b"Server Key"))


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from (SASL/PLAIN checks this)."""
    mech = MECHANISMS[credential.mechanism]
    salted = _salted(mech, password, credential.salt, credential.iterations)
    stored = hashlib.new(mech.hash, _hmac(mech, salted, b"Client Key")).digest()
    return hmac.compare_digest(stored, credential.stored_key)


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthenticationFailed(f"malformed SCRAM {what}")
        out.append((part[0], part[2:]))
    return out


def _saslname(value: str) -> str:
    """RFC 5802 5.1: ',' and '=' travel as '=2C' and '=3D'; any other '=' is an error."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "=":
            code = value[i:i + 3]
            if code not in ("=2C", "=3D"):
                raise AuthenticationFailed("malformed SCRAM user name")
            out.append("," if code == "=2C" else "=")
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


class ScramExchange:
    """One server-side exchange: `client_first` names the user, `client_final` proves the
    password; each step either returns the next server message or raises."""

    def __init__(self, mechanism: str):
        self.mech = MECHANISMS[mechanism]
        self.user: str | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._step = 0

    def _advance(self, expected: int, message: bytes, out_of_order: str) -> str:
        """Move to the next step if the exchange is at `expected`; the message as text."""
        if self._step != expected:
            raise IllegalSaslState(out_of_order)
        self._step = expected + 1
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from None

    def client_first(self, message: bytes) -> str:
        """Parse `gs2-header client-first-message-bare`; returns the user name."""
        text = self._advance(0, message, "SCRAM client-first message sent twice")
        cbind, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if cbind not in ("n", "y"):
            raise AuthenticationFailed("SCRAM channel binding is not supported")
        if authzid and not authzid.startswith("a="):
            raise AuthenticationFailed("malformed SCRAM GS2 header")
        self._gs2_header = f"{cbind},{authzid},"
        attrs = _attributes(bare, "client-first message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise AuthenticationFailed("SCRAM client-first message needs n= and r=")
        if len(attrs) > 2:
            raise AuthenticationFailed("SCRAM extensions are not supported")
        self.user = _saslname(attrs[0][1])
        if authzid and _saslname(authzid[2:]) != self.user:
            raise AuthenticationFailed("SCRAM authorization id differs from the user name")
        self._client_first_bare = bare
        self._nonce = attrs[1][1] + secrets.token_urlsafe(24)
        return self.user

    def server_first(self, credential: ScramCredential) -> bytes:
        if credential.mechanism != self.mech.name:
            raise AuthenticationFailed("credential of another mechanism")
        self._credential = credential
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        """Check the proof; returns the server-final message (`v=` server signature)."""
        if not self._server_first:
            raise IllegalSaslState("SCRAM client-final message out of order")
        text = self._advance(1, message, "SCRAM client-final message out of order")
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("SCRAM client-final message has no proof")
        attrs = dict(_attributes(without_proof, "client-final message"))
        if attrs.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise AuthenticationFailed("SCRAM channel binding does not match")
        # Kafka accepts a nonce that ends with the server's: the librdkafka of Debian's kcat
        # sends its own nonce once more in front. The proof covers the message as sent, and
        # the server's fresh nonce must be in it, so a replay still fails.
        if not attrs.get("r", "").endswith(self._nonce):
            raise AuthenticationFailed("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthenticationFailed("SCRAM proof is not base64") from None
        mech, cred = self.mech, self._credential
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(mech, cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(mech.hash, client_key).digest(), cred.stored_key):
            raise AuthenticationFailed("invalid credentials")
        return f"v={base64.b64encode(_hmac(mech, cred.server_key, auth_message)).decode()}".encode()

    @property
    def done(self) -> bool:
        return self._step == 2

"""TLS for SSL and SASL_SSL listeners, with Python's `ssl`, configured with Kafka's names.

`ssl.keystore.location` is a PEM file holding the private key and the certificate chain
(Kafka's `ssl.keystore.type=PEM`), `ssl.key.password` decrypts the key, and
`ssl.truststore.location` is the PEM bundle of CAs that client certificates must chain to
(`ssl.client.auth=requested|required`). TLS 1.2 is the oldest version accepted. The files
are read again when they change (checked as connections are accepted), so a renewed
certificate takes effect for new connections without a restart.

The principal of a client certificate is its subject as an RFC 2253 distinguished name
(`CN=app,OU=eng,O=Example`), rewritten by `ssl.principal.mapping.rules`
(`RULE:pattern/replacement/[LU],DEFAULT`, Kafka's shape).
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from dataclasses import dataclass

from stratalog.gateway.config import ConfigError

log = logging.getLogger(__name__)

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class ServerTls:
    """The SSLContext of a gateway's TLS listeners, rebuilt when its files change."""

    def __init__(self, config):
        self.keystore = config["ssl.keystore.location"]
        self.password = config["ssl.key.password"] or None
        self.truststore = config["ssl.truststore.location"] or None
        self.client_auth = config["ssl.client.auth"]
        if not self.keystore:
            raise ConfigError("a TLS listener needs ssl.keystore.location (a PEM file with the key "
                              "and certificate chain)")
        if self.client_auth != "none" and not self.truststore:
            raise ConfigError(f"ssl.client.auth={self.client_auth} needs ssl.truststore.location")
        self.rules = principal_rules(config["ssl.principal.mapping.rules"])
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.verify_mode = CLIENT_AUTH[self.client_auth]
        self._stamp = self._files_stamp()
        self._load()  # bad files are refused at start, not at the first connection

    def _files_stamp(self) -> tuple:
        return tuple(os.stat(p).st_mtime_ns if os.path.exists(p) else None
                     for p in (self.keystore, self.truststore) if p)

    def _load(self) -> None:
        try:
            self.context.load_cert_chain(self.keystore, password=self.password)
            if self.truststore:
                self.context.load_verify_locations(cafile=self.truststore)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"TLS key store {self.keystore} or trust store {self.truststore}: {e}") from None

    def refresh(self) -> None:
        """Load the files again if they changed: the one context is shared by every TLS
        listener, so the next handshake uses the new certificate. A file caught half
        written keeps the old one until the next try."""
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return
        try:
            self._load()
        except ConfigError as e:
            log.warning("keeping the previous TLS certificate: %s", e)
            return
        self._stamp = stamp
        log.info("reloaded the TLS key store %s", self.keystore)


def subject_dn(peercert: dict | None) -> str | None:
    """RFC 2253 form of a certificate subject from `getpeercert()` (most specific RDN first)."""
    if not peercert or "subject" not in peercert:
        return None
    short = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
             "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
             "domainComponent": "DC", "emailAddress": "EMAILADDRESS", "userId": "UID"}
    rdns = []
    for rdn in reversed(peercert["subject"]):
        rdns.append("+".join(f"{short.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    out = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""


def principal_rules(value: str) -> list[_Rule]:
    rules = []
    rest = value.strip()
    while rest:
        if rest.startswith("DEFAULT"):
            rules.append(_Rule(None))
            rest = rest[len("DEFAULT"):]
        else:
            m = re.match(r"RULE:((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/([LU]?)", rest)
            if m is None:
                raise ConfigError(f"invalid value for ssl.principal.mapping.rules at {rest!r}: "
                                  "expected RULE:pattern/replacement/[LU] or DEFAULT")
            try:
                pattern = re.compile(m.group(1).replace("\\/", "/"))
            except re.error as e:
                raise ConfigError(f"invalid value for ssl.principal.mapping.rules: {e}") from None
            rules.append(_Rule(pattern, m.group(2).replace("\\/", "/"), m.group(3)))
            rest = rest[m.end():]
        rest = rest.lstrip()
        if rest.startswith(","):
            rest = rest[1:].lstrip()
        elif rest:
            raise ConfigError(f"invalid value for ssl.principal.mapping.rules at {rest!r}")
    return rules or [_Rule(None)]


def map_principal(rules: list[_Rule], dn: str) -> str:
    """The user name of a certificate subject: the first rule whose pattern matches it whole."""
    for rule in rules:
        if rule.pattern is None:
            return dn
        m = rule.pattern.fullmatch(dn)
        if m is not None:
            name = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))) or "", rule.replacement)
            return name.lower() if rule.case == "L" else name.upper() if rule.case == "U" else name
    return dn

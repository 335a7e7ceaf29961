"""Listeners as Kafka configures them: `listeners`, `advertised.listeners` and
`listener.security.protocol.map`.

`listeners=PLAINTEXT://127.0.0.1:9092,SECURE://0.0.0.0:9093` with
`listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL` opens two sockets; a
listener's name is what Metadata answers by: a client connected to SECURE is told every
gateway's SECURE address. Without `listeners`, the gateway has one PLAINTEXT listener on
`--listen`, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratalog.gateway.config import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class Listener:
    name: str
    protocol: str  # one of PROTOCOLS
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def _endpoints(value: str, what: str) -> list[tuple[str, str, int]]:
    out = []
    for item in (v.strip() for v in value.split(",") if v.strip()):
        name, sep, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not name or not colon or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"invalid value for {what}: {item!r} is not NAME://HOST:PORT")
        out.append((name.upper(), host.strip("[]"), int(port)))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"invalid value for {what}: a listener name appears twice")
    return out


def protocol_map(value: str) -> dict[str, str]:
    out = {}
    for item in (v.strip() for v in value.split(",") if v.strip()):
        name, sep, protocol = item.partition(":")
        if not sep or protocol.upper() not in PROTOCOLS:
            raise ConfigError(f"invalid value for listener.security.protocol.map: {item!r} is not "
                              f"NAME:PROTOCOL with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name.strip().upper()] = protocol.upper()
    return out


def parse_listeners(config, listen: tuple[str, int]) -> list[Listener]:
    """The listeners to open, the first being the one `--listen`/`--advertised` stand for."""
    value = config["listeners"]
    if not value:
        return [Listener("PLAINTEXT", "PLAINTEXT", *listen)]
    protocols = protocol_map(config["listener.security.protocol.map"])
    listeners = []
    for name, host, port in _endpoints(value, "listeners"):
        if name not in protocols:
            raise ConfigError(f"listener {name} has no entry in listener.security.protocol.map")
        listeners.append(Listener(name, protocols[name], host, port))
    return listeners


def advertised_endpoints(config, bound: list[Listener], advertised: tuple[str, int] | None
                         ) -> dict[str, tuple[str, int]]:
    """Where clients reach each listener: `advertised.listeners`, else `--advertised` for the
    first listener, else the bound address (a wildcard host advertised as 127.0.0.1)."""
    out = {}
    for i, ln in enumerate(bound):
        host = ln.host if ln.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        out[ln.name] = advertised if (i == 0 and advertised is not None) else (host, ln.port)
    value = config["advertised.listeners"]
    if value:
        names = {ln.name for ln in bound}
        for name, host, port in _endpoints(value, "advertised.listeners"):
            if name not in names:
                raise ConfigError(f"advertised.listeners names {name}, which is not in listeners")
            out[name] = (host, port)
    return out

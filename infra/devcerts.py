"""Throwaway certificates for tests and benchmarks: a CA, a server certificate for
127.0.0.1/localhost and a client certificate, as PEM files (the server's key and chain
also in one file, as Kafka's PEM key store takes them). Never for production: the keys
are unencrypted and the CA is made on the spot."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Material:
    ca: Path  # the CA certificate (trust store)
    server: Path  # server key + certificate chain
    client: Path  # client key + certificate
    client_cert: Path
    client_key: Path
    directory: Path
    server_cert: Path
    server_key: Path

    def renew_server(self) -> int:
        """Replace the server's key and certificate (same CA) in place; the new serial."""
        fresh, cert, _ = _issue(self.directory / "renewed", "gateway", self._ca_key, self._ca_cert, server=True)
        tmp = self.server.with_suffix(".tmp")
        tmp.write_bytes(fresh.read_bytes())
        tmp.replace(self.server)
        return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


def _name(cn: str, ou: str = "") -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Stratalog Tests")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _issue(directory: Path, cn: str, ca_key, ca_cert, *, server: bool):
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(cn, "" if server else "apps"))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2)))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = directory / f"{cn}.crt", directory / f"{cn}.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(_pem_key(key))
    both = directory / f"{cn}.pem"
    both.write_bytes(_pem_key(key) + cert_pem)
    return both, cert_path, key_path


def make(directory: Path) -> Material:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_cert = (x509.CertificateBuilder().subject_name(_name("Test CA")).issuer_name(_name("Test CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    ca = directory / "ca.crt"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server, server_cert, server_key = _issue(directory, "gateway", ca_key, ca_cert, server=True)
    client, client_cert, client_key = _issue(directory, "client-app", ca_key, ca_cert, server=False)
    m = Material(ca, server, client, client_cert, client_key, directory, server_cert, server_key)
    m._ca_key, m._ca_cert = ca_key, ca_cert  # type: ignore[attr-defined]
    return m

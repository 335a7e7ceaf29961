"""SCRAM, PLAIN, listener settings and certificate principals, in process."""

from __future__ import annotations

import asyncio
import base64

import pytest

from stratalog.gateway.auth.errors import AuthenticationFailed, IllegalSaslState
from stratalog.gateway.auth.listeners import Listener, advertised_endpoints, parse_listeners
from stratalog.gateway.auth.scram import ScramExchange, make_credential, password_matches
from stratalog.gateway.auth.session import Session
from stratalog.gateway.auth.tls import map_principal, principal_rules, subject_dn
from stratalog.gateway.config import BrokerConfig, ConfigError

pytestmark = pytest.mark.unit

# RFC 7677 section 3: user "user", password "pencil".
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_NONCE = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_exchange() -> ScramExchange:
    ex = ScramExchange("SCRAM-SHA-256")
    assert ex.client_first(RFC_CLIENT_FIRST) == "user"
    ex._nonce = RFC_NONCE  # the RFC's server nonce instead of a random one
    first = ex.server_first(make_credential("pencil", "SCRAM-SHA-256", 4096, salt=RFC_SALT))
    assert first == f"r={RFC_NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    return ex


def test_scram_sha_256_matches_rfc_7677():
    assert _rfc_exchange().client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL


@pytest.mark.parametrize("final, reason", [
    (RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=eHzb"), "invalid credentials"),
    (RFC_CLIENT_FINAL.replace(b"%hvYD", b"%hvYE"), "nonce"),
    (RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), "channel binding"),
    (RFC_CLIENT_FINAL.split(b",p=")[0], "no proof"),
    (RFC_CLIENT_FINAL[:-4] + b"!!!=", "base64"),
    (b"\xff\xfe", "UTF-8"),
])
def test_a_bad_client_final_message_fails(final, reason):
    with pytest.raises(AuthenticationFailed, match=reason):
        _rfc_exchange().client_final(final)


@pytest.mark.parametrize("first, reason", [
    (b"p=tls-unique,,n=user,r=abc", "channel binding"),
    (b"n,,r=abc,n=user", "needs n= and r="),
    (b"n,,n=user,r=", "needs n= and r="),
    (b"n,,n=us=ZZer,r=abc", "user name"),
    (b"n,a=other,n=user,r=abc", "authorization id"),
    (b"n,,n=user,r=abc,e=1", "extensions"),
    (b"n,,garbage", "malformed"),
])
def test_a_bad_client_first_message_fails(first, reason):
    with pytest.raises(AuthenticationFailed, match=reason):
        ScramExchange("SCRAM-SHA-512").client_first(first)


def test_scram_names_are_unescaped_and_steps_go_in_order():
    ex = ScramExchange("SCRAM-SHA-512")
    assert ex.client_first(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=xyz") == "a,b=c"
    with pytest.raises(IllegalSaslState):
        ex.client_first(b"n,,n=user,r=abc")
    with pytest.raises(IllegalSaslState):
        ScramExchange("SCRAM-SHA-512").client_final(RFC_CLIENT_FINAL)


def test_credentials_keep_no_password_and_check_bounds():
    c = make_credential("s3cret", "SCRAM-SHA-512", 4096)
    assert b"s3cret" not in c.salt + c.stored_key + c.server_key
    assert password_matches(c, "s3cret") and not password_matches(c, "s3cret!")
    for bad in (dict(iterations=100), dict(iterations=20000), dict(mechanism="SCRAM-SHA-1")):
        with pytest.raises(ValueError):
            make_credential("pw", **{"mechanism": "SCRAM-SHA-256", "iterations": 4096, **bad})


class Credentials:
    def __init__(self, **users: str):
        self.creds = {(u, m): make_credential(pw, m, 4096) for u, pw in users.items()
                      for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}

    async def scram_credential(self, user, mechanism):
        return self.creds.get((user, mechanism))


SASL = Listener("SECURE", "SASL_SSL", "127.0.0.1", 9093)


@pytest.mark.parametrize("token, ok", [(b"\0bob\0pw-of-bob", True), (b"bob\0bob\0pw-of-bob", True),
                                       (b"\0bob\0wrong", False), (b"\0nobody\0pw", False),
                                       (b"eve\0bob\0pw-of-bob", False), (b"\0bob", False)])
def test_plain_checks_the_password_against_the_scram_credential(token, ok):
    session = Session(SASL)
    session.start("PLAIN", ("PLAIN",))
    if ok:
        assert asyncio.run(session.step(Credentials(bob="pw-of-bob"), token)) == b""
        assert session.authenticated and session.principal == "User:bob"
    else:
        with pytest.raises(AuthenticationFailed):
            asyncio.run(session.step(Credentials(bob="pw-of-bob"), token))
        assert not session.authenticated and session.closing


def test_sessions_refuse_out_of_order_steps():
    plaintext = Session(Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092))
    assert plaintext.authenticated
    with pytest.raises(IllegalSaslState):
        plaintext.start("PLAIN", ("PLAIN",))
    session = Session(SASL)
    with pytest.raises(IllegalSaslState):
        asyncio.run(session.step(Credentials(), b"\0a\0b"))
    with pytest.raises(ValueError):
        session.start("GSSAPI", ("PLAIN",))


def _config(**values) -> BrokerConfig:
    return BrokerConfig({k.replace("_", "."): v for k, v in values.items()})


def test_listeners_follow_kafkas_settings():
    cfg = _config(listeners="PLAINTEXT://0.0.0.0:9092, secure://127.0.0.1:0",
                  listener_security_protocol_map="PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL")
    bound = parse_listeners(cfg, ("127.0.0.1", 1))
    assert [(ln.name, ln.protocol, ln.port, ln.tls, ln.sasl) for ln in bound] == \
        [("PLAINTEXT", "PLAINTEXT", 9092, False, False), ("SECURE", "SASL_SSL", 0, True, True)]
    assert advertised_endpoints(cfg, bound, None) == {"PLAINTEXT": ("127.0.0.1", 9092), "SECURE": ("127.0.0.1", 0)}
    assert advertised_endpoints(cfg, bound, ("gw.example", 19092))["PLAINTEXT"] == ("gw.example", 19092)
    adv = _config(listeners="PLAINTEXT://0.0.0.0:9092", advertised_listeners="PLAINTEXT://kafka.example:443")
    assert advertised_endpoints(adv, parse_listeners(adv, ("x", 1)), None) == {"PLAINTEXT": ("kafka.example", 443)}
    assert parse_listeners(_config(), ("127.0.0.1", 9092)) == [Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]


@pytest.mark.parametrize("values, message", [
    (dict(listeners="SECURE://127.0.0.1:1"), "listener.security.protocol.map"),
    (dict(listeners="PLAINTEXT://127.0.0.1"), "NAME://HOST:PORT"),
    (dict(listeners="PLAINTEXT://a:1,PLAINTEXT://b:2"), "twice"),
    (dict(listeners="X://a:1", listener_security_protocol_map="X:TLS"), "PROTOCOL"),
    (dict(listeners="PLAINTEXT://a:1", advertised_listeners="OTHER://b:2"), "not in listeners"),
])
def test_bad_listener_settings_are_refused(values, message):
    cfg = _config(**values)
    with pytest.raises(ConfigError, match=message):
        advertised_endpoints(cfg, parse_listeners(cfg, ("127.0.0.1", 1)), None)


def test_certificate_subjects_map_to_principals():
    cert = {"subject": ((("organizationName", "Example, Inc"),), (("organizationalUnitName", "eng"),),
                        (("commonName", "App-1"),))}
    dn = subject_dn(cert)
    assert dn == "CN=App-1,OU=eng,O=Example\\, Inc"
    assert map_principal(principal_rules("DEFAULT"), dn) == dn
    rules = principal_rules("RULE:^CN=([^,]+),OU=eng,.*$/$1/L, RULE:^CN=(.*?),.*$/svc-$1/, DEFAULT")
    assert map_principal(rules, dn) == "app-1"
    assert map_principal(rules, "CN=Db,OU=ops,O=X") == "svc-Db"
    assert map_principal(principal_rules("RULE:^OU=(.*)$/$1/U"), dn) == dn  # no match: unchanged
    assert subject_dn(None) is None
    with pytest.raises(ConfigError):
        principal_rules("RULE:(/x")
    with pytest.raises(ConfigError):
        principal_rules("NOPE")


def test_tls_refuses_missing_or_bad_files(tmp_path):
    from stratalog.gateway.auth.tls import ServerTls

    with pytest.raises(ConfigError, match="ssl.keystore.location"):
        ServerTls(_config())
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="junk.pem"):
        ServerTls(_config(ssl_keystore_location=str(tmp_path / "junk.pem")))
    with pytest.raises(ConfigError, match="ssl.truststore.location"):
        ServerTls(_config(ssl_keystore_location=str(tmp_path / "junk.pem"), ssl_client_auth="required"))

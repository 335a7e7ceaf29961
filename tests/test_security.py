"""TLS and SASL against a real `stratalog serve`, with every client's own settings.

One gateway has four listeners: PLAINTEXT, SASL_SSL, SSL (client certificates requested)
and SASL_PLAINTEXT, with certificates made for the test and users added with `stratalog
users`. Each client produces and consumes over SASL_SSL with SCRAM-SHA-512 and with PLAIN,
and over SSL with its own certificate; wrong passwords, requests before authentication,
garbage during the handshake and fuzzed SASL frames get the protocol's answer or a closed
connection while the gateway keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import GatewayProcess
from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.infra.processes import free_port

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
pytest.importorskip("cryptography", reason="cryptography (certificates for the test) is not installed")
from confluent_kafka import Consumer, KafkaError, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from stratalog.infra import devcerts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "alice", "alice-secret-1"
SASL_MECHANISMS = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
ISSUER, AUDIENCE = "https://issuer.test", "stratalog"
KAFKAJS = ROOT / "tests" / "clients" / "kafkajs"
SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_SASL_MECHANISM = 58, 34, 33


def users(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "users", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)


class SecureGateway:
    def __init__(self, tmp: Path, client_auth: str = "requested", proxy_port: int | None = None):
        self.certs = devcerts.make(tmp / "certs")
        self.data_dir = tmp / "data"
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            added = users("add", USER, "--password", PASSWORD, "--mechanism", mechanism, data_dir=self.data_dir)
            assert added.returncode == 0, added.stderr
        self.gw = GatewayProcess(self.data_dir)
        self.ports = {name: free_port() for name in ("SASL_SSL", "SSL", "SASL_PLAINTEXT")}
        self.ports["PLAINTEXT"] = self.gw.port
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.ports.items())
        self.oauth_key, jwks = _signing_key(tmp / "jwks.json")
        self.gw.settings.update({
            "sasl.enabled.mechanisms": ",".join([*SASL_MECHANISMS, "OAUTHBEARER"]),
            "sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
            "sasl.oauthbearer.expected.issuer": ISSUER, "sasl.oauthbearer.expected.audience": AUDIENCE,
            "listeners": listeners, "ssl.keystore.location": str(self.certs.server),
            "ssl.truststore.location": str(self.certs.ca), "ssl.client.auth": client_auth,
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+),.*$/$1/L,DEFAULT"})
        if proxy_port is not None:
            self.gw.settings["advertised.listeners"] = f"SASL_SSL://127.0.0.1:{proxy_port}"

    def __enter__(self) -> "SecureGateway":
        self.gw.start()
        return self

    def __exit__(self, *exc) -> None:
        self.gw.stop()

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def librdkafka(self, protocol: str, mechanism: str | None = None, password: str = PASSWORD) -> dict:
        conf = {"bootstrap.servers": self.address(protocol), "security.protocol": protocol}
        if protocol.endswith("SSL"):
            conf["ssl.ca.location"] = str(self.certs.ca)
        if protocol == "SSL":
            conf.update({"ssl.certificate.location": str(self.certs.client_cert),
                         "ssl.key.location": str(self.certs.client_key)})
        if mechanism:
            conf.update({"sasl.mechanism": mechanism, "sasl.username": USER, "sasl.password": password})
        return conf


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    with SecureGateway(tmp_path_factory.mktemp("secure")) as gw:
        yield gw


def new_topic(gw: SecureGateway, partitions: int = 1) -> str:
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": gw.address("PLAINTEXT")})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    return topic


def plaintext_values(gw: SecureGateway, topic: str, expect: int, timeout: float = 20) -> list[bytes]:
    """What is in the topic, read over the PLAINTEXT listener."""
    c = Consumer({"bootstrap.servers": gw.address("PLAINTEXT"), "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        if expect == 0:
            m = c.poll(2)
            assert m is None or m.error(), "a record arrived"
    finally:
        c.close()
    return got


VALUES = [f"secret-record-{i}".encode() for i in range(5)]


# --- each client over SASL_SSL and SSL ---------------------------------------------------

def _confluent_round_trip(conf: dict, topic: str, values: list[bytes] = VALUES, producing: dict | None = None,
                          consuming: dict | None = None) -> list[bytes]:
    """Produce `values` with acks=all, then what a consumer reads back (in order)."""
    p = Producer({**conf, "acks": "all", **(producing or {})})
    errors = []
    for v in values:
        p.produce(topic, value=v, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(20) == 0 and not errors, errors
    c = Consumer({**conf, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest", **(consuming or {})})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + 20
    while len(got) < len(values) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_confluent_kafka_over_sasl_ssl(secure, mechanism):
    topic = new_topic(secure)
    assert _confluent_round_trip(secure.librdkafka("SASL_SSL", mechanism), topic) == VALUES


def test_confluent_kafka_over_sasl_plaintext(secure):
    topic = new_topic(secure)
    assert _confluent_round_trip(secure.librdkafka("SASL_PLAINTEXT", "SCRAM-SHA-256"), topic) == VALUES


def test_confluent_kafka_over_ssl_with_a_client_certificate(secure):
    topic = new_topic(secure)
    assert _confluent_round_trip(secure.librdkafka("SSL"), topic) == VALUES


def test_a_fetch_of_megabytes_over_ssl_arrives_whole_and_in_order(secure):
    # The gateway encrypts an answer in pieces of TLS_WRITE_BYTES: this answer is many of them.
    values = [os.urandom(200_000) for _ in range(20)]
    got = _confluent_round_trip(secure.librdkafka("SSL"), new_topic(secure), values, {"linger.ms": 50},
                                {"fetch.wait.max.ms": 1000, "fetch.min.bytes": 4_000_000})
    assert got == values


def _kafka_python_conf(gw: SecureGateway, protocol: str, mechanism: str | None) -> dict:
    conf = {"bootstrap_servers": gw.address(protocol), "security_protocol": protocol,
            "ssl_cafile": str(gw.certs.ca)}
    if mechanism:
        conf.update(sasl_mechanism=mechanism, sasl_plain_username=USER, sasl_plain_password=PASSWORD)
    else:
        conf.update(ssl_certfile=str(gw.certs.client_cert), ssl_keyfile=str(gw.certs.client_key))
    return conf


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_SSL", "PLAIN"),
                                                 ("SSL", None)])
def test_kafka_python(secure, protocol, mechanism):
    kafka = pytest.importorskip("kafka", reason="kafka-python is not installed")
    topic = new_topic(secure)
    conf = _kafka_python_conf(secure, protocol, mechanism)
    producer = kafka.KafkaProducer(acks="all", **conf)
    for v in VALUES:
        producer.send(topic, value=v).get(timeout=20)
    producer.close()
    consumer = kafka.KafkaConsumer(topic, group_id=uuid.uuid4().hex, auto_offset_reset="earliest",
                                   consumer_timeout_ms=10000, **conf)
    got = [m.value for _, m in zip(range(len(VALUES)), consumer)]
    consumer.close()
    assert got == VALUES


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_SSL", "PLAIN"),
                                                 ("SSL", None)])
def test_aiokafka(secure, protocol, mechanism):
    aiokafka = pytest.importorskip("aiokafka", reason="aiokafka is not installed")
    from aiokafka.helpers import create_ssl_context

    topic = new_topic(secure)

    async def round_trip():
        context = create_ssl_context(cafile=str(secure.certs.ca),
                                     certfile=None if mechanism else str(secure.certs.client_cert),
                                     keyfile=None if mechanism else str(secure.certs.client_key))
        conf = {"bootstrap_servers": secure.address(protocol), "security_protocol": protocol,
                "ssl_context": context}
        if mechanism:
            conf.update(sasl_mechanism=mechanism, sasl_plain_username=USER, sasl_plain_password=PASSWORD)
        producer = aiokafka.AIOKafkaProducer(acks="all", **conf)
        await producer.start()
        try:
            for v in VALUES:
                await producer.send_and_wait(topic, v)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, group_id=uuid.uuid4().hex, auto_offset_reset="earliest", **conf)
        await consumer.start()
        try:
            got = []
            while len(got) < len(VALUES):
                m = await asyncio.wait_for(consumer.getone(), 20)
                got.append(m.value)
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == VALUES


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_SSL", "PLAIN"),
                                                 ("SSL", None)])
def test_kcat(secure, protocol, mechanism):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed")
    topic = new_topic(secure)
    conf = secure.librdkafka(protocol, mechanism)
    args = [kcat, "-q", "-b", conf.pop("bootstrap.servers")]
    for k, v in conf.items():
        args += ["-X", f"{k}={v}"]
    produced = subprocess.run([*args, "-P", "-t", topic], input="\n".join(v.decode() for v in VALUES) + "\n",
                              capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*args, "-C", "-t", topic, "-e", "-o", "beginning"], capture_output=True,
                              text=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == [v.decode() for v in VALUES]


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "scram-sha-512"), ("SASL_SSL", "plain"),
                                                 ("SSL", None)])
def test_kafkajs(secure, protocol, mechanism):
    if shutil.which("node") is None or not (KAFKAJS / "node_modules" / "kafkajs").is_dir():
        pytest.skip("node or kafkajs is not installed")
    from compat.test_kafkajs import as_rows, run, to_wire

    topic = new_topic(secure)
    security = {"ssl": {"ca": str(secure.certs.ca)}}
    if mechanism:
        security["sasl"] = {"mechanism": mechanism, "username": USER, "password": PASSWORD}
    else:
        security["ssl"].update(cert=str(secure.certs.client_cert), key=str(secure.certs.client_key))
    rows = [(None, v, []) for v in VALUES]
    produced, consumed = run(secure.address(protocol),
                             {"op": "produce", "topic": topic, "records": to_wire(rows)},
                             {"op": "consume", "topic": topic, "groupId": uuid.uuid4().hex, "count": len(VALUES),
                              "timeoutMs": 20000, "lingerMs": 200},
                             security=security)
    assert [p["errorCode"] for p in produced] == [0], produced
    assert [v for _, v, _ in as_rows(consumed)] == VALUES


# --- what is refused -----------------------------------------------------------------------

def test_a_wrong_password_gets_sasl_authentication_failed_and_writes_nothing(secure):
    topic = new_topic(secure)
    p = Producer({**secure.librdkafka("SASL_SSL", "SCRAM-SHA-512", password="wrong"), "acks": "all",
                  "message.timeout.ms": 5000})
    errors = []
    p.produce(topic, value=b"must not land", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert errors and errors[0] is not None
    assert errors[0].code() in (KafkaError._AUTHENTICATION, KafkaError._MSG_TIMED_OUT)
    assert plaintext_values(secure, topic, 0) == []

    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        with Raw(secure, "SASL_SSL") as raw:
            assert raw.handshake(mechanism) == 0
            if mechanism == "PLAIN":
                code, _ = raw.authenticate(f"\0{USER}\0wrong".encode())
            else:
                code, _ = raw.authenticate(b"n,,n=alice,r=abcdefgh")
                assert code == 0
                code, _ = raw.authenticate(b"c=biws,r=abcdefgh-not-the-servers-nonce,p=" + b"A" * 88)
            assert code == SASL_AUTHENTICATION_FAILED
            assert raw.closed()


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(secure):
    with Raw(secure, "SASL_SSL") as raw:
        body = raw.call(17, 1, {"mechanism": "GSSAPI"})
        assert body.error_code == UNSUPPORTED_SASL_MECHANISM
        assert sorted(body.mechanisms) == sorted([*SASL_MECHANISMS, "OAUTHBEARER"])


@pytest.mark.parametrize("listener", ["SASL_SSL", "SASL_PLAINTEXT"])
def test_requests_before_authentication_close_the_connection(secure, listener):
    with Raw(secure, listener) as raw:
        assert raw.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
        raw.send(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                         "include_topic_authorized_operations": False})
        assert raw.closed()
    _still_serving(secure)


def test_garbage_during_the_tls_handshake_closes_only_that_connection(secure):
    for junk in (b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", os.urandom(512), b"\x16\x03\x01\xff\xff" + os.urandom(100)):
        s = socket.create_connection(("127.0.0.1", secure.ports["SASL_SSL"]), timeout=10)
        s.sendall(junk)
        try:
            assert s.recv(4096) is not None  # an alert or EOF, never a hang past the timeout
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    # A plaintext Kafka request to the TLS port gets no Kafka answer.
    s = socket.create_connection(("127.0.0.1", secure.ports["SSL"]), timeout=10)
    s.sendall(encode_request(18, 0, 1, {}))
    try:
        data = s.recv(4096)
        assert not data or data[:1] == b"\x15"  # EOF or a TLS alert
    except ConnectionResetError:
        pass
    s.close()
    _still_serving(secure)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mechanism=st.sampled_from(SASL_MECHANISMS),
       tokens=st.lists(st.one_of(st.binary(max_size=300),
                                 st.text(max_size=120).map(str.encode),
                                 st.sampled_from([b"n,,n=alice,r=x", b"y,,n=alice,r=", b"p=tls,,n=a,r=b",
                                                  b"n,a=bob,n=alice,r=abc", b"n,,n=al=ZZice,r=a",
                                                  b"c=biws,r=x,p=!!!", b"\0alice\0", b"\0\0\0"])),
                       min_size=1, max_size=3))
def test_fuzzed_sasl_frames_never_authenticate_or_kill_the_gateway(secure, mechanism, tokens):
    with Raw(secure, "SASL_PLAINTEXT") as raw:
        assert raw.handshake(mechanism) == 0
        for token in tokens:
            try:
                code, _ = raw.authenticate(token)
            except (ConnectionError, struct.error):
                break
            if code:
                assert code in (SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE)
                assert raw.closed()
                break
        # Whatever was sent, nothing may be done before a complete valid exchange.
        if not raw.closed(timeout=0.05):
            raw.send(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                             "include_topic_authorized_operations": False})
            assert raw.closed()


def test_a_required_client_certificate_is_required(tmp_path):
    with SecureGateway(tmp_path, client_auth="required") as gw:
        conf = gw.librdkafka("SSL")
        topic = new_topic(gw)
        assert _confluent_round_trip(conf, topic) == VALUES
        for key in ("ssl.certificate.location", "ssl.key.location"):
            conf.pop(key)
        p = Producer({**conf, "message.timeout.ms": 4000})
        errors = []
        p.produce(topic, value=b"no certificate", on_delivery=lambda e, m: errors.append(e))
        p.flush(10)
        assert errors and errors[0] is not None
        assert len(plaintext_values(gw, topic, len(VALUES))) == len(VALUES)


def test_no_record_bytes_cross_a_tls_listener_in_the_clear(tmp_path):
    proxy = Recorder(free_port())
    with SecureGateway(tmp_path, proxy_port=proxy.port) as gw:
        proxy.start(gw.ports["SASL_SSL"])
        try:
            topic = new_topic(gw)
            conf = {**gw.librdkafka("SASL_SSL", "SCRAM-SHA-512"), "bootstrap.servers": f"127.0.0.1:{proxy.port}"}
            assert _confluent_round_trip(conf, topic) == VALUES
        finally:
            proxy.stop()
        wire = bytes(proxy.seen)
        assert len(wire) > 1000
        for secret in (*VALUES, PASSWORD.encode(), topic.encode()):
            assert secret not in wire


def test_metadata_advertises_the_listener_the_client_connected_on(secure):
    for listener in ("PLAINTEXT", "SASL_SSL", "SSL"):
        mechanism = "SCRAM-SHA-512" if listener == "SASL_SSL" else None
        meta = AdminClient(secure.librdkafka(listener, mechanism)).list_topics(timeout=15)
        assert [f"{b.host}:{b.port}" for b in meta.brokers.values()] == [secure.address(listener)]


def test_a_renewed_certificate_is_served_without_a_restart(secure):
    from cryptography import x509

    def served_serial() -> int:
        ctx = ssl.create_default_context(cafile=str(secure.certs.ca))
        with socket.create_connection(("127.0.0.1", secure.ports["SASL_SSL"]), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number

    before = served_serial()
    renewed = secure.certs.renew_server()
    assert renewed != before
    served_serial()  # the connection that notices the change still got the old certificate
    assert served_serial() == renewed
    _still_serving(secure)


def test_users_lists_names_and_mechanisms_never_secrets(tmp_path):
    data = tmp_path / "data"
    assert users("add", "bob", "--password", "bobs-password", data_dir=data).returncode == 0
    listed = users("list", data_dir=data)
    assert listed.returncode == 0
    assert "bob" in listed.stdout and "SCRAM-SHA-512" in listed.stdout and "bobs-password" not in listed.stdout
    db = (data / "coordinator.sqlite3").read_bytes()
    assert b"bobs-password" not in db
    assert users("delete", "bob", data_dir=data).returncode == 0
    gone = users("delete", "bob", data_dir=data)
    assert gone.returncode == 1 and "user bob has no credentials" in gone.stderr
    bad = users("add", "carol", "--password", "x", "--iterations", "10", data_dir=data)
    assert bad.returncode == 2 and "iterations" in bad.stderr


def test_a_bad_listener_setting_stops_serve_with_one_line(tmp_path):
    for setting, message in ((f"listeners=SECURE://127.0.0.1:{free_port()}", "listener.security.protocol.map"),
                             (f"listeners=SSL://127.0.0.1:{free_port()}", "ssl.keystore.location"),
                             ("listeners=PLAINTEXT:/nowhere", "NAME://HOST:PORT"),
                             ("sasl.enabled.mechanisms=GSSAPI", "sasl.enabled.mechanisms")):
        out = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--data-dir", str(tmp_path / "d"),
                              "--http", "off", "--set", setting], capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and message in out.stderr, (setting, out.stderr)


# --- OAUTHBEARER and re-authentication --------------------------------------------------

def _signing_key(jwks_path: Path):
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    jwks_path.write_text(json.dumps({"keys": [{**public, "kid": "test-key", "use": "sig", "alg": "RS256"}]}))
    return key, jwks_path


def token(gw: SecureGateway, sub: str = USER, lifetime_s: float = 300, **claims) -> str:
    import jwt

    now = time.time()
    body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": int(now), "exp": now + lifetime_s, **claims}
    return jwt.encode(body, gw.oauth_key, algorithm="RS256", headers={"kid": "test-key"})


def oauth_message(tok: str) -> bytes:
    return f"n,,\x01auth=Bearer {tok}\x01\x01".encode()


def test_confluent_kafka_with_oauthbearer(secure):
    topic = new_topic(secure)

    def refresh(_config):
        return token(secure), time.time() + 300, USER

    conf = {"bootstrap.servers": secure.address("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.certs.ca), "sasl.mechanism": "OAUTHBEARER", "oauth_cb": refresh}
    assert _confluent_round_trip(conf, topic) == VALUES


def test_bad_tokens_are_refused(secure):
    import jwt

    good = token(secure)
    header, payload, _ = good.split(".")
    unsigned = jwt.encode({"sub": USER, "iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 300}, None,
                          algorithm="none")
    other_key, _ = _signing_key(secure.data_dir.parent / "other-jwks.json")
    foreign = jwt.encode({"sub": USER, "iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 300}, other_key,
                         algorithm="RS256", headers={"kid": "test-key"})
    for bad in (token(secure, lifetime_s=-120),  # expired beyond the 30 s skew
                token(secure, iss="https://elsewhere"), token(secure, aud="another-service"),
                unsigned, foreign, f"{header}.{payload}.AAAA", "not-a-jwt",
                token(secure, sub="")):
        with Raw(secure, "SASL_SSL") as raw:
            assert raw.handshake("OAUTHBEARER") == 0
            code, _ = raw.authenticate(oauth_message(bad))
            assert code == SASL_AUTHENTICATION_FAILED, bad
            assert raw.closed()
    with Raw(secure, "SASL_SSL") as raw:
        assert raw.handshake("OAUTHBEARER") == 0
        assert raw.authenticate(oauth_message(good))[0] == 0


def _metadata(raw: Raw) -> None:
    raw.send(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                     "include_topic_authorized_operations": False})


def test_a_session_ends_with_its_token_unless_the_client_re_authenticates(secure):
    with Raw(secure, "SASL_SSL") as raw:
        assert raw.handshake("OAUTHBEARER") == 0
        body = raw.call(36, 2, {"auth_bytes": oauth_message(token(secure, lifetime_s=2))})
        assert body.error_code == 0 and 0 < body.session_lifetime_ms <= 2000
        # Re-authentication on the same connection (KIP-368) extends it...
        assert raw.handshake("OAUTHBEARER") == 0
        body = raw.call(36, 2, {"auth_bytes": oauth_message(token(secure, lifetime_s=300))})
        assert body.error_code == 0 and body.session_lifetime_ms > 200_000
        time.sleep(2.5)
        assert raw.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
        _metadata(raw)
        assert not raw.closed(timeout=0.5)
    with Raw(secure, "SASL_SSL") as raw:
        assert raw.handshake("OAUTHBEARER") == 0
        assert raw.authenticate(oauth_message(token(secure, lifetime_s=1.5)))[0] == 0
        time.sleep(2)
        _metadata(raw)  # ...and without it the connection is closed once the token expired
        assert raw.closed()
    with Raw(secure, "SASL_SSL") as raw:  # a re-authentication may not change the principal
        assert raw.handshake("OAUTHBEARER") == 0
        assert raw.authenticate(oauth_message(token(secure)))[0] == 0
        assert raw.handshake("OAUTHBEARER") == 0
        assert raw.authenticate(oauth_message(token(secure, sub="mallory")))[0] == SASL_AUTHENTICATION_FAILED
        assert raw.closed()


def test_librdkafka_re_authenticates_before_its_token_expires(secure):
    topic = new_topic(secure)
    issued = []

    def refresh(_config):
        issued.append(time.time())
        return token(secure, lifetime_s=3), time.time() + 3, USER

    conf = {"bootstrap.servers": secure.address("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.certs.ca), "sasl.mechanism": "OAUTHBEARER", "oauth_cb": refresh}
    p = Producer({**conf, "acks": "all"})
    errors, delivered = [], []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        p.produce(topic, value=b"x", on_delivery=lambda e, m: errors.append(e) if e else delivered.append(1))
        p.poll(0.2)
    assert p.flush(20) == 0
    assert not errors and len(delivered) > 20
    assert len(issued) >= 2  # the token was refreshed and the connection re-authenticated


# --- helpers ---------------------------------------------------------------------------

def _still_serving(gw: SecureGateway) -> None:
    topic = new_topic(gw)
    assert _confluent_round_trip(gw.librdkafka("SASL_SSL", "SCRAM-SHA-256"), topic) == VALUES


class Raw:
    """One connection speaking the protocol by hand (over TLS on TLS listeners)."""

    def __init__(self, gw: SecureGateway, listener: str):
        self.sock = socket.create_connection(("127.0.0.1", gw.ports[listener]), timeout=10)
        if listener.endswith("SSL"):
            ctx = ssl.create_default_context(cafile=str(gw.certs.ca))
            self.sock = ctx.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.correlation = 0

    def __enter__(self) -> "Raw":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, body: dict) -> None:
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, body))

    def call(self, api_key: int, version: int, body: dict):
        self.send(api_key, version, body)
        (n,) = struct.unpack(">i", self._read(4))
        _, decoded = decode_response(api_key, version, self._read(n))
        return decoded

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def handshake(self, mechanism: str) -> int:
        return self.call(17, 1, {"mechanism": mechanism}).error_code

    def authenticate(self, token: bytes) -> tuple[int, bytes]:
        body = self.call(36, 2, {"auth_bytes": token})
        return body.error_code, body.auth_bytes

    def closed(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True
        except (socket.timeout, TimeoutError):
            return False


class Recorder:
    """A TCP relay that keeps every byte it passes on, in both directions."""

    def __init__(self, port: int):
        self.port = port
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", port))
        self._stopping = False

    def start(self, target: int) -> None:
        self.target = target
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stopping = True
        self._server.close()



def test_cli_commands_take_a_kafka_properties_file(secure, tmp_path):
    props = tmp_path / "client.properties"
    conf = secure.librdkafka("SASL_SSL", "SCRAM-SHA-512")
    props.write_text("# as Kafka's tools take it\n" + "".join(f"{k}={v}\n" for k, v in conf.items()
                                                             if k != "bootstrap.servers"))
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    base = [sys.executable, "-m", "stratalog.infra.cli"]
    conn = ["--bootstrap", conf["bootstrap.servers"], "--command-config", str(props)]
    created = subprocess.run([*base, "topics", "create", topic, *conn], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    listed = subprocess.run([*base, "topics", "list", *conn], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and topic in listed.stdout
    (tmp_path / "bad.properties").write_text("security.protocol\n")
    bad = subprocess.run([*base, "topics", "list", "--bootstrap", conf["bootstrap.servers"],
                          "--command-config", str(tmp_path / "bad.properties")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr


def test_credentials_survive_a_gateway_restart(tmp_path):
    with SecureGateway(tmp_path) as gw:
        topic = new_topic(gw)
        assert _confluent_round_trip(gw.librdkafka("SASL_SSL", "SCRAM-SHA-512"), topic) == VALUES
        gw.gw.stop()
        gw.gw.start()
        again = _confluent_round_trip(gw.librdkafka("SASL_SSL", "PLAIN"), new_topic(gw))
        assert again == VALUES

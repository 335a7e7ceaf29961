"""`stratalog transactions list|describe`: what Kafka's kafka-transactions.sh shows.

confluent-kafka's AdminClient offers neither ListTransactions nor DescribeTransactions, so
these commands send them with the project's own protocol codec over one plain socket per
broker (`Connection`, which also speaks TLS and SASL PLAIN / SCRAM from the same
--command-config properties the librdkafka commands take). As Kafka's admin client does,
`list` asks every broker, since each answers only for the transactional ids it
coordinates, and `describe` asks the id's coordinator (FindCoordinator, key type 1).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import time

from stratalog.gateway.protocol.catalog import APIS, ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.gateway.protocol.schema import Message
from stratalog.gateway.protocol.wire import DecodeError
from stratalog.infra.cli.common import CliError, note, print_table
from stratalog.infra.cli.kafka import Cluster, add_connection_options

# Kafka's transaction states, as ListTransactions and DescribeTransactions name them.
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
          "Dead", "PrepareEpochFence")
_TRANSACTION_KEY_TYPE = 1
# Answers that mean "ask again (perhaps elsewhere) in a moment".
_RETRY = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
_RETRY_PAUSE = 0.2


def add_parser(subparsers) -> None:
    txns = subparsers.add_parser("transactions", help="list and describe transactions",
                                 description="Inspect transactional producers' transactions, as "
                                             "Kafka's kafka-transactions.sh does.")
    actions = txns.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("list", help="every transactional id, its producer id and state",
                           description="List the transactional ids every broker coordinates.")
    p.add_argument("--state", action="append", type=state_name, metavar="STATE", default=[],
                   help=f"only transactions in STATE (repeatable): {', '.join(STATES)}")
    p.add_argument("--producer-id", action="append", type=int, metavar="PID", default=[],
                   help="only the transaction of producer id PID (repeatable)")
    add_connection_options(p)
    p.set_defaults(run=run_list)

    p = actions.add_parser("describe", help="state, producer, timeout, start time and partitions",
                           description="Describe one transactional id, asking its coordinator.")
    p.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    add_connection_options(p)
    p.set_defaults(run=run_describe)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: list or describe")


def state_name(text: str) -> str:
    """argparse type of --state: one of STATES, in any case."""
    for state in STATES:
        if state.lower() == text.lower():
            return state
    raise argparse.ArgumentTypeError(f"unknown state {text!r} (choose from {', '.join(STATES)})")


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


# ---- one connection to one broker -----------------------------------------------------------

class Connection:
    """Requests to one broker through the project's codec: the ApiVersions exchange, then
    TLS and SASL (PLAIN, SCRAM-SHA-256/512) as `security.protocol`, `sasl.*` and `ssl.*`
    of --command-config say. Every failure is a CliError naming the address."""

    # The versions this module knows how to fill in, per API.
    SPOKEN = {
        ApiKey.API_VERSIONS: (0, 0),
        ApiKey.SASL_HANDSHAKE: (1, 1),
        ApiKey.SASL_AUTHENTICATE: (0, 2),
        ApiKey.METADATA: (1, 12),
        ApiKey.FIND_COORDINATOR: (1, 3),
        ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
        ApiKey.LIST_TRANSACTIONS: (0, 1),
    }

    def __init__(self, cluster: Cluster, address: str) -> None:
        self.address = address
        self.timeout = cluster.timeout
        self.correlation = 0
        self.versions: dict[int, tuple[int, int]] = {}
        props = cluster.properties
        protocol = props.get("security.protocol", "plaintext").lower()
        if protocol not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
            raise CliError(f"unknown security.protocol {props['security.protocol']!r}")
        host, port = _split_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout)
        except OSError as exc:
            raise CliError(f"cannot reach a broker at {address} within {self.timeout:g}s: "
                           f"{exc.strerror or exc}") from None
        try:
            if protocol.endswith("ssl"):
                sock = _tls_context(props).wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise CliError(f"TLS with {address} failed: {exc}") from None
        self.sock = sock
        try:
            got = self.call(ApiKey.API_VERSIONS, {})
            if got.error_code:
                raise CliError(f"{address} refused ApiVersions: {_error_name(got.error_code)}")
            self.versions = {k.api_key: (k.min_version, k.max_version) for k in got.api_keys}
            if protocol.startswith("sasl"):
                self._authenticate(props)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def version(self, api: ApiKey) -> int:
        """The highest version of `api` both sides speak."""
        low, high = self.SPOKEN[api]
        if api == ApiKey.API_VERSIONS:
            return low
        theirs = self.versions.get(api)
        if theirs is None or theirs[1] < low or theirs[0] > high:
            raise CliError(f"the broker at {self.address} does not support {APIS[api][0]} "
                           f"(versions {low}-{high})")
        return min(high, theirs[1])

    def call(self, api: ApiKey, body: dict) -> Message:
        version = self.version(api)
        self.correlation += 1
        try:
            self.sock.sendall(encode_request(api, version, self.correlation, body))
            (size,) = struct.unpack(">i", self._read(4))
            correlation, response = decode_response(api, version, self._read(size))
        except TimeoutError:
            raise CliError(f"{APIS[api][0]}: no answer from {self.address} within {self.timeout:g}s") from None
        except (OSError, DecodeError) as exc:
            raise CliError(f"{APIS[api][0]} to {self.address} failed: {exc}") from None
        if correlation != self.correlation:
            raise CliError(f"{APIS[api][0]} to {self.address}: answer to request {correlation}, "
                           f"not {self.correlation}")
        return response

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise OSError("the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def _authenticate(self, props: dict[str, str]) -> None:
        mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI").upper()
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise CliError(f"sasl.mechanism {mechanism} is not supported by this command "
                           f"(PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 are)")
        user, password = props.get("sasl.username", ""), props.get("sasl.password", "")
        got = self.call(ApiKey.SASL_HANDSHAKE, {"mechanism": mechanism})
        if got.error_code:
            raise CliError(f"{self.address} refused SASL mechanism {mechanism}: {_error_name(got.error_code)} "
                           f"(it offers {', '.join(got.mechanisms or []) or 'none'})")
        if mechanism == "PLAIN":
            self._sasl_step(b"\0" + user.encode() + b"\0" + password.encode())
        else:
            _scram(self, mechanism, user, password)

    def _sasl_step(self, token: bytes) -> bytes:
        got = self.call(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": token})
        if got.error_code:
            raise CliError(f"authentication with {self.address} failed: "
                           f"{got.error_message or _error_name(got.error_code)}")
        return bytes(got.auth_bytes or b"")


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def _tls_context(props: dict[str, str]) -> ssl.SSLContext:
    """TLS as librdkafka configures it from the same properties."""
    context = ssl.create_default_context(cafile=props.get("ssl.ca.location") or None)
    verify = props.get("enable.ssl.certificate.verification", "true").lower() != "false"
    context.check_hostname = verify and props.get("ssl.endpoint.identification.algorithm", "https").lower() == "https"
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    if props.get("ssl.certificate.location"):
        context.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location") or None,
                                props.get("ssl.key.password") or None)
    return context


def _scram(conn: Connection, mechanism: str, user: str, password: str) -> None:
    """The client side of RFC 5802 (no channel binding, as Kafka)."""
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    name = user.replace("=", "=3D").replace(",", "=2C")
    nonce = secrets.token_urlsafe(24)
    first_bare = f"n={name},r={nonce}"
    server_first = conn._sasl_step(f"n,,{first_bare}".encode()).decode()
    attrs = dict(part.split("=", 1) for part in server_first.split(",") if "=" in part)
    try:
        server_nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
    except (KeyError, ValueError):
        raise CliError(f"{conn.address} sent a malformed SCRAM challenge") from None
    if not server_nonce.startswith(nonce):
        raise CliError(f"{conn.address} sent a SCRAM challenge for another exchange")
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    final_bare = f"c=biws,r={server_nonce}"
    message = f"{first_bare},{server_first},{final_bare}".encode()
    signature = hmac.new(hashlib.new(digest, client_key).digest(), message, digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    server_final = conn._sasl_step(f"{final_bare},p={proof}".encode()).decode()
    expected = hmac.new(hmac.new(salted, b"Server Key", digest).digest(), message, digest).digest()
    if server_final != "v=" + base64.b64encode(expected).decode():
        raise CliError(f"{conn.address} did not prove it knows the SCRAM credential")


def bootstrap_connection(cluster: Cluster, kind: type[Connection] = Connection) -> Connection:
    """A connection (of `kind`) to the first --bootstrap address that answers."""
    failures = []
    for address in [a for a in cluster.bootstrap.split(",") if a.strip()]:
        try:
            return kind(cluster, address.strip())
        except CliError as exc:
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    raise CliError(f"no broker of {cluster.bootstrap} answered; the last: {failures[-1]}")


def _brokers(conn: Connection) -> list[tuple[int, str]]:
    """(node id, HOST:PORT) of every broker, on the listener `conn` connected on."""
    got = conn.call(ApiKey.METADATA, {"topics": [], "allow_auto_topic_creation": False})
    return sorted((b.node_id, f"{b.host}:{b.port}") for b in got.brokers)


# ---- list -----------------------------------------------------------------------------------

def run_list(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    request = {"state_filters": list(dict.fromkeys(args.state)),
               "producer_id_filters": list(dict.fromkeys(args.producer_id))}
    rows: dict[str, list] = {}
    unknown: set[str] = set()
    with bootstrap_connection(cluster) as first:
        brokers = _brokers(first)
        answered = 0
        for node_id, address in brokers:
            try:
                if address == first.address:
                    got = first.call(ApiKey.LIST_TRANSACTIONS, request)
                else:
                    with Connection(cluster, address) as conn:
                        got = conn.call(ApiKey.LIST_TRANSACTIONS, request)
            except CliError as exc:
                note(f"warning: broker {node_id} did not list its transactions: {exc}")
                continue
            if got.error_code:
                note(f"warning: broker {node_id} did not list its transactions: {_error_name(got.error_code)}")
                continue
            answered += 1
            unknown.update(got.unknown_state_filters or [])
            for t in got.transaction_states or []:
                rows.setdefault(t.transactional_id, [t.transactional_id, t.producer_id, t.transaction_state, node_id])
    if brokers and not answered:
        raise CliError(f"no broker of {len(brokers)} listed its transactions")
    if unknown:
        note(f"warning: the brokers know no state {', '.join(sorted(unknown))}")
    print_table(["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE", "COORDINATOR"], [rows[t] for t in sorted(rows)])
    return 0


# ---- describe -------------------------------------------------------------------------------

def run_describe(args: argparse.Namespace) -> int:
    tid = args.transactional_id
    if not tid:
        raise CliError("the transactional id must not be empty")
    cluster = Cluster.from_args(args)
    deadline = time.monotonic() + cluster.timeout
    with bootstrap_connection(cluster) as first:
        while True:
            node_id, address, state = _ask_coordinator(cluster, first, tid)
            code = state.error_code if state is not None else ErrorCode.COORDINATOR_NOT_AVAILABLE
            if code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                raise CliError(f"transactional id {tid!r} does not exist")
            if code in _RETRY and time.monotonic() < deadline:
                time.sleep(_RETRY_PAUSE)
                continue
            if code or state is None:
                raise CliError(f"cannot describe transactional id {tid!r}: {_error_name(code)}")
            break
    print(f"transactional-id {tid}  state {state.transaction_state}  producer-id {state.producer_id}  "
          f"producer-epoch {state.producer_epoch}  timeout-ms {state.transaction_timeout_ms}  "
          f"start-time {_time(state.transaction_start_time_ms)}  coordinator {node_id} ({address})")
    print()
    topics = sorted(state.topics or [], key=lambda t: t.topic)
    if topics:
        print_table(["TOPIC", "PARTITIONS"],
                    [[t.topic, ",".join(str(p) for p in sorted(t.partitions or []))] for t in topics])
    else:
        print("no partitions in the transaction")
    return 0


def _ask_coordinator(cluster: Cluster, first: Connection, tid: str) -> tuple[int, str, Message | None]:
    """(coordinator id, address, its DescribeTransactions entry or None if it has none yet)."""
    found = first.call(ApiKey.FIND_COORDINATOR, {"key": tid, "key_type": _TRANSACTION_KEY_TYPE})
    if found.error_code in _RETRY:
        return -1, "", None
    if found.error_code:
        raise CliError(f"cannot find the coordinator of transactional id {tid!r}: "
                       f"{found.error_message or _error_name(found.error_code)}")
    address = f"{found.host}:{found.port}"
    request = {"transactional_ids": [tid]}
    if address == first.address:
        got = first.call(ApiKey.DESCRIBE_TRANSACTIONS, request)
    else:
        with Connection(cluster, address) as conn:
            got = conn.call(ApiKey.DESCRIBE_TRANSACTIONS, request)
    states = [s for s in got.transaction_states or [] if s.transactional_id == tid]
    return found.node_id, address, states[0] if states else None


def _time(ms: int) -> str:
    if ms < 0:
        return "-"
    at = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")

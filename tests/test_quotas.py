"""Client quotas: Kafka's entity precedence, the sampled rate and the throttle time it
gives, KIP-599's token bucket, the quota handlers' checks and authorization (in process,
fake clocks); then real gateways and clients: a producer and a consumer held to their
byte rates and told so through throttle_time_ms, a quota set through one gateway of three
limiting a producer on another, and CreateTopics/CreatePartitions/DeleteTopics refused
with THROTTLING_QUOTA_EXCEEDED past controller_mutation_rate."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from types import SimpleNamespace

import pytest

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.store import KVClusterStore
from stratalog.gateway.auth.acls import Authorizer
from stratalog.gateway.handlers import load_handlers
from stratalog.gateway.handlers.registry import HANDLERS, RequestContext
from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.protocol.schema import Message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.quotas import ClientQuotas
from stratalog.gateway.quotas.manager import SWEEP_EVERY
from stratalog.gateway.quotas.rate import TokenBucket, WindowedRate
from raw_client import Raw
from stratalog.gateway.quotas.rules import (CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE,
                                            applicable)

P = PRODUCER_BYTE_RATE
load_handlers()


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---- rules ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_the_eight_levels_apply_in_kafkas_order_with_their_sharing():
    levels = [
        ((("client-id", "c"), ("user", "u")), ("u", "c")),     # 1 user + client id
        ((("client-id", None), ("user", "u")), ("u", "c")),    # 2 user + default client id
        ((("user", "u"),), ("u", "")),                         # 3 user
        ((("client-id", "c"), ("user", None)), ("u", "c")),    # 4 default user + client id
        ((("client-id", None), ("user", None)), ("u", "c")),   # 5 default user + default client
        ((("user", None),), ("u", "")),                        # 6 default user
        ((("client-id", "c"),), ("", "c")),                    # 7 client id
        ((("client-id", None),), ("", "c")),                   # 8 default client id
    ]
    quotas = {entity: {P: float(n)} for n, (entity, _) in enumerate(levels, 1)}
    for n, (entity, tags) in enumerate(levels, 1):
        # With every level from n down set, level n wins, and names who share the usage.
        assert applicable(quotas, P, "u", "c") == (float(n), tags)
        del quotas[entity]
    assert applicable(quotas, P, "u", "c") is None
    # A quota for another user or client id, or another quota type, does not apply.
    other = {(("user", "v"),): {P: 1.0}, (("client-id", "d"),): {P: 1.0}, (("user", "u"),): {CONSUMER_BYTE_RATE: 5.0}}
    assert applicable(other, P, "u", "c") is None
    assert applicable(other, CONSUMER_BYTE_RATE, "u", "c") == (5.0, ("u", ""))


# ---- rates and throttle times -----------------------------------------------------------------

@pytest.mark.unit
def test_the_sampled_rate_counts_from_the_first_byte_and_forgets_old_windows():
    r = WindowedRate(samples=11, window_s=1.0)
    r.record(1000, 0.0)
    assert r.rate(0.0) == pytest.approx(1000.0)  # one request is spread over one window, no more
    assert r.rate(5.0) == pytest.approx(200.0)  # then over the time since it
    for t in range(1, 20):
        r.record(1000, float(t))
    # 11 windows kept (t=9..19, 11 000 bytes), measured from the oldest one's start
    assert r.rate(19.5) == pytest.approx(11000 / 10.5)
    assert r.rate(60.0) == 0.0 and r.idle(60.0)


@pytest.mark.unit
def test_the_throttle_time_is_how_long_until_the_rate_is_back_at_the_quota():
    r = WindowedRate(samples=11, window_s=1.0)
    r.record(300, 0.0)  # one window's worth of 300/s: within it
    assert r.throttle_s(300, 0.0) == 0.0
    r.record(300, 0.5)  # 600 bytes at 300/s take 2 s from the first byte
    assert r.throttle_s(300, 0.5) == pytest.approx(1.5)
    assert r.throttle_s(300, 1.5) == pytest.approx(0.5)
    # 400/s for 12 s (windows starting at t=0..11) against 200/s: at 11.5 the window of 0
    # is forgotten and 4400 bytes are kept, 22 s worth. Each window expires 11 s after its
    # start and takes its 400 bytes along: once that of 6 goes (at 17), the 2000 bytes
    # of 7..11 over the 10 s since 7 are 200/s.
    r2 = WindowedRate(samples=11, window_s=1.0)
    for t in range(12):
        r2.record(400, float(t))
    assert r2.throttle_s(200, 11.5) == pytest.approx(17.0 - 11.5)
    # Kafka's (rate - Q) / Q * span ignores the expiries and says much longer.
    assert r2.throttle_s(200, 11.5) < (r2.rate(11.5) - 200) / 200 * r2.span(11.5)
    # One burst far over the quota is back at it once its window expires.
    r3 = WindowedRate(samples=11, window_s=1.0)
    r3.record(1_000_000, 0.0)
    assert r3.throttle_s(100, 0.0) == pytest.approx(11.0)


@pytest.mark.unit
def test_the_throttle_time_is_exact_and_never_longer_than_kafkas():
    """On random traffic the throttle ends at the first moment the rate is back at the quota
    (not before, not after), at most the whole span later, and is Kafka's (rate - Q) / Q *
    span when no window expires meanwhile."""
    rnd = random.Random(11)
    quota = 1000.0
    for _ in range(200):
        r = WindowedRate(samples=11, window_s=1.0)
        now = 0.0
        for _ in range(rnd.randrange(1, 60)):
            now += rnd.choice([0.001, 0.05, 0.3, 0.9, 2.5])
            r.record(rnd.uniform(0, 3000), now)
        x = r.throttle_s(quota, now)
        assert 0 <= x <= 11.0
        # Kafka's formula (with the span counted from the first byte) when no window
        # expires before it ends: then both agree.
        kafkas = (r.rate(now) - quota) / quota * r.span(now)
        if r.span(now) > 1.0 and (not r._windows or now + kafkas <= r._windows[0][0] + 11.0):
            assert x == pytest.approx(max(0.0, kafkas))
        if x > 1e-3:  # (asked first: asking about a later time forgets old windows)
            assert r.rate(now + x - 1e-3) > quota
        assert r.rate(now + x + 1e-6) <= quota * (1 + 1e-9)


@pytest.mark.unit
def test_the_mutation_bucket_allows_a_burst_then_throttles_until_refilled():
    b = TokenBucket(samples=11, window_s=1.0)
    assert b.throttle_s(2.0, 0.0) == 0.0  # full: 2/s * 11 s = 22 partitions
    b.record(20, 2.0, 0.0)
    assert b.throttle_s(2.0, 0.0) == 0.0
    b.record(10, 2.0, 0.0)  # 8 below zero: 4 s at 2/s
    assert b.throttle_s(2.0, 0.0) == pytest.approx(4.0)
    assert b.throttle_s(2.0, 3.0) == pytest.approx(1.0)
    assert b.throttle_s(2.0, 5.0) == 0.0
    assert not b.idle(5.0) and b.idle(20.0)


def quotas_with(values: dict, clock: Clock) -> ClientQuotas:
    q = ClientQuotas(None, samples=11, window_s=1.0, mutation_samples=11, mutation_window_s=1.0, clock=clock)
    q.quotas = values
    return q


@pytest.mark.unit
def test_the_manager_throttles_per_sharing_group_and_bounds_its_counters():
    clock = Clock()
    q = quotas_with({(("client-id", None),): {P: 100.0, CONSUMER_BYTE_RATE: 50.0}}, clock)
    assert q.record(P, "User:ANONYMOUS", "a", 90) == 0  # 90 bytes in the first second
    assert q.record(P, "User:ANONYMOUS", "a", 30) == 1200  # 120 bytes at 100/s take 1.2 s
    assert q.record(P, "User:bob", "b", 90) == 0  # the default applies to each client id alone
    assert q.record(P, "User:bob", "a", 1) > 0  # but client id a is shared by every user
    assert q.record(REQUEST_PERCENTAGE, "User:bob", "a", 1000) == 0  # no such quota: no counter
    # A fetch may take what is left of 50/s over the span (one window so far): 50 bytes,
    # less what was fetched.
    assert q.fetch_allowance("User:x", "y") == 50 and quotas_with({}, clock).fetch_allowance("User:x", "y") is None
    assert q.record(CONSUMER_BYTE_RATE, "User:x", "y", 20) == 0 and q.fetch_allowance("User:x", "y") == 30
    assert q.record(CONSUMER_BYTE_RATE, "User:x", "y", 40) == 1200 and q.fetch_allowance("User:x", "y") == 1
    assert q.throttled_ms["produce"] > 0 and q.throttled["produce"] == 2
    # Thousands of client ids, 100 a second: counters idle past the whole window (11 s)
    # are dropped, so at most those of the last 11 s plus one sweep interval are held.
    for i in range(6000):
        clock.t += 0.01
        q.record(P, "User:ANONYMOUS", f"client-{i}", 1)
    assert q.counters() <= 1100 + SWEEP_EVERY + 5


@pytest.mark.unit
def test_throttles_are_bounded_as_kafka_bounds_them():
    """A request quota's throttle is at most one window (Kafka's bound); a byte rate's is
    over once every kept window has expired, so at most the whole span."""
    clock = Clock()
    q = quotas_with({(("client-id", "c"),): {REQUEST_PERCENTAGE: 1.0, P: 100.0}}, clock)
    assert q.record(REQUEST_PERCENTAGE, "User:u", "c", 500.0) == 1000
    assert q.record(P, "User:u", "c", 10**9) == 11_000
    clock.t += 11.5
    assert q.record(P, "User:u", "c", 1) == 0  # that burst has expired with its window


@pytest.mark.unit
def test_unrecording_takes_back_a_throttled_fetch():
    clock = Clock()
    q = quotas_with({(("user", "u"),): {CONSUMER_BYTE_RATE: 100.0}}, clock)
    assert q.record(CONSUMER_BYTE_RATE, "User:u", "c", 2000) > 0
    q.unrecord(CONSUMER_BYTE_RATE, "User:u", "c", 2000)
    assert q.record(CONSUMER_BYTE_RATE, "User:u", "c", 100) == 0  # one window's worth, as if fresh


# ---- the handlers, in process ---------------------------------------------------------------

def m(**fields) -> Message:
    return Message(**fields)


def alter_entry(entity: list[tuple[str, str | None]], **ops) -> Message:
    return m(entity=[m(entity_type=t, entity_name=n) for t, n in entity],
             ops=[m(key=k, value=float(v or 0), remove=v is None) for k, v in ops.items()])


@pytest.mark.unit
def test_alter_and_describe_check_entities_values_and_acls(tmp_path):
    async def scenario():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        quotas = ClientQuotas(store, samples=11, window_s=1.0, mutation_samples=11, mutation_window_s=1.0)
        authorizer = Authorizer(store, super_users=frozenset({"User:admin"}), allow_if_no_acl=False)
        await authorizer.reload()
        broker = SimpleNamespace(store=store, quotas=quotas, authorizer=authorizer)

        def ctx(api, principal):
            return RequestContext(broker, api, 1, "cli", "127.0.0.1:5000", 1, SimpleNamespace(principal=principal))

        alter, describe = HANDLERS[ApiKey.ALTER_CLIENT_QUOTAS].fn, HANDLERS[ApiKey.DESCRIBE_CLIENT_QUOTAS].fn
        req = m(entries=[
            alter_entry([("user", "alice")], producer_byte_rate=1024),
            alter_entry([("user", None), ("client-id", "c")], consumer_byte_rate=10),
            alter_entry([("ip", "1.2.3.4")], producer_byte_rate=1),          # unsupported type
            alter_entry([("user", "x")], bogus=1),                           # unknown quota
            alter_entry([("user", "y")], request_percentage=-5),             # not positive
            alter_entry([("user", "z"), ("user", "w")], producer_byte_rate=1),  # type twice
            alter_entry([("client-id", "x" * 2000)], producer_byte_rate=1),  # name too long
        ], validate_only=False)
        refused = await alter(ctx(ApiKey.ALTER_CLIENT_QUOTAS, "User:bob"), req)
        assert {e["error_code"] for e in refused["entries"]} == {ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
        got = await alter(ctx(ApiKey.ALTER_CLIENT_QUOTAS, "User:admin"), req)
        assert [e["error_code"] for e in got["entries"]] == [0, 0] + [ErrorCode.INVALID_REQUEST] * 5
        # In force on this gateway at once (no wait for the watch).
        assert quotas.quotas[(("user", "alice"),)] == {PRODUCER_BYTE_RATE: 1024.0}

        no = await describe(ctx(ApiKey.DESCRIBE_CLIENT_QUOTAS, "User:bob"), m(components=[], strict=False))
        assert no["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        admin = ctx(ApiKey.DESCRIBE_CLIENT_QUOTAS, "User:admin")
        every = await describe(admin, m(components=[], strict=False))
        assert len(every["entries"]) == 2
        users = await describe(admin, m(components=[m(entity_type="user", match_type=2, match=None)], strict=False))
        assert [e["entity"] for e in users["entries"]] == [[{"entity_type": "user", "entity_name": "alice"}]]
        defaults = await describe(admin, m(components=[m(entity_type="user", match_type=1, match=None)], strict=True))
        assert defaults["entries"] == []  # the default user's entry also names a client id
        bad = await describe(admin, m(components=[m(entity_type="ip", match_type=0, match="x")], strict=False))
        assert bad["error_code"] == ErrorCode.INVALID_REQUEST
        await store.close()
    asyncio.run(scenario())


# ---- real gateways and clients -----------------------------------------------------------------

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_fixtures import etcd, leaders, start_cluster  # noqa: E402,F401
from stratalog.infra.cli import main as cli  # noqa: E402
from conftest import GatewayProcess  # noqa: E402
from stratalog.infra.processes import free_port  # noqa: E402

# What a user would measure: bytes acknowledged (or consumed) over the time from the first
# acknowledgement to the last, over a run of many quota windows (1 s each). A client is
# ahead of its quota by at most one window at the start, which it then waits out.
MEASURED_S = 20
VALUE = b"q" * 10_000


def set_quota(bootstrap: str, *entity: str, config: str) -> None:
    assert cli(["quotas", "alter", *entity, "--add-config", config, "--bootstrap", bootstrap]) == 0


def rate_of(got: list[tuple[float, int]]) -> float:
    """Bytes per second from the first arrival to the last."""
    assert len(got) > 1, "nothing arrived"
    return sum(n for _, n in got) / (got[-1][0] - got[0][0])


def produce_for(bootstrap: str, topic: str, client_id: str, seconds: float, partition: int = -1, **conf):
    """Produce as fast as the gateway lets us for `seconds` from the first acknowledgement,
    then flush; (bytes acknowledged per second from the first acknowledgement to the
    last, the throttle times librdkafka reported)."""
    throttles: list[float] = []
    acked: list[tuple[float, int]] = []
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                  "batch.size": 65536, "queue.buffering.max.kbytes": 2048,
                  "throttle_cb": lambda e: throttles.append(e.throttle_time), **conf})

    def delivered(err, msg):
        assert err is None, err
        acked.append((time.monotonic(), len(msg.value())))

    start = time.monotonic()
    while not acked or time.monotonic() < acked[0][0] + seconds:
        assert time.monotonic() < start + seconds + 60, "nothing was acknowledged"
        try:
            p.produce(topic, VALUE, partition=partition, on_delivery=delivered)
        except BufferError:
            p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    return rate_of(acked), throttles


def metric(gw, name: str, label: str) -> float:
    import urllib.request
    text = urllib.request.urlopen(gw.http_url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_producer_is_held_to_its_byte_rate_and_told_so(gateway):
    rate_limit = 500_000
    set_quota(gateway.bootstrap, "--client-id", "slow-producer", config=f"producer_byte_rate={rate_limit}")
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    admin.create_topics([NewTopic("pq", 1)])["pq"].result(30)
    rate, throttles = produce_for(gateway.bootstrap, "pq", "slow-producer", MEASURED_S)
    print(f"producer: {rate / rate_limit:.3f}x its quota, {len(throttles)} throttles up to {max(throttles, default=0):.3f} s")
    assert abs(rate - rate_limit) <= 0.1 * rate_limit, rate
    assert throttles and max(throttles) > 0
    assert metric(gateway, "stratalog_quota_throttle_time_ms", 'quota="produce"') > 0
    # Another client id has no quota: it is not throttled.
    fast, none = produce_for(gateway.bootstrap, "pq", "free-producer", 2)
    assert fast > rate_limit and not none


def test_user_quotas_follow_the_sasl_principal(tmp_path):
    """The user of a quota is the authenticated principal's name: alice is throttled, bob
    (same client id, no quota of his own) is not."""
    data = tmp_path / "sasl-data"
    passwords = {"alice": "alice-pw-1", "bob": "bob-pw-1"}
    for user, password in passwords.items():
        assert cli(["users", "add", user, "--password", password, "--mechanism", "SCRAM-SHA-256",
                    "--data-dir", str(data)]) == 0
    gw = GatewayProcess(data)
    sasl_port = free_port()
    gw.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{gw.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    gw.start()
    try:
        quotas_by_principal(gw.bootstrap, f"127.0.0.1:{sasl_port}", passwords)
    finally:
        gw.stop()


def quotas_by_principal(plain: str, sasl: str, passwords: dict[str, str]) -> None:
    set_quota(plain, "--user", "alice", config="producer_byte_rate=100000")
    admin = AdminClient({"bootstrap.servers": plain})
    admin.create_topics([NewTopic("uq", 1)])["uq"].result(30)

    def as_user(user: str) -> dict:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": user, "sasl.password": passwords[user],
                "queue.buffering.max.kbytes": 256}  # little left to flush at 100 kB/s

    # One window of alice's quota passes before she is throttled; she sends more in 3 s.
    _, alice = produce_for(sasl, "uq", "shared-id", 3, **as_user("alice"))
    _, bob = produce_for(sasl, "uq", "shared-id", 3, **as_user("bob"))
    assert alice and max(alice) > 0
    assert not bob


def test_a_consumer_is_held_to_its_byte_rate_and_told_so(gateway):
    rate_limit = 300_000
    bootstrap = gateway.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("cq", 2)])["cq"].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 65536})
    for _ in range(1000):  # 10 MB: more than the measured span's worth
        while True:
            try:
                p.produce("cq", VALUE)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    set_quota(bootstrap, "--user", "ANONYMOUS", "--client-id", "slow-consumer",
              config=f"consumer_byte_rate={rate_limit}")
    throttles: list[float] = []
    c = Consumer({"bootstrap.servers": bootstrap, "client.id": "slow-consumer", "group.id": "cq-group",
                  "auto.offset.reset": "earliest", "throttle_cb": lambda e: throttles.append(e.throttle_time)})
    c.subscribe(["cq"])
    got: list[tuple[float, int]] = []
    deadline = time.monotonic() + 60 + MEASURED_S
    while time.monotonic() < deadline and (not got or time.monotonic() < got[0][0] + MEASURED_S):
        msg = c.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append((time.monotonic(), len(msg.value())))
    c.close()
    rate = rate_of(got)
    print(f"consumer: {rate / rate_limit:.3f}x its quota, {len(throttles)} throttles up to {max(throttles, default=0):.3f} s")
    assert abs(rate - rate_limit) <= 0.1 * rate_limit, (rate / rate_limit, bursts(got))
    assert throttles and max(throttles) > 0
    assert metric(gateway, "stratalog_quota_throttle_time_ms", 'quota="fetch"') > 0


def bursts(got: list[tuple[float, int]]) -> list[tuple[float, float, int]]:
    """(start, end, bytes) of each run of records with less than a second between them,
    times from the first record: what a failed rate check shows."""
    out: list[list[float]] = []
    first = got[0][0]
    for t, n in got:
        if out and t - out[-1][1] < 1.0:
            out[-1][1], out[-1][2] = t, out[-1][2] + n
        else:
            out.append([t, t, n])
    return [(round(a - first, 2), round(b - first, 2), int(n)) for a, b, n in out]


def test_a_quota_set_through_one_gateway_limits_a_producer_on_another(gateway_factory, etcd, tmp_path):
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3)
    admin = AdminClient({"bootstrap.servers": gws[2].bootstrap})
    admin.create_topics([NewTopic("cluster-q", 3)])["cluster-q"].result(30)
    led = leaders(gws[2].bootstrap, "cluster-q")
    partition = next(p for p, node in sorted(led.items()) if node != 1)  # led away from gateway 1
    rate_limit = 400_000
    set_quota(gws[0].bootstrap, "--client-default", config=f"producer_byte_rate={rate_limit}")
    rate, throttles = produce_for(gws[2].bootstrap, "cluster-q", "anyone", MEASURED_S, partition=partition)
    print(f"producer on another gateway: {rate / rate_limit:.3f}x its quota, {len(throttles)} throttles "
          f"up to {max(throttles, default=0):.3f} s")
    # Leaders before and after: a leader that moved mid-run splits the count over two gateways.
    assert abs(rate - rate_limit) <= 0.1 * rate_limit, (rate, partition, led, leaders(gws[2].bootstrap, "cluster-q"),
                                                        len(throttles))
    assert throttles
    # Enforced by the partition's leader, with the quota set through gateway 1, which
    # served none of the produce requests (each gateway counts its own, as the README says).
    assert metric(gws[led[partition] - 1], "stratalog_quota_throttle_time_ms", 'quota="produce"') > 0
    assert metric(gws[0], "stratalog_quota_throttle_time_ms", 'quota="produce"') == 0


# ---- KIP-599 -----------------------------------------------------------------------------------

def new_topic(name: str, partitions: int) -> dict:
    return {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}


def create(raw: Raw, version: int, *topics: dict):
    return raw.call(ApiKey.CREATE_TOPICS, version, {"topics": list(topics), "timeout_ms": 30000,
                                                    "validate_only": False})


def test_controller_mutations_past_the_quota_are_refused_or_throttled(gateway):
    b = gateway.bootstrap
    set_quota(b, "--client-id", "mutator", config="controller_mutation_rate=1")  # a burst of 11
    raw = Raw(b, "mutator")
    got = create(raw, 7, new_topic("m1", 8), new_topic("m2", 8), new_topic("m3", 1))
    codes = {t.name: t.error_code for t in got.topics}
    # Strict (v6+): m2 is admitted while the budget is not yet spent (3 left), m3 is refused.
    assert codes == {"m1": 0, "m2": 0, "m3": ErrorCode.THROTTLING_QUOTA_EXCEEDED}
    assert 3000 <= got.throttle_time_ms <= 6000  # 5 partitions below zero at 1/s
    raw.close()
    other = Raw(b, "mutator")  # a new connection is not muted; the client's budget is the same
    grow = other.call(ApiKey.CREATE_PARTITIONS, 3, {"topics": [{"name": "m1", "count": 9, "assignments": None}],
                                                    "timeout_ms": 30000, "validate_only": False})
    assert grow.results[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED and grow.throttle_time_ms > 0
    other.close()
    third = Raw(b, "mutator")
    gone = third.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": "m1", "topic_id": uuid.UUID(int=0)}],
                                                "timeout_ms": 30000})
    assert gone.responses[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    third.close()
    # Permissive (CreateTopics v5): done, then throttled.
    old = Raw(b, "mutator")
    late = create(old, 5, new_topic("m4", 2))
    assert late.topics[0].error_code == 0 and late.throttle_time_ms > 0
    old.close()
    names = set(AdminClient({"bootstrap.servers": b}).list_topics(timeout=30).topics)
    assert {"m1", "m2", "m4"} <= names and "m3" not in names
    assert metric(gateway, "stratalog_quota_throttle_time_ms", 'quota="controller_mutation"') > 0
    # Another client id is not limited.
    free = Raw(b, "someone-else")
    assert create(free, 7, new_topic("m5", 20)).topics[0].error_code == 0
    free.close()


def test_request_percentage_throttles_and_mutes_the_connection(gateway):
    """0.05% of the event loop: some tens of Metadata requests spend it. A KIP-219 client
    (Metadata v12) gets throttle_time_ms at once and its next request waits out the mute;
    an older one (v5) gets its answer held back by the throttle time."""
    b = gateway.bootstrap
    set_quota(b, "--client-id", "chatty", config="request_percentage=0.05")
    raw = Raw(b, "chatty")
    body = {"topics": None, "allow_auto_topic_creation": False}
    throttle_ms = 0
    for _ in range(20_000):
        throttle_ms = raw.call(ApiKey.METADATA, 12, body).throttle_time_ms
        if throttle_ms:
            break
    assert 0 < throttle_ms <= 1000  # at most one window, as Kafka bounds it
    started = time.monotonic()
    raw.call(ApiKey.METADATA, 12, body)
    assert time.monotonic() - started >= 0.5 * throttle_ms / 1000  # muted meanwhile
    raw.close()
    old = Raw(b, "chatty")
    started = time.monotonic()
    held = old.call(ApiKey.METADATA, 5, body)
    assert held.throttle_time_ms > 0
    assert time.monotonic() - started >= 0.5 * held.throttle_time_ms / 1000
    old.close()
    assert metric(gateway, "stratalog_quota_throttle_time_ms", 'quota="request"') > 0


def test_stratalog_quotas_alters_describes_and_refuses_bad_input(gateway, capsys):
    b = ["--bootstrap", gateway.bootstrap]
    assert cli(["quotas", "alter", "--user", "alice", "--add-config",
                "producer_byte_rate=1024,consumer_byte_rate=2048", *b]) == 0
    assert cli(["quotas", "alter", "--user-default", "--client-id", "c1", "--add-config",
                "controller_mutation_rate=2", *b]) == 0
    assert cli(["quotas", "alter", "--user", "alice", "--delete-config", "consumer_byte_rate", *b]) == 0
    capsys.readouterr()
    assert cli(["quotas", "describe", *b]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["<default>", "c1", "controller_mutation_rate", "2"], ["alice", "producer_byte_rate", "1024"]]
    assert cli(["quotas", "describe", "--user", "alice", "--strict", *b]) == 0
    assert "controller_mutation_rate" not in capsys.readouterr().out
    assert cli(["quotas", "alter", "--user", "alice", "--add-config", "bogus=1", *b]) == 2
    assert "unknown quota 'bogus'" in capsys.readouterr().err
    assert cli(["quotas", "alter", "--client-id", "x", "--add-config", "request_percentage=-1", *b]) == 1
    assert "must be a positive number" in capsys.readouterr().err
    assert cli(["quotas", "alter", "--add-config", "request_percentage=1", *b]) == 2  # no entity

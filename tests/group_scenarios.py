"""What the consumer-group tests of both protocols share, with confluent-kafka: numbered
records produced idempotently, a group described through the AdminClient, the
"delivered once" check, and the move of a group's coordinator to another gateway of a
3-gateway cluster and back."""

from __future__ import annotations

import time
import uuid
import zlib

from confluent_kafka import ConsumerGroupState, KafkaException, Producer
from confluent_kafka.admin import AdminClient


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Records:
    """Records whose values are their running number, spread round-robin over the
    partitions; idempotent so that a retry after a gateway dies writes nothing twice."""

    def __init__(self, bootstrap: str, partitions: int, flush_timeout: float = 30):
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                  "enable.idempotence": True})
        self.partitions = partitions
        self.flush_timeout = flush_timeout
        self.total = 0

    def produce(self, topic: str, n: int, partitions: int | None = None) -> None:
        for _ in range(n):
            self.producer.produce(topic, value=f"{self.total:06d}".encode(),
                                  partition=self.total % (partitions or self.partitions))
            self.total += 1
        assert self.producer.flush(self.flush_timeout) == 0

    def all_in(self, sink: list, lock) -> bool:
        with lock:
            return len({v for _, _, v in sink}) >= self.total


def stop_all(members) -> None:
    """Ask every member thread to stop (they leave at once, together), then wait for each."""
    for m in members:
        m.stop_flag.set()
    for m in members:
        m.join(20)


def assert_delivered_once(sink: list, total: int) -> None:
    values = [v for _, _, v in sink]
    assert len(set(values)) == total, f"lost {total - len(set(values))} records"
    assert len(values) == total, f"{len(values) - total} records delivered twice"


def describe(bootstrap: str, group: str):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        return admin.describe_consumer_groups([group])[group].result(10)
    except KafkaException:
        return None


def snapshot(d) -> dict[str, frozenset[int]]:
    """Each member's partitions, as the coordinator describes them."""
    return {m.member_id: frozenset(p.partition for p in m.assignment.topic_partitions) for m in d.members}


class CoordinatorMove:
    """A group that the third of three gateways coordinates while all are up, and one of
    the other two (`survivor`) while it is down: the coordinator is a hash over the live
    gateways in id order."""

    def __init__(self, gws: list):
        assert len(gws) == 3
        self.gws = gws
        self.bootstrap = ",".join(g.bootstrap for g in gws)
        self.group = next(g for g in (f"move-{uuid.uuid4().hex[:8]}" for _ in range(100))
                          if zlib.crc32(g.encode()) % 3 == 2)
        self.survivor = (1, 2)[zlib.crc32(self.group.encode()) % 2]

    def wait_until_agreed(self) -> None:
        """start_cluster waits until the gateways see each other; this waits until they
        agree on the group's coordinator too, so that the moves made here are the only ones."""
        def agreed():
            found = [describe(g.bootstrap, self.group) for g in self.gws]
            return all(d is not None and d.coordinator.id == 3 for d in found)
        wait_for(agreed, 30, "every gateway to name the third as the group's coordinator")

    def wait_until_stable(self, check=lambda d: True):
        """The group's description once it is Stable on the third gateway (and `check` holds)."""
        found = None

        def stable():
            nonlocal found
            found = describe(self.bootstrap, self.group)
            return found is not None and found.state == ConsumerGroupState.STABLE and check(found)
        wait_for(stable, 20, "a Stable group")
        assert found.coordinator.id == 3
        return found

    def there_and_back(self, before, produce) -> None:
        """Kill -9 the coordinator, then start it again; each time another gateway must go
        on with the group exactly as `before` described it (members and partitions).
        `produce` runs after each move so that members have records to commit."""
        def continued(bootstrap_now: str, coordinator: int) -> bool:
            d = describe(bootstrap_now, self.group)
            return (d is not None and d.state == ConsumerGroupState.STABLE
                    and snapshot(d) == snapshot(before) and d.coordinator.id == coordinator)
        self.gws[2].kill9()
        produce()
        survivors = ",".join(g.bootstrap for g in self.gws[:2])
        wait_for(lambda: continued(survivors, self.survivor), 40,
                 "a surviving gateway to continue the group")
        self.gws[2].start()
        produce()
        wait_for(lambda: continued(self.bootstrap, 3), 40, "the third gateway to continue it again")

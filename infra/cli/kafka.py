"""Kafka clients for one command: shared options, bounded waits, errors as one line.

Every broker operation is bounded by the command's timeout: a broker that is down or
unreachable turns into a `CliError` naming the address and the first connection error
librdkafka saw, instead of a hang or a log stream on stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata, TopicMetadata

from stratalog.infra.cli.common import CliError, key_value, positive_float

TOPIC_SYNC_ATTEMPTS = 4
TOPIC_SYNC_PAUSE_S = 0.5
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TIMEOUT = 10.0
BOOTSTRAP_ENV = "STRATALOG_BOOTSTRAP"

# Error codes that mean "no broker answered" rather than "the broker said no".
_UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._WAIT_COORD,
}


def add_connection_options(parser: argparse.ArgumentParser, *, timeout: bool = True) -> None:
    """--bootstrap, --command-config and (unless the command defines its own) --timeout."""
    group = parser.add_argument_group("broker connection")
    group.add_argument("--bootstrap", metavar="HOST:PORT",
                       default=os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP,
                       help=f"a broker to connect to (default ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})")
    group.add_argument("--command-config", metavar="FILE|KEY=VALUE", dest="command_config",
                       action="extend", type=client_properties, default=[],
                       help="client properties for librdkafka: a properties FILE (KEY=VALUE lines, as "
                            "Kafka's tools take) or one KEY=VALUE, e.g. security.protocol=SASL_SSL (repeatable)")
    if timeout:
        group.add_argument("--timeout", metavar="SECONDS", type=positive_float, default=DEFAULT_TIMEOUT,
                           help=f"how long to wait for the broker (default {DEFAULT_TIMEOUT:g})")


def client_properties(text: str) -> list[tuple[str, str]]:
    """argparse type of --command-config: KEY=VALUE, or a file of such lines ('#' comments)."""
    if "=" in text:
        return [key_value(text)]
    try:
        lines = Path(text).read_text().splitlines()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is neither KEY=VALUE nor a readable file: "
                                         f"{e.strerror or e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        if "=" not in line:
            raise argparse.ArgumentTypeError(f"{text}:{n}: expected KEY=VALUE, got {line!r}")
        out.append(key_value(line))
    return out


def reason(err: KafkaError | KafkaException | BaseException) -> str:
    """The human part of a Kafka error, without librdkafka's "Broker: " prefix."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    text = err.str() if isinstance(err, KafkaError) else str(err)
    return text.removeprefix("Broker: ")


def error_code(exc: BaseException) -> int | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].code()
    return None


def _unknown(topic: TopicMetadata) -> bool:
    return topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


class Cluster:
    """Builds clients for one broker address and waits on them within one timeout."""

    def __init__(self, bootstrap: str, properties: dict[str, str], timeout: float) -> None:
        if not bootstrap.strip():
            raise CliError("--bootstrap must name at least one HOST:PORT")
        self.bootstrap = bootstrap
        self.properties = properties
        self.timeout = timeout
        self.first_error: KafkaError | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, timeout: float | None = None) -> Cluster:
        properties: dict[str, str] = {}
        for key, value in args.command_config:
            properties[key] = value
        if "bootstrap.servers" in properties:
            raise CliError("give the broker address with --bootstrap, not --command-config bootstrap.servers")
        if timeout is None:
            timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
        return cls(args.bootstrap, properties, timeout)

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    def _on_error(self, err: KafkaError) -> None:
        # librdkafka repeats the same connection error on every retry; the first says it all.
        if self.first_error is None:
            self.first_error = err

    def config(self, defaults: dict | None = None) -> dict:
        """Client properties: ours, then the command's defaults, then --command-config."""
        conf: dict = {
            "bootstrap.servers": self.bootstrap,
            "error_cb": self._on_error,
            # librdkafka accepts no less than one second here.
            "socket.connection.setup.timeout.ms": max(1000, self.timeout_ms),
        }
        if "debug" not in self.properties:
            # Errors reach us through error_cb and results; librdkafka's own log lines
            # would only repeat them on stderr.
            conf["log_level"] = 0
        conf.update(defaults or {})
        conf.update(self.properties)
        return conf

    def _build(self, kind, defaults: dict | None):
        try:
            return kind(self.config(defaults))
        except (KafkaException, ValueError, TypeError) as exc:
            raise CliError(f"bad client configuration: {reason(exc)}") from None

    def admin(self) -> AdminClient:
        return self._build(AdminClient, None)

    def producer(self, defaults: dict | None = None) -> Producer:
        return self._build(Producer, defaults)

    def consumer(self, defaults: dict | None = None) -> Consumer:
        return self._build(Consumer, defaults)

    def unreachable(self, cause: BaseException | None = None) -> CliError:
        detail = reason(self.first_error) if self.first_error is not None else (
            reason(cause) if cause is not None else "no answer")
        return CliError(f"cannot reach a broker at {self.bootstrap} within {self.timeout:g}s: {detail}")

    def metadata(self, client, topic: str | None = None) -> ClusterMetadata:
        """Metadata of every topic, or of `topic` alone; proves the broker answers within
        the timeout. Asked by a producer for one topic, the request lets the broker create
        it when `auto.create.topics.enable` is on (librdkafka's allow.auto.create.topics is
        on for producers), as Kafka's console producer does."""
        try:
            if topic is not None:
                return client.list_topics(topic=topic, timeout=self.timeout)
            return client.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            self._drain(client)
            if error_code(exc) in _UNREACHABLE:
                raise self.unreachable(exc) from None
            raise CliError(f"cannot read cluster metadata: {reason(exc)}") from None

    @staticmethod
    def _drain(client) -> None:
        # error_cb runs only inside poll(); a consumer has nothing assigned yet, so this
        # serves callbacks without taking a message.
        try:
            client.poll(0)
        except (KafkaException, RuntimeError):
            pass

    def existing_topic(self, client, name: str) -> tuple[ClusterMetadata, TopicMetadata]:
        """The cluster's metadata and the topic's; asked again for a moment when the topic is
        missing, since a gateway learns of a topic created through another one within its
        next sync (Kafka's brokers likewise learn of new topics shortly after the controller)."""
        for _ in range(TOPIC_SYNC_ATTEMPTS - 1):
            metadata = self.metadata(client)
            if name in metadata.topics and not _unknown(metadata.topics[name]):
                return metadata, self.topic(metadata, name)
            time.sleep(TOPIC_SYNC_PAUSE_S)
        metadata = self.metadata(client)
        return metadata, self.topic(metadata, name)

    def topic(self, metadata: ClusterMetadata, name: str) -> TopicMetadata:
        """The topic's metadata; a clear error if it does not exist."""
        topic = metadata.topics.get(name)
        if topic is None or _unknown(topic):
            raise CliError(f"topic {name!r} does not exist")
        if topic.error is not None:
            raise CliError(f"topic {name!r}: {reason(topic.error)}")
        return topic

    def wait(self, future: concurrent.futures.Future, action: str):
        """The future's result within the timeout; a failure becomes '<action>: <reason>'."""
        try:
            # librdkafka times the request out itself (request_timeout); the margin only
            # guards against a result that never arrives.
            return future.result(timeout=self.timeout + 5)
        except concurrent.futures.TimeoutError:
            raise CliError(f"{action}: no answer from {self.bootstrap} within {self.timeout:g}s") from None
        except KafkaException as exc:
            if error_code(exc) in _UNREACHABLE:
                raise CliError(f"{action}: {self.unreachable(exc)}") from None
            raise CliError(f"{action}: {reason(exc)}") from None

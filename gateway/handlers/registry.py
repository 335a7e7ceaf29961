"""The registry of API handlers: ApiVersions advertises exactly what is registered here.

A handler is an async function `(ctx, request_body) -> response_body` where the body is
a decoded `Message` and the response is a `Message` or dict that the codec encodes at the
request's version. Handlers never see bytes or sockets. They are registered by name,
`@handles(ApiKey.PRODUCE, 3, 11)`, never by a bare number.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from stratalog.gateway.protocol.catalog import APIS, ApiKey
from stratalog.gateway.protocol.schema import Message

if TYPE_CHECKING:
    from stratalog.gateway.auth.acls import Operation, ResourceType
    from stratalog.gateway.auth.session import Session
    from stratalog.gateway.broker import Broker


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    api_key: ApiKey
    version: int
    client_id: str | None
    peer: str  # "host:port" of the client
    correlation_id: int = -1
    session: "Session | None" = None  # the connection's listener and principal
    request_bytes: int = 0  # the request frame's size (what a produce quota counts)
    throttle_ms: int = 0  # a quota's throttle: the answer carries it, the connection is muted
    # Set once another request arrives on the connection after this one (its answer must
    # wait for this one's): a long poll then answers at once rather than hold it up.
    request_behind: asyncio.Event | None = None

    @property
    def principal(self) -> str:
        return self.session.principal if self.session is not None else "User:ANONYMOUS"

    def throttle(self, ms: int) -> None:
        """Throttle the client for `ms` (the longest of several quotas' throttles wins)."""
        if ms > self.throttle_ms:
            self.throttle_ms = ms

    def allowed(self, operation: "Operation", resource_type: "ResourceType", name: str) -> bool:
        """Whether this connection's principal may do `operation` on the resource (always,
        when ACLs are off)."""
        if self.session is None or self.broker.authorizer is None:
            return True
        host = self.peer.rsplit(":", 1)[0].strip("[]")
        return self.broker.authorizer.allowed(self.session.principal, host, operation, resource_type, name)

    def allowed_any(self, operation: "Operation", resource_type: "ResourceType") -> bool:
        """Whether some resource of the type allows the operation (always, ACLs off)."""
        if self.session is None or self.broker.authorizer is None:
            return True
        host = self.peer.rsplit(":", 1)[0].strip("[]")
        return self.broker.authorizer.allowed_any(self.session.principal, host, operation, resource_type)

    def authorized_operations(self, resource_type: "ResourceType", name: str) -> int:
        """The bit field of the operations this principal may do on the resource (bit n for
        operation code n), as Kafka answers when a request asks for authorized operations."""
        from stratalog.gateway.auth.acls import RESOURCE_OPERATIONS

        return sum(1 << op for op in RESOURCE_OPERATIONS[resource_type] if self.allowed(op, resource_type, name))

    def require(self, operation: "Operation", resource_type: "ResourceType", name: str) -> None:
        """Raise the resource type's *_AUTHORIZATION_FAILED unless `allowed`."""
        if not self.allowed(operation, resource_type, name):
            from stratalog.gateway.auth.acls import refusal
            raise refusal(operation, resource_type, name)

    def __str__(self) -> str:
        """The request as logs name it: `Produce v9 (correlation id 12) from 127.0.0.1:50123`."""
        return (f"{APIS[self.api_key][0]} v{self.version} (correlation id {self.correlation_id})"
                f" from {self.peer}")


HandlerFn = Callable[[RequestContext, Message], Awaitable[Any]]


class Deferred:
    """A response that is ready once `awaitable` completes: the part of a handler's work
    that only waits (a WAL commit for acks=all, a fetch long poll). The server reads the
    connection's next request meanwhile and still answers in request order."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]):
        self.awaitable = awaitable


NO_RESPONSE = object()  # acks=0 produce: the protocol sends nothing back


@dataclass(frozen=True, slots=True)
class Handler:
    api_key: ApiKey
    min_version: int
    max_version: int
    fn: HandlerFn


HANDLERS: dict[ApiKey, Handler] = {}


def handles(api_key: ApiKey, min_version: int, max_version: int) -> Callable[[HandlerFn], HandlerFn]:
    """Register a handler for the versions it answers."""
    if not isinstance(api_key, ApiKey):
        raise TypeError(f"register handlers by ApiKey name, not {api_key!r}")

    def register(fn: HandlerFn) -> HandlerFn:
        HANDLERS[api_key] = Handler(api_key, min_version, max_version, fn)
        return fn

    return register


def supported_versions() -> dict[int, tuple[int, int]]:
    return {k: (h.min_version, h.max_version) for k, h in HANDLERS.items()}

"""Kafka's ACL model and the authorizer that enforces it.

An ACL allows or denies one principal (`User:alice`, or `User:*`) from one host (or `*`)
one operation on resources named literally (`orders`, or `*` for every one) or by prefix
(`orders-`). A request is allowed when no DENY ACL matches and an ALLOW ACL does, where an
ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and ALTER_CONFIGS allows
DESCRIBE_CONFIGS, as in Kafka; ALL matches every operation. `super.users` may do
everything; a resource no ACL names follows `allow.everyone.if.no.acl.found`.

The ACLs live in the coordinator; each gateway keeps them in memory and reloads them when
its watch on them fires, so a change made through any gateway counts on all of them at
once (within the watch's delivery time).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from stratalog.coordinator.model import AclBinding
from stratalog.gateway.config import ConfigError
from stratalog.gateway.following import Following



class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


# The operations each resource type has, as Kafka lists them in the `authorized_operations`
# bit fields of Metadata, DescribeCluster, DescribeGroups and ConsumerGroupDescribe.
RESOURCE_OPERATIONS: dict[ResourceType, tuple["Operation", ...]] = {}


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


RESOURCE_OPERATIONS.update({
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
                         Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE),
})


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name, as Kafka's
WILDCARD = "*"

# An ALLOW of the key also allows these (Kafka's implied operations).
IMPLIES: dict[int, set[Operation]] = {Operation.READ: {Operation.DESCRIBE}, Operation.WRITE: {Operation.DESCRIBE},
           Operation.DELETE: {Operation.DESCRIBE}, Operation.ALTER: {Operation.DESCRIBE},
           Operation.ALTER_CONFIGS: {Operation.DESCRIBE_CONFIGS}}


def refusal(operation: Operation, rtype: ResourceType, name: str) -> Exception:
    """The KafkaError that answers a denied operation on a resource."""
    from stratalog.gateway.errors import KafkaError
    from stratalog.gateway.protocol.error_codes import ErrorCode

    code = {ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
            ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            }.get(rtype, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    return KafkaError(code, f"{operation.name} on {rtype.name.lower()} {name!r} is not allowed")


class InvalidAcl(ValueError):
    """An ACL that cannot be stored (unknown or ANY/MATCH values, a bad principal or host)."""


def check_binding(b: AclBinding) -> None:
    """Refuse what Kafka refuses in CreateAcls."""
    try:
        rtype, pattern = ResourceType(b.resource_type), PatternType(b.pattern_type)
        op, perm = Operation(b.operation), Permission(b.permission)
    except ValueError as e:
        raise InvalidAcl(str(e)) from None
    if rtype in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAcl(f"resource type {rtype.name} cannot be stored")
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"pattern type {pattern.name} cannot be stored")
    if op in (Operation.UNKNOWN, Operation.ANY) or perm in (Permission.UNKNOWN, Permission.ANY):
        raise InvalidAcl("operation and permission must be specific")
    if not b.resource_name:
        raise InvalidAcl("the resource name is empty")
    if rtype == ResourceType.CLUSTER and (b.resource_name != CLUSTER_NAME or pattern != PatternType.LITERAL):
        raise InvalidAcl(f"the cluster resource is the literal {CLUSTER_NAME!r}")
    kind, sep, name = b.principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAcl(f"principal {b.principal!r} is not TYPE:NAME (e.g. User:alice)")
    if b.host != WILDCARD:
        try:
            ipaddress.ip_address(b.host)
        except ValueError:
            raise InvalidAcl(f"host {b.host!r} is not an IP address or '*'") from None


@dataclass(frozen=True)
class AclFilter:
    """DescribeAcls/DeleteAcls filters: None (or ANY) matches every value."""

    resource_type: int = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: int = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = Operation.ANY
    permission: int = Permission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if self.operation != Operation.ANY and b.operation != self.operation:
            return False
        if self.permission != Permission.ANY and b.permission != self.permission:
            return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.pattern_type == PatternType.MATCH:
            # Every ACL that would apply to the named resource: literal, wildcard, prefix.
            return self.resource_name is None or _names(b, self.resource_name)
        if self.pattern_type != PatternType.ANY and b.pattern_type != self.pattern_type:
            return False
        return self.resource_name is None or b.resource_name == self.resource_name


def _names(b: AclBinding, name: str) -> bool:
    if b.pattern_type == PatternType.LITERAL:
        return b.resource_name in (name, WILDCARD)
    return b.pattern_type == PatternType.PREFIXED and name.startswith(b.resource_name)


def parse_super_users(value: str) -> frozenset[str]:
    users = frozenset(u.strip() for u in value.split(";") if u.strip())
    for u in users:
        if ":" not in u:
            raise ConfigError(f"invalid value for super.users: {u!r} is not User:NAME")
    return users


class Authorizer:
    """Answers `allowed(principal, host, operation, resource type, name)` from the ACLs it
    keeps in memory, reloaded from the coordinator whenever they change."""

    def __init__(self, store, *, super_users: frozenset[str], allow_if_no_acl: bool):
        self.store = store
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self.bindings: list[AclBinding] = []
        self._by_type: dict[int, list[AclBinding]] = {}
        self._following = Following("ACL", lambda: self.store.watch_acls(), self.reload)

    async def start(self) -> None:
        await self._following.start()

    async def stop(self) -> None:
        await self._following.stop()

    async def reload(self) -> None:
        self._set(await self.store.acls())

    def _set(self, bindings: list[AclBinding]) -> None:
        by_type: dict[int, list[AclBinding]] = {}
        for b in bindings:
            by_type.setdefault(b.resource_type, []).append(b)
        self.bindings, self._by_type = bindings, by_type

    def allowed(self, principal: str, host: str, operation: Operation, rtype: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        named = [b for b in self._by_type.get(rtype, ()) if _names(b, name)]
        if not named:
            return self.allow_if_no_acl
        mine = [b for b in named if b.principal in (principal, "User:*") and b.host in (host, WILDCARD)]
        if any(b.permission == Permission.DENY and b.operation in (operation, Operation.ALL) for b in mine):
            return False
        return any(b.permission == Permission.ALLOW
                   and (b.operation in (operation, Operation.ALL) or operation in IMPLIES.get(b.operation, set()))
                   for b in mine)

    def allowed_any(self, principal: str, host: str, operation: Operation, rtype: ResourceType) -> bool:
        """Whether some resource of the type allows the operation (Kafka's
        authorizeByResourceType: an idempotent producer needs WRITE on some topic)."""
        if principal in self.super_users:
            return True
        of_type = self._by_type.get(rtype, ())
        if not of_type:
            return self.allow_if_no_acl
        mine = [b for b in of_type if b.principal in (principal, "User:*") and b.host in (host, WILDCARD)]
        if any(b.permission == Permission.DENY and b.operation in (operation, Operation.ALL)
               and b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD for b in mine):
            return False
        return any(b.permission == Permission.ALLOW and b.operation in (operation, Operation.ALL) for b in mine)

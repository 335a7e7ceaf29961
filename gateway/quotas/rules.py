"""Which client quota applies to a request, by Kafka's entity rules (KIP-55).

A quota is set on an entity: a user, a client id, or both, where either name may be the
type's default (`<default>`, None here). For a request from (user, client id) the first
entity below with a value for the quota type wins:

    1. user + client id          5. default user + default client id
    2. user + default client id  6. default user
    3. user                      7. client id
    4. default user + client id  8. default client id

The winning level also says who shares the usage counted against it (the metric tags):
levels naming a client id (1, 2, 4, 5) count each (user, client id) pair on its own,
the user levels (3, 6) each user over all its client ids, and the client-id levels (7, 8)
each client id over all users. A default is a value for each one, never a shared pool.
"""

from __future__ import annotations

from typing import Mapping

USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (CLIENT_ID, USER)  # sorted: the order entities are written in

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE)

Entity = tuple[tuple[str, str | None], ...]  # ((type, name or None for the default), ...), sorted
Tags = tuple[str, str]  # (user, client id) that share one usage counter; "" where not part of it


def entity(user: str | None = "", client_id: str | None = "", *, has_user: bool = False,
           has_client: bool = False) -> Entity:
    """An entity from its parts: `entity(user="alice", has_user=True)`; None is the default."""
    parts = []
    if has_client:
        parts.append((CLIENT_ID, client_id))
    if has_user:
        parts.append((USER, user))
    return tuple(parts)


def _levels(user: str, client_id: str) -> list[tuple[Entity, Tags]]:
    both, users, clients = (user, client_id), (user, ""), ("", client_id)
    return [
        (((CLIENT_ID, client_id), (USER, user)), both),
        (((CLIENT_ID, None), (USER, user)), both),
        (((USER, user),), users),
        (((CLIENT_ID, client_id), (USER, None)), both),
        (((CLIENT_ID, None), (USER, None)), both),
        (((USER, None),), users),
        (((CLIENT_ID, client_id),), clients),
        (((CLIENT_ID, None),), clients),
    ]


def applicable(quotas: Mapping[Entity, Mapping[str, float]], key: str, user: str,
               client_id: str) -> tuple[float, Tags] | None:
    """The value of quota `key` for a request from `user` (the principal's name) with
    `client_id`, and who shares its usage; None when no entity sets it."""
    if not quotas:
        return None
    for ent, tags in _levels(user, client_id):
        values = quotas.get(ent)
        if values is not None and key in values:
            return values[key], tags
    return None


MAX_NAME_BYTES = 1024  # an entity name: it becomes part of a coordinator key


class InvalidQuota(ValueError):
    """An entity or quota value AlterClientQuotas must refuse (INVALID_REQUEST)."""


def check_entity(ent: Entity) -> None:
    """Refuse entities Kafka refuses: unknown or repeated types, none at all. (Kafka's ip
    entities, KIP-612's connection rate, are not supported here.)"""
    types = [t for t, _ in ent]
    if not types:
        raise InvalidQuota("the entity names no entity type")
    if len(set(types)) != len(types):
        raise InvalidQuota(f"entity type {types[0]!r} appears more than once")
    for t, name in ent:
        if t not in ENTITY_TYPES:
            raise InvalidQuota(f"unknown entity type {t!r}; this gateway supports user and client-id")
        if name is not None and len(name.encode()) > MAX_NAME_BYTES:
            raise InvalidQuota(f"a {t} name is longer than {MAX_NAME_BYTES} bytes")


def check_value(key: str, value: float) -> None:
    """Refuse unknown quota names and values that are not positive numbers."""
    if key not in QUOTA_KEYS:
        raise InvalidQuota(f"unknown quota {key!r}; known: {', '.join(QUOTA_KEYS)}")
    if not value > 0 or value != value or value == float("inf"):
        raise InvalidQuota(f"{key} must be a positive number, not {value}")

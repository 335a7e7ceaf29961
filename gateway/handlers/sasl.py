"""SaslHandshake and SaslAuthenticate (the exchange itself is `auth.session`'s), and the
SCRAM credential APIs (DESCRIBE or ALTER on the cluster, as in Kafka)."""

from __future__ import annotations

import logging

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.auth.errors import AuthenticationFailed, IllegalSaslState
from stratalog.gateway.auth.scram import MECHANISMS as SCRAM_MECHANISMS, credential_from_salted
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles

log = logging.getLogger(__name__)


@handles(ApiKey.SASL_HANDSHAKE, 0, 1)
async def sasl_handshake(ctx: RequestContext, req):
    enabled = ctx.broker.sasl_mechanisms
    out = {"error_code": 0, "mechanisms": list(enabled)}
    try:
        ctx.session.start(req.mechanism, enabled, raw_tokens=ctx.version == 0)
    except IllegalSaslState:
        out["error_code"] = ErrorCode.ILLEGAL_SASL_STATE
    except ValueError:
        out["error_code"] = ErrorCode.UNSUPPORTED_SASL_MECHANISM
    if out["error_code"]:
        ctx.session.closing = True  # as Kafka does: the client cannot go on
    return out


@handles(ApiKey.SASL_AUTHENTICATE, 0, 2)
async def sasl_authenticate(ctx: RequestContext, req):
    session = ctx.session
    out = {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}
    broker = ctx.broker
    now_ms = broker.now_ms()
    try:
        out["auth_bytes"] = await session.step(broker.store, req.auth_bytes, oauth=broker.oauth, now_ms=now_ms,
                                               reauth_ms=broker.config["connections.max.reauth.ms"])
        out["session_lifetime_ms"] = session.lifetime_ms(now_ms) if session.authenticated else 0
    except AuthenticationFailed as e:
        log.warning("%s: SASL/%s authentication failed: %s", ctx.peer, session.mechanism, e)
        out["error_code"] = ErrorCode.SASL_AUTHENTICATION_FAILED
        out["error_message"] = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {session.mechanism}"
    except IllegalSaslState as e:
        out["error_code"] = ErrorCode.ILLEGAL_SASL_STATE
        out["error_message"] = str(e)
    else:
        if session.authenticated:
            log.info("%s: authenticated as %s with %s", ctx.peer, session.principal, session.mechanism)
    return out


# --- DescribeUserScramCredentials / AlterUserScramCredentials --------------------------

MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # the protocol's ScramMechanism


@handles(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0)
async def describe_user_scram_credentials(ctx: RequestContext, req):
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "DESCRIBE on the cluster is not allowed", "results": []}
    users = await ctx.broker.store.scram_users()
    codes = {name: code for code, name in MECHANISM_CODES.items()}
    names = sorted(users) if req.users is None else [u.name for u in req.users]
    results = []
    for name in names:
        found = users.get(name)
        results.append({"user": name, "error_code": 0 if found else ErrorCode.RESOURCE_NOT_FOUND,
                        "error_message": None if found else f"user {name!r} has no SCRAM credential",
                        "credential_infos": [{"mechanism": codes[c.mechanism], "iterations": c.iterations}
                                             for c in found or []]})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}


@handles(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0)
async def alter_user_scram_credentials(ctx: RequestContext, req):
    store = ctx.broker.store
    allowed = ctx.allowed(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
    changes = [(d.name, d.mechanism, None) for d in req.deletions] + \
              [(u.name, u.mechanism, u) for u in req.upsertions]
    seen = [(name, mechanism) for name, mechanism, _ in changes]
    results: dict[str, tuple[int, str | None]] = {}
    for name, code, upsert in changes:
        if name in results and results[name][0]:
            continue  # the user's first error is its answer
        error: tuple[int, str | None] = (0, None)
        mechanism = MECHANISM_CODES.get(code)
        if not allowed:
            error = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is not allowed")
        elif not name:
            error = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "the user name is empty")
        elif mechanism is None:
            error = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown SCRAM mechanism {code}")
        elif seen.count((name, code)) > 1:
            error = (ErrorCode.DUPLICATE_RESOURCE, f"{mechanism} of {name!r} is changed twice")
        elif upsert is None:
            if not await store.delete_scram_credential(name, mechanism):
                error = (ErrorCode.RESOURCE_NOT_FOUND, f"user {name!r} has no {mechanism} credential")
        else:
            bounds = SCRAM_MECHANISMS[mechanism]
            if not bounds.min_iterations <= upsert.iterations <= bounds.max_iterations or not upsert.salt \
                    or not upsert.salted_password:
                error = (ErrorCode.UNACCEPTABLE_CREDENTIAL,
                         f"{mechanism} needs a salt and {bounds.min_iterations}-{bounds.max_iterations} iterations")
            else:
                await store.put_scram_credential(name, credential_from_salted(
                    mechanism, upsert.salt, upsert.iterations, upsert.salted_password))
        if name not in results or error[0]:
            results[name] = error
    return {"throttle_time_ms": 0, "results": [{"user": n, "error_code": c, "error_message": m}
                                               for n, (c, m) in results.items()]}

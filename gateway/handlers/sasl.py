"""SaslHandshake and SaslAuthenticate: the exchange itself is `auth.session`'s."""

from __future__ import annotations

import logging

from stratalog.gateway.auth.errors import AuthenticationFailed, IllegalSaslState
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
    try:
        out["auth_bytes"] = await session.step(ctx.broker.store, req.auth_bytes)
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

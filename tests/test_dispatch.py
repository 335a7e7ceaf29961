"""The handler registry and the server's dispatch, in process: handlers are registered by
`ApiKey` name, and a failing handler is answered with UNKNOWN_SERVER_ERROR (or its
connection closed) with the traceback logged."""

from __future__ import annotations

import pytest

from stratalog.gateway.handlers import load_handlers
from stratalog.gateway.handlers.registry import HANDLERS, handles
from stratalog.gateway.protocol.catalog import APIS, ApiKey


def test_every_handler_is_registered_by_api_key_name():
    load_handlers()
    assert HANDLERS
    for key, handler in HANDLERS.items():
        assert type(key) is ApiKey and handler.api_key is key
        assert key in APIS


def test_handles_refuses_a_bare_number():
    with pytest.raises(TypeError, match="ApiKey"):
        handles(3, 0, 12)

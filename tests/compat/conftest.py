"""One gateway per client test module: every test uses its own topics and groups.

A module may set `GATEWAY_SETTINGS` (a dict of broker settings) for its gateway.
"""

import pytest

from conftest import GatewayProcess


@pytest.fixture(scope="module")
def gateway(request, tmp_path_factory):
    settings = getattr(request.module, "GATEWAY_SETTINGS", None)
    gw = GatewayProcess(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "data",
                        settings).start()
    yield gw
    gw.stop()

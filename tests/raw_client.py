"""A connection to a gateway that speaks chosen API versions through the project's own
codec: for requests no client library sends as a test needs them."""

from __future__ import annotations

import socket
import struct

from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.protocol.frames import decode_response, encode_request


class Raw:
    """One connection; `call` sends a request and returns the decoded response body."""

    def __init__(self, bootstrap: str, client_id: str = "raw"):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.client_id = client_id
        self.correlation = 0

    def call(self, api: ApiKey, version: int, body: dict):
        self.send(api, version, body)
        return self.receive(api, version)

    def send(self, api: ApiKey, version: int, body: dict) -> int:
        """Send without waiting for the answer (requests pipelined on one connection are
        answered in order); the correlation id."""
        self.correlation += 1
        self.sock.sendall(encode_request(api, version, self.correlation, body, client_id=self.client_id))
        return self.correlation

    def receive(self, api: ApiKey, version: int):
        """The next answer on the connection, which must be to `api` at `version`."""
        (size,) = struct.unpack(">i", self._read(4))
        return decode_response(api, version, self._read(size))[1]

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the gateway closed the connection"
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()

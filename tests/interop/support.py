"""What the interop scripts share: free loopback ports and waiting for a server."""

import socket
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    """Until `url` answers 200 (or `timeout` seconds pass). The body is read to its end:
    a client that hangs up after the head is, through serve, a `client_aborted` exchange."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

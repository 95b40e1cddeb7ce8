"""What the interop scripts share: free loopback ports, waiting for a server, and the
command line and last lines of a script run as `SCRIPT BINARY WORKDIR`."""

import socket
import sys
import time
import urllib.request
from pathlib import Path


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


def passed(what: str, checks: int) -> int:
    """Say how many checks passed (CI reads the last line); the exit status, 0."""
    print(f"{what}, {checks} checks passed")
    print(f"{checks} passed, 0 failed")
    return 0


def cli_main(main, doc: str) -> None:
    """Run `main(BINARY, WORKDIR)` from the command line; the usage is `doc`."""
    if len(sys.argv) != 3:
        sys.exit(doc)
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))

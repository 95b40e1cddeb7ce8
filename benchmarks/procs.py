"""Processes the benchmark scripts start (harness.py, streams.py): each pinned to a CPU,
waited for on its port, stopped together at the end. Importing this module does nothing."""

import socket
import subprocess
import sys
import time

procs = []


def start(cmd, cpu, log):
    """`cmd` on CPU `cpu` (taskset), stdout dropped, stderr to the file `log`."""
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    procs.append(p)
    return p


def wait_port(port, timeout=20):
    """Until something accepts on 127.0.0.1:`port`; exits the script after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


def stop_all(timeout=15):
    """SIGTERM to every process started, then SIGKILL to those still there after `timeout` s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
    procs.clear()

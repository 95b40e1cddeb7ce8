"""serve's CPU per request, an old build and a new one alternated:
`python3 benchmarks/serve_cpu.py OLD_BIN NEW_BIN` (RUNS pairs, default 6).

The harness's pinning: an nginx upstream (1 KiB JSON) and serve on CPU 1, wrk -c64 on
CPU 0. Each run starts a fresh serve (recording), warms it with 1 s of wrk, then reads its
CPU ticks (utime + stime from /proc/PID/stat, and its recorder thread's from
/proc/PID/task/TID/stat) around 3 s of wrk: CPU per request is ticks / requests wrk
completed (ticks are 10 ms: ~230 of them a run for the process, ~45 for its recorder
thread, so one run resolves ~0.5 % and ~2 %). The window opens and closes with the
process idle (`harness.settle`): the recorder's work for the measured requests is in,
the warm-up's is not. The order within a pair swaps every pair (old new, new old, ...),
since the machine drifts. Prints every run, the medians and the per-pair ratios new / old.
Throughput on this shared VM spreads 10-40 %; CPU per request spreads less and says where
a change moved the work.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402  (ports, the body, serve's command line)
import procs  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def wrk(secs):
    """wrk -c64 on CPU 0 against serve for `secs`: requests completed; exits on any error
    or non-2xx answer (a dead upstream would otherwise be measured as cheap 502s)."""
    r = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c64", f"-d{secs}s", f"http://127.0.0.1:{h.MPX}/"],
                       capture_output=True, text=True)
    if r.returncode != 0 or "Non-2xx" in r.stdout or "Socket errors" in r.stdout:
        sys.exit(f"wrk failed or saw errors:\n{r.stdout}{r.stderr}")
    return int(re.search(r"(\d+) requests in", r.stdout).group(1))


def one(binary, tmp, tag):
    """One run of `binary`: (requests/s, CPU µs per request, the recorder's µs per request)."""
    out = tmp / f"run-{tag}"
    p = procs.start(h.serve_cmd(binary, h.MPX, out), 1, tmp / "logs" / f"serve-{tag}.log")
    try:
        procs.wait_port(h.MPX)
        wrk(1)
        task = Path(f"/proc/{p.pid}/task")
        rec = [t for t in task.iterdir() if (t / "comm").read_text().strip() == "matrix-recorder"]
        if not rec:
            sys.exit(f"{binary}: no matrix-recorder thread (is recording on?)")
        recorder = rec[0] / "stat"
        # The window opens once the warm-up's rows are encoded and closes once the
        # measured ones are: all of their work, and none of another window's.
        h.settle(p)
        t0, r0 = h.cpu_ticks(p.pid), h.cpu_ticks(p.pid, recorder)
        n = wrk(3)
        h.settle(p)
        t1, r1 = h.cpu_ticks(p.pid), h.cpu_ticks(p.pid, recorder)
    finally:
        p.send_signal(2)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        procs.procs.remove(p)
        shutil.rmtree(out, ignore_errors=True)
    us = lambda d: d / TICK / n * 1e6
    return n / 3, us(t1 - t0), us(r1 - r0)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: python3 benchmarks/serve_cpu.py OLD_BIN NEW_BIN")
    bins = {"old": sys.argv[1], "new": sys.argv[2]}
    runs = int(os.environ.get("RUNS", "6"))
    tmp = Path(tempfile.mkdtemp())
    (tmp / "logs").mkdir()
    conf = h.upstream_conf(tmp)
    res = {side: {"cpu": [], "rec": []} for side in bins}
    done = False
    try:
        procs.start(["nginx", "-p", str(tmp), "-c", str(conf)], 1, tmp / "logs" / "up.log")
        procs.wait_port(h.UP)
        for i in range(runs):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for side in order:
                rps, cpu, rec = one(bins[side], tmp, f"{side}-{i}")
                res[side]["cpu"].append(cpu)
                res[side]["rec"].append(rec)
                print(f"pair {i + 1} {side}: {rps:,.0f} req/s, {cpu:.2f} µs CPU/request, recorder {rec:.2f}", flush=True)
        done = True
    finally:
        procs.stop_all()
        if done:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"stopped early: the logs are in {tmp / 'logs'}", file=sys.stderr)
    for key, what in (("cpu", "whole process"), ("rec", "recorder thread")):
        old, new = res["old"][key], res["new"][key]
        ratios = sorted(n / o for o, n in zip(old, new))
        print(f"{what}: old median {statistics.median(old):.2f} µs, new median {statistics.median(new):.2f} µs; "
              f"new/old per pair median {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})")


if __name__ == "__main__":
    main()

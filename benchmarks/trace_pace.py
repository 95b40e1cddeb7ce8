"""A 2,000 req/s trace replayed against the mock worker, its send lateness beside the
same rate as a Poisson open loop (issue 47).

Side by side in one run, ROUNDS times with the order swapped every round:
- a trace plan (`load.mode "trace"`) whose 10,000 entries are Poisson arrivals at
  2,000/s for 5 s, written here (seeded; a trace file pinned by its SHA-256);
- an open-loop plan at 2,000/s, Poisson, 5 s a round.
Each replays 2 measured rounds (keep-alive, max_in_flight 256) against
`matrix-proxy mock-worker` in its own process (1 ms a request, no batch limit, so it keeps
up with the rate); with `taskset`, replay runs on CPU 0 and
the mock on CPU 1. From each run's summary.json: send lag p50 / p99 (median over its
rounds), sent vs scheduled rate, saturated rounds, and the trace rounds' wake-up floor
(p99 of a bare thread sleeping to deadlines 500 µs apart just before each round). The
table goes to stdout and to results/<date>-trace-pace.md.

Usage: python3 benchmarks/trace_pace.py [PATH/TO/matrix-proxy] [ROUNDS]
(builds nothing: run `cargo build --release` first; loopback only, about a minute a round.)
"""

import datetime
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/matrix-proxy"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
RATE, SECONDS = 2000.0, 5.0
METADATA = {k: "N/A: benchmark" for k in [
    "gpu", "gpu_ids", "driver", "cuda", "precision", "model_revision", "runtime_revision",
    "cache_policy", "cuda_evidence", "reservation", "host"]}


def pinned(cpu):
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") else []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plans(work: Path, url: str):
    case = {"name": "chat", "request": {"model": "mock", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say hello."}]}}
    rng = random.Random(7)
    t, entries = 0.0, []
    while t < SECONDS:
        entries.append({"offset_us": round(t * 1e6), "case": "chat"})
        t += rng.expovariate(RATE)
    text = "".join(json.dumps(e) + "\n" for e in entries)
    (work / "pace.trace.jsonl").write_text(text)
    base = {"endpoint": url, "connection": "keep-alive", "timeout_seconds": 5,
            "repetitions": 2, "metadata": METADATA, "cases": [case]}
    trace = dict(base, load={"mode": "trace", "max_in_flight": 256, "trace": {
        "file": "pace.trace.jsonl", "sha256": hashlib.sha256(text.encode()).hexdigest()}})
    open_loop = dict(base, load={"mode": "open", "arrival": "poisson", "seed": 7,
                                 "rates_per_second": [RATE], "duration_seconds": SECONDS,
                                 "max_in_flight": 256})
    (work / "trace.json").write_text(json.dumps(trace))
    (work / "open.json").write_text(json.dumps(open_loop))
    return len(entries)


def replay(work: Path, name: str, k: int):
    out = work / f"{name}-{k}"
    args = pinned(0) + [BIN, "replay", "--quiet", "--out", str(out), str(work / f"{name}.json")]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr}")
    rounds = json.loads((out / "summary.json").read_text())["rounds"]
    ol = [r["open_loop"] for r in rounds]
    med = lambda xs: statistics.median(xs) if xs else None
    return {
        "lag_p50_ms": med([o["send_lag_seconds"]["p50"] * 1e3 for o in ol]),
        "lag_p99_ms": med([o["send_lag_seconds"]["p99"] * 1e3 for o in ol]),
        "sent": med([o["achieved_rate_per_second"] for o in ol]),
        "scheduled": med([o["scheduled_rate_per_second"] for o in ol]),
        "saturated": sum(1 for o in ol if o["saturated"]),
        "rounds": len(ol),
        "floor_p99_ms": med([o["wake_floor_p99_seconds"] * 1e3 for o in ol
                             if o.get("wake_floor_p99_seconds") is not None]),
        "sends": sum(r["attempted_requests"] for r in rounds),
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="trace-pace-"))
    port = free_port()
    # A worker that keeps up (1 ms a request, no batch limit): the numbers are the pacer's.
    mock = subprocess.Popen(pinned(1) + [BIN, "mock-worker", "--listen", f"127.0.0.1:{port}",
                                         "--prefill-ms", "1", "--per-token-ms", "0",
                                         "--max-batch", "1024"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        n = plans(work, f"http://127.0.0.1:{port}/v1/chat/completions")
        got = {"trace": [], "open": []}
        for k in range(ROUNDS):
            order = ["trace", "open"] if k % 2 == 0 else ["open", "trace"]
            for name in order:
                got[name].append(replay(work, name, k))
                print(f"round {k + 1} {name}: {got[name][-1]}", file=sys.stderr)
    finally:
        mock.terminate()
        mock.wait()
    med = lambda name, key: statistics.median([g[key] for g in got[name] if g[key] is not None] or [float("nan")])
    rows = ["| plan | sends a run | scheduled/s | sent/s | lag p50 ms | lag p99 ms (min-max) | saturated rounds | wake floor p99 ms |",
            "|---|---|---|---|---|---|---|---|"]
    for name in ["trace", "open"]:
        p99s = [g["lag_p99_ms"] for g in got[name]]
        rows.append(
            f"| {name} | {got[name][0]['sends']} | {med(name, 'scheduled'):.0f} | {med(name, 'sent'):.0f} | "
            f"{med(name, 'lag_p50_ms'):.3f} | {statistics.median(p99s):.3f} ({min(p99s):.3f}-{max(p99s):.3f}) | "
            f"{sum(g['saturated'] for g in got[name])}/{sum(g['rounds'] for g in got[name])} | "
            + (f"{med(name, 'floor_p99_ms'):.3f}" if name == "trace" else "-") + " |")
    ratio = med("trace", "lag_p99_ms") / med("open", "lag_p99_ms")
    host = os.uname()
    text = "\n".join([
        f"# Trace pace: {n} entries at {RATE:.0f}/s vs a Poisson open loop ({datetime.date.today()})",
        "",
        f"`python3 benchmarks/trace_pace.py {BIN} {ROUNDS}` on {host.nodename} ({host.machine}, "
        f"{os.cpu_count()} CPUs); replay {'on CPU 0, mock on CPU 1' if pinned(0) else 'unpinned'}; "
        f"{ROUNDS} runs of each, 2 measured rounds a run, medians over runs.",
        "",
        *rows,
        "",
        f"trace / open-loop lag p99: {ratio:.2f}",
        "",
    ])
    print(text)
    results = Path(__file__).parent / "results"
    stem = f"{datetime.date.today()}-trace-pace"
    path, i = results / f"{stem}.md", 2
    while path.exists():
        path, i = results / f"{stem}-{i}.md", i + 1
    path.write_text(text)
    print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

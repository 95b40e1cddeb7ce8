"""What scraping the worker's /metrics costs a run's exchanges (issue 33): replay of one
streaming plan against the mock worker (in its own process) with and without
`--worker-metrics`, side by side in one run, each target once per round in a rotated
order, and the with / without ratios of the medians.

Targets:
- `none`: no scraping (the reference);
- `healthy`: the mock's own /metrics every 0.05 s (the shortest interval; the mock
  renders it from its state, as vLLM does), and a round-edge scrape around every round;
- `hang`: a /metrics that accepts and never answers, every 0.05 s with a 0.2 s timeout
  (each round edge waits out its timeout: the round's own clock does not include it);
- `garbage`: a /metrics that answers HTML every 0.05 s (every scrape fails to read).

Per run: the median over its measured rounds of successful requests/s, latency p50 and
p95, TTFT p50 (summary.json). Ratios near 1 (within the spread of the reference's own
rounds) mean scraping leaves the exchanges and their timings untouched; the
exchanges themselves must all succeed in every run.

Usage: python3 benchmarks/scrape_cost.py [PATH/TO/matrix-proxy] [ROUNDS]
(builds nothing: run `cargo build --release` first; loopback only, about 2 minutes with
5 rounds; pins the generator to CPU 0 and the mock to CPU 1 when taskset exists.)
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/matrix-proxy"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
METRICS = ("req/s", "p50 ms", "p95 ms", "TTFT p50 ms")


def pin(cpu):
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and os.cpu_count() >= 2 else []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer(answer):
    """A loopback /metrics that answers `answer` (bytes) or, with None, never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    held = []

    def serve():
        while True:
            c, _ = srv.accept()
            if answer is None:
                held.append(c)
                continue
            try:
                c.recv(65536)
                c.sendall(answer)
            finally:
                c.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"


def plan(port):
    return {
        "name": "scrape-cost",
        "endpoint": f"http://127.0.0.1:{port}/v1/chat/completions",
        "cases": [{"name": "chat", "request": {
            "model": "mock", "messages": [{"role": "user", "content": "count to eight"}],
            "max_tokens": 8, "stream": True}}],
        "concurrency": [16], "requests_per_case": 3000, "repetitions": 3, "warmup_per_case": 32,
        "timeout_seconds": 10,
        "metadata": {k: "N/A" for k in ("gpu", "gpu_ids", "driver", "cuda", "precision", "model_revision",
                                        "runtime_revision", "cache_policy", "cuda_evidence", "reservation",
                                        "host")},
    }


def measure(work, name, plan_path, flags, r):
    out = work / f"{name}-{r}"
    cmd = pin(0) + [BIN, "replay", "-q", "--no-record", str(plan_path), "--out", str(out)] + flags
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    s = json.loads((out / "summary.json").read_text())
    assert s["ending"] == "passed", (name, s["ending"], p.stderr)
    rounds = s["rounds"]
    assert all(x["successful_requests"] == x["planned_requests"] for x in rounds), name
    med = lambda f: statistics.median(f(x) for x in rounds)
    return {
        "req/s": med(lambda x: x["successful_requests_per_second"]),
        "p50 ms": med(lambda x: x["successful_latency_seconds"]["p50"] * 1e3),
        "p95 ms": med(lambda x: x["successful_latency_seconds"]["p95"] * 1e3),
        "TTFT p50 ms": med(lambda x: x["stream"]["ttft_seconds"]["p50"] * 1e3),
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="scrape-cost-"))
    port = free_port()
    mock = subprocess.Popen(pin(1) + [BIN, "mock-worker", "--listen", f"127.0.0.1:{port}",
                                      "--prefill-ms", "2", "--per-token-ms", "0.5"],
                            stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan(port)))
    garbage = b"HTTP/1.1 200 OK\r\ncontent-length: 24\r\nconnection: close\r\n\r\n<html>not metrics</html>"
    fast = ["--scrape-interval", "0.05", "--gpu-metrics", "off"]
    targets = {
        "none": [],
        "healthy": [f"--worker-metrics=http://127.0.0.1:{port}/metrics"] + fast,
        "hang": [f"--worker-metrics={peer(None)}", "--scrape-timeout", "0.2"] + fast,
        "garbage": [f"--worker-metrics={peer(garbage)}"] + fast,
    }
    got = {t: [] for t in targets}
    names = list(targets)
    try:
        for r in range(ROUNDS):
            order = names[r % len(names):] + names[:r % len(names)]
            for t in order:
                got[t].append(measure(work, t, plan_path, targets[t], r))
    finally:
        mock.terminate()
        mock.wait()
    lines = [f"# Scrape cost ({time.strftime('%Y-%m-%d')})", "",
             f"`python3 benchmarks/scrape_cost.py {BIN} {ROUNDS}`: {ROUNDS} rounds, targets rotated each round; "
             f"{os.cpu_count()} CPUs; c = 16, 3 x 3000 streamed requests a run, mock prefill 2 ms + 0.5 ms/token.",
             "", "| target | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for t in names:
        cells = []
        for m in METRICS:
            xs = [x[m] for x in got[t]]
            med = statistics.median(xs)
            spread = (max(xs) - min(xs)) / med if med else 0.0
            cells.append(f"{med:.3f} (spread {spread:.0%})")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", "with / without (median of the target / median of `none`):", "",
              "| target | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for t in names[1:]:
        ratios = [statistics.median(x[m] for x in got[t]) / statistics.median(x[m] for x in got["none"])
                  for m in METRICS]
        lines.append(f"| {t} | " + " | ".join(f"{v:.3f}" for v in ratios) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    results = Path(__file__).parent / "results"
    stem = f"{time.strftime('%Y-%m-%d')}-scrape-cost"
    path, k = results / f"{stem}.md", 2
    while path.exists():
        path, k = results / f"{stem}-{k}.md", k + 1
    path.write_text(text)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A plan of 10,000 variants: how long `validate` takes (release build), and whether a
replay holds the plan per request (it must not: every request is built once, before the
rounds, and each exchange shares its bytes).

Side by side in one run, each cell ROUNDS times interleaved, medians and spreads:
- `validate` of a 10,000-variant capture plan (`plan from-jsonl` of 10,000 prompts),
  wall time;
- `replay --no-record` (c = 16, 2 measured rounds) against the mock worker in its own
  process with no latency, of the 10,000-variant plan at 10,000 and at 40,000 requests per round, and of
  a 1-variant plan at 10,000: peak RSS and measured req/s. Were the plan copied or rebuilt
  per request, memory would grow with the requests sent (40,000 vs 10,000) by that copy
  each, and the 10,000-variant replay would lose throughput to the 1-variant one; what
  should remain is the samples kept for exact percentiles (about 100 bytes a request).

Usage: python3 benchmarks/plan_scale.py [PATH/TO/matrix-proxy] [ROUNDS]
(builds nothing: run `cargo build --release` first; loopback only, about a minute.)
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/matrix-proxy"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
N = 10_000
WORDS = "the river crosses the valley in three long bends and floods the lower meadows".split()


def prompt(i: int) -> str:
    # 50 words, different for every line, the same length for every plan.
    return f"#{i:05} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(50))


def run(args, **kw):
    """Run a command; (wall seconds, peak RSS in MiB, CPU seconds) of the child."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def spread(xs):
    return f"{statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f})"


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="plan-scale-"))
    many = work / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": prompt(i)}) + "\n" for i in range(N)))
    one = work / "one.jsonl"
    one.write_text(json.dumps({"prompt": prompt(0)}) + "\n")
    cells = (("10,000 variants, 10,000 a round", many, N),
             ("10,000 variants, 40,000 a round", many, 4 * N),
             ("1 variant, 10,000 a round", one, N),
             ("1 variant, 40,000 a round", one, 4 * N))
    plans = {}
    for name, src, per_round in cells:
        out = work / f"{src.stem}-{per_round}.json"
        subprocess.run(
            [BIN, "plan", "from-jsonl", str(src), "--endpoint", "http://127.0.0.1:9",
             "--model", "mock", "--max-tokens", "4", "--requests-per-case", str(per_round),
             "--concurrency", "16", "--out", str(out)],
            check=True, stderr=subprocess.DEVNULL)
        plans[name] = out
    sizes = {k: v.stat().st_size / 2**20 for k, v in plans.items()}
    validate, rss, rps = [], {k: [] for k in plans}, {k: [] for k in plans}
    cpu = {k: [] for k in plans}
    # The mock in its own process (its log of requests seen would count in replay's
    # memory under --mock-worker), with no latency.
    port = 18000 + os.getpid() % 1000
    mock = subprocess.Popen([BIN, "mock-worker", "--listen", f"127.0.0.1:{port}",
                             "--prefill-ms", "0", "--per-token-ms", "0", "--max-batch", "256"],
                            stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    for r in range(ROUNDS):
        validate.append(run([BIN, "validate", str(plans[cells[0][0]])])[0])
        for name, plan in plans.items():  # interleaved: every cell sees the same machine
            out = work / f"run-{r}-{plan.stem}"
            _, peak, busy = run([BIN, "replay", "-q", "--no-record", str(plan),
                           "--endpoint", f"http://127.0.0.1:{port}/v1/completions",
                           "--out", str(out)])
            rss[name].append(peak)
            summary = json.loads((out / "summary.json").read_text())
            cpu[name].append(busy / summary["planned_requests"] * 1e6)
            assert summary["ending"] == "passed", summary["ending"]
            rps[name].append(statistics.median(
                x["successful_requests_per_second"] for x in summary["rounds"]))
    mock.terminate()
    mock.wait()
    print(f"plan scale ({ROUNDS} interleaved rounds, {os.cpu_count()} CPUs, {BIN})\n")
    print(f"validate, 10,000 variants ({sizes[cells[0][0]]:.1f} MiB): {spread(validate)} s\n")
    print("| replay of | peak RSS MiB | req/s (median round) | replay CPU us per request (all phases) |")
    print("|---|---|---|---|")
    for name in plans:
        print(f"| {name} | {spread(rss[name])} | {spread(rps[name])} | {spread(cpu[name])} |")
    for label, a, b in (("10,000 variants", 0, 1), ("1 variant", 2, 3)):
        grow = statistics.median(rss[cells[b][0]]) - statistics.median(rss[cells[a][0]])
        print(f"\n{label}: 60,000 more measured requests added {grow:.1f} MiB "
              f"({grow * 2**20 / 60_000:.0f} bytes a request)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

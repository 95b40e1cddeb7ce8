#!/usr/bin/env python3
"""Write plans/trace-demo.json and plans/trace-demo.trace.jsonl: the demo workload
(plans/demo.json's cases, against the built-in mock worker) as a trace plan whose entries
arrive in bursts, so `matrix-proxy replay plans/trace-demo.json --mock-worker` shows a
trace round.

The trace is made here, deterministically (no randomness, no download): six seconds, a
burst of twelve requests within 110 ms every 1.5 s over a trickle of one request every
250 ms; entries cycle through the demo's requests, each user's requests carry its
session key. Run it from the repository root; `--out DIR` writes elsewhere (the tests
compare a fresh run with the files shipped in plans/).
"""

import argparse
import hashlib
import json
import os


def entries(cases):
    # Every (case, variant) of the demo, in plan order.
    sends = []
    for c in cases:
        names = [v["name"] for v in c.get("variants", [])]
        sends.extend((c["name"], n) for n in names) if names else sends.append((c["name"], None))
    out = []
    trickle = [k * 250_000 for k in range(24)]
    bursts = [b * 1_500_000 + 200_000 + k * 10_000 for b in range(4) for k in range(12)]
    for i, offset in enumerate(sorted(trickle + bursts)):
        case, variant = sends[i % len(sends)]
        e = {"offset_us": offset, "case": case}
        if variant is not None:
            e["variant"] = variant
        e["session"] = f"user-{i % 5}"
        out.append(e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="plans", help="folder to write into (default: plans)")
    args = ap.parse_args()
    with open("plans/demo.json", encoding="utf-8") as f:
        demo = json.load(f)
    text = "".join(json.dumps(e, separators=(", ", ": ")) + "\n" for e in entries(demo["cases"]))
    os.makedirs(args.out, exist_ok=True)
    trace = "trace-demo.trace.jsonl"
    with open(os.path.join(args.out, trace), "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    plan = {
        "name": "trace-demo",
        "description": "The demo workload as a trace: bursts of 12 requests every 1.5 s over a trickle of 4/s, written by scripts/make-trace-demo.py",
        "endpoint": demo["endpoint"],
        "health_endpoint": demo["health_endpoint"],
        "connection": "keep-alive",
        "repetitions": 2,
        "timeout_seconds": 5,
        "load": {
            "mode": "trace",
            "trace": {"file": trace, "sha256": hashlib.sha256(text.encode()).hexdigest()},
            "speedup": 1,
            "warmup_seconds": 1,
            "max_in_flight": 64,
        },
        "slo": {"ttft_ms": 100, "e2e_ms": 250},
        "metadata": demo["metadata"],
        "cases": demo["cases"],
    }
    with open(os.path.join(args.out, "trace-demo.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(plan, indent=2) + "\n")


if __name__ == "__main__":
    main()

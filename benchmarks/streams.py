"""LLM-shaped streams (issue 34): streamed chat at high concurrency, direct and through
serve, side by side in one run. Run by hand (never by CI): `STREAMS=1 bash
benchmarks/run.sh`, or `python3 benchmarks/streams.py` once nginx and the release build
exist.

Cells (`ONLY=stream:64,serve-stream:64`; default every cell below):
- `stream:C` (C in 1, 64, 256, 1024), two workers on CPU 1, the client on CPU 0:
  * `canned`: nginx answering every POST with one canned SSE body of 36 events (a role
    chunk, 32 content chunks, a finish chunk, a usage chunk, `[DONE]`) as
    `text/event-stream`: a worker that outruns the client, so the client's own ceiling
    shows: successful req/s, events/s (from the recorded rows' `event_count`), CPU
    seconds per 1,000 requests of the client's whole process (every phase; `wait4`), and
    the most requests in flight at once (from the measured rows' start and end);
  * `paced`: the mock worker (`--prefill-ms 50 --per-token-ms 10`, 32 tokens, batch
    4096), whose truth is known: TTFT p50 - 50 ms and ITL p50 - 10 ms are the client's
    error, its floor the c = 1 row.
- `serve-stream:C`: the same client against the paced mock directly and through `serve`
  (recording; serve shares CPU 1 with the mock), back to back in every round with the
  order swapped: TTFT p50 / p99 and ITL p50 added by serve, and per request the client's
  TTFT minus serve's recorded TTFT, the two rows joined on the answer's `id`.

Every replay records its exchanges (as a campaign would). Knobs: ROUNDS (default 3),
ONLY, NEW_BIN. The table goes to stdout and to benchmarks/results/<date>-streams.md.

PEERS=1 adds AIPerf (pinned, AIPERF_VERSION) to every `stream:C` cell, right after
replay in each round: installed from PyPI into a venv under target/peers/ on first use,
with a local tokenizer trained by benchmarks/peer_tokenizer.py from the embedded corpus
(no Hub download: AIPerf is given its directory), configured as `aiperf profile
--endpoint-type chat --streaming --concurrency C --request-count N --isl 8 --osl 32
--ui-type none --no-server-metrics --no-gpu-telemetry`, on CPU 0 like replay. Its numbers
are read from its own profile_export_aiperf.json (request_throughput, request_count,
time_to_first_token.p50, inter_token_latency.p50, error_summary); its CPU is its whole
process tree (wait4), less a one-request run's (its startup). GuideLLM is not run yet (its
torch dependency is several GB).
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("NEW_BIN") or ROOT / "target" / "release" / "matrix-proxy")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CANNED, PACED, SERVE = 18090, 18091, 18092
TOKENS, PREFILL_MS, TOKEN_MS = 32, 50.0, 10.0
PEERS = os.environ.get("PEERS") == "1"
PEER_DIR = ROOT / "target" / "peers"
AIPERF_VERSION = "0.13.0"
META = {k: "N/A: benchmark" for k in ["gpu", "gpu_ids", "driver", "cuda", "precision", "model_revision",
                                      "runtime_revision", "cache_policy", "cuda_evidence", "reservation", "host"]}


def parse_only(text):
    cells = set()
    for tok in filter(None, (t.strip() for t in text.split(","))):
        kind, _, c = tok.partition(":")
        if kind not in ("stream", "serve-stream") or not c.isdigit():
            sys.exit(f"ONLY: cannot read {tok!r}; expected stream:C or serve-stream:C")
        cells.add((kind, int(c)))
    return cells or {("stream", c) for c in (1, 64, 256, 1024)} | {("serve-stream", 64)}


ONLY = parse_only(os.environ.get("ONLY", ""))
procs = []


def start(cmd, cpu, log):
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    procs.append(p)
    return p


def wait_port(port, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


def canned_body():
    """36 events, as an OpenAI-compatible server streams 32 tokens with usage."""
    def chunk(delta, finish=None, usage=None):
        c = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 0, "model": "mock",
             "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        return "data: " + json.dumps(c, separators=(",", ":")) + "\n\n"
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": f"tok{i} "}) for i in range(TOKENS)]
    events.append(chunk({}, finish="length"))
    events.append(chunk(None, usage={"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3}))
    events.append("data: [DONE]\n\n")
    assert len(events) == 36
    return "".join(events)


def nginx(tmp):
    # A file, not `return 200 '...'` (a parameter holds at most 4 KiB); a POST to a static
    # file is 405, turned into the file with 200.
    (tmp / "sse").mkdir()
    (tmp / "sse" / "body").write_text(canned_body())
    for p in (tmp, tmp / "sse", tmp / "sse" / "body"):  # nginx's workers drop root
        p.chmod(0o755)
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err;
events {{ worker_connections 8192; }}
http {{
  access_log off; keepalive_requests 10000000; keepalive_timeout 120s;
  client_body_temp_path {tmp}/ngx-body; proxy_temp_path {tmp}/ngx-proxy; fastcgi_temp_path {tmp}/ngx-fcgi;
  uwsgi_temp_path {tmp}/ngx-uwsgi; scgi_temp_path {tmp}/ngx-scgi;
  server {{
    listen 127.0.0.1:{CANNED} backlog=4096;
    location / {{ root {tmp}/sse; default_type text/event-stream; rewrite ^ /body break;
                 error_page 405 =200 /body; }}
  }}
}}
""")
    start(["nginx", "-c", str(conf)], 1, tmp / "nginx.log")
    wait_port(CANNED)


def plan(port, c, n, tag):
    return {
        "name": f"streams-{tag}",
        "endpoint": f"http://127.0.0.1:{port}/v1/chat/completions",
        "connection": "keep-alive",
        "cases": [{"name": "chat", "request": {
            "model": "mock", "messages": [{"role": "user", "content": "count"}],
            "max_tokens": TOKENS, "stream": True, "stream_options": {"include_usage": True}}}],
        "concurrency": [c], "requests_per_case": max(n, c), "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 60, "metadata": META,
    }


def replay(tmp, port, c, n, tag):
    """One replay on CPU 0: its summary, its CPU seconds, and its run directory."""
    p = tmp / f"plan-{tag}.json"
    p.write_text(json.dumps(plan(port, c, n, tag)))
    out = tmp / f"run-{tag}"
    cmd = ["taskset", "-c", "0", str(BIN), "replay", "--quiet", "--out", str(out), str(p)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"replay {tag} failed: {err}")
    s = json.loads((out / "summary.json").read_text())
    requests = sum(x["attempted_requests"] for x in s["rounds"]) + \
        sum(x["attempted_requests"] for x in s["excluded_phases"].values())
    return s, (usage.ru_utime + usage.ru_stime), requests, out


def in_flight(con, out):
    """The most measured exchanges in flight at once, from their start and end."""
    return con.execute(f"""
        with e as (select start_offset_us t, 1 d from '{out}/exchanges/*.parquet' where phase = 'measured'
                   union all
                   select start_offset_us + total_us, -1 from '{out}/exchanges/*.parquet'
                   where phase = 'measured' and total_us is not null)
        select max(n) from (select sum(d) over (order by t, d rows unbounded preceding) n from e)""").fetchone()[0]


def events_per_second(con, out, s):
    ev = con.execute(f"""select sum(event_count) from '{out}/exchanges/*.parquet'
        where phase = 'measured' and outcome = 'ok'""").fetchone()[0] or 0
    secs = sum(x["elapsed_seconds"] for x in s["rounds"])
    return ev / secs if secs > 0 else None


def med(s, f):
    vals = [f(x) for x in s["rounds"]]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def ensure_aiperf():
    """AIPerf in its own venv and the local tokenizer it is given."""
    venv = PEER_DIR / "aiperf"
    exe = venv / "bin" / "aiperf"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", f"aiperf=={AIPERF_VERSION}"], check=True)
    tok = PEER_DIR / "tokenizer"
    if not (tok / "tokenizer.json").exists():
        subprocess.run([str(venv / "bin" / "python"), str(ROOT / "benchmarks" / "peer_tokenizer.py"), str(tok),
                        str(ROOT / "src" / "dataset" / "corpus.txt")], check=True, stdout=subprocess.DEVNULL)
    return exe, tok


def aiperf(peer, tmp, port, c, n, tag):
    """One AIPerf run on CPU 0: its own numbers and its process tree's CPU seconds."""
    exe, tok = peer
    out = tmp / f"aiperf-{tag}"
    cmd = ["taskset", "-c", "0", str(exe), "profile", "--model", "mock", "--url", f"http://127.0.0.1:{port}",
           "--endpoint-type", "chat", "--streaming", "--concurrency", str(c), "--request-count", str(n),
           "--isl", "8", "--osl", str(TOKENS), "--random-seed", "1", "--tokenizer", str(tok),
           "--artifact-dir", str(out), "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry"]
    log = tmp / f"aiperf-{tag}.log"
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    found = list(out.rglob("profile_export_aiperf.json"))
    if os.waitstatus_to_exitcode(status) != 0 or not found:
        sys.exit(f"aiperf {tag} failed: {log.read_text()[-2000:]}")
    j = json.loads(found[0].read_text())
    shutil.rmtree(out, ignore_errors=True)
    return j, usage.ru_utime + usage.ru_stime


def peer_cell(peer, startup_cpu, tmp, port, c, n, tag):
    j, cpu = aiperf(peer, tmp, port, c, n, tag)
    count = j["request_count"]["avg"]
    return {
        "rps": j["request_throughput"]["avg"],
        "events_per_s": None,
        "cpu_s_per_1000": 1000 * max(cpu - startup_cpu, 0.0) / max(count, 1),
        "in_flight": None,
        "ttft_p50_ms": j["time_to_first_token"]["p50"],
        "itl_p50_ms": j["inter_token_latency"]["p50"],
        "failed": n - int(count) + len(j.get("error_summary") or []),
    }


def cell_requests(worker, c):
    if worker == "paced":  # ~0.37 s a request: fewer, or a round takes minutes
        return max(c * 4, 50)
    return {1: 400, 64: 4000, 256: 8000, 1024: 16000}.get(c, 20 * c)


def stream_cell(tmp, con, worker, port, c, r):
    n = cell_requests(worker, c)
    s, cpu, requests, out = replay(tmp, port, c, n, f"{worker}-{c}-{r}")
    row = {
        "rps": med(s, lambda x: x["successful_requests_per_second"]),
        "events_per_s": events_per_second(con, out, s),
        "cpu_s_per_1000": 1000 * cpu / max(requests, 1),
        "in_flight": in_flight(con, out),
        "ttft_p50_ms": med(s, lambda x: x["stream"]["ttft_seconds"]["p50"] * 1e3),
        "itl_p50_ms": med(s, lambda x: x["stream"]["itl_seconds"]["p50"] * 1e3),
        "failed": sum(x["attempted_requests"] - x["successful_requests"] for x in s["rounds"]),
    }
    shutil.rmtree(out, ignore_errors=True)
    return row


def serve_pair(tmp, con, c, r):
    """Direct and through serve, back to back, order swapped every round."""
    rows = {}
    order = ("direct", "serve") if r % 2 == 0 else ("serve", "direct")
    for side in order:
        tag = f"serve-stream-{side}-{c}-{r}"
        if side == "serve":
            live = tmp / f"live-{c}-{r}"
            sp = start([str(BIN), "serve", "--quiet", "--listen", f"127.0.0.1:{SERVE}", "--upstream",
                        f"http://127.0.0.1:{PACED}", "--out", str(live)], 1, tmp / f"serve-{r}.log")
            wait_port(SERVE)
            s, _, _, out = replay(tmp, SERVE, c, max(c * 4, 200), tag)
            sp.send_signal(2)
            sp.wait(timeout=60)
            joined = con.execute(f"""
                with c as (select regexp_extract(decode(response_body), '"id":"([^"]+)"', 1) id, ttft_us
                           from '{out}/exchanges/*.parquet' where phase = 'measured' and outcome = 'ok' and is_stream),
                     s as (select regexp_extract(decode(response_body), '"id":"([^"]+)"', 1) id, ttft_us
                           from '{live}/exchanges/*.parquet' where outcome = 'ok' and is_stream)
                select quantile_disc(c.ttft_us - s.ttft_us, 0.5), quantile_disc(c.ttft_us - s.ttft_us, 0.99),
                       count(*) from c join s using (id)""").fetchone()
            rows["join"] = joined
            shutil.rmtree(live, ignore_errors=True)
        else:
            s, _, _, out = replay(tmp, PACED, c, max(c * 4, 200), tag)
        rows[side] = {
            "ttft_p50_ms": med(s, lambda x: x["stream"]["ttft_seconds"]["p50"] * 1e3),
            "ttft_p99_ms": med(s, lambda x: x["stream"]["ttft_seconds"]["p99"] * 1e3),
            "itl_p50_ms": med(s, lambda x: x["stream"]["itl_seconds"]["p50"] * 1e3),
        }
        shutil.rmtree(out, ignore_errors=True)
    return rows


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    sp = (max(xs) - min(xs)) / m * 100 if m else 0.0
    return f"{m:,.2f} ({sp:.0f} %)"


def main():
    if not BIN.exists():
        sys.exit(f"{BIN}: build it first (cargo build --release)")
    tmp = Path(tempfile.mkdtemp(prefix="streams-"))
    con = duckdb.connect()
    try:
        nginx(tmp)
        start([str(BIN), "mock-worker", "--listen", f"127.0.0.1:{PACED}", "--prefill-ms", str(PREFILL_MS),
               "--per-token-ms", str(TOKEN_MS), "--max-tokens", str(TOKENS), "--max-batch", "4096"],
              1, tmp / "mock.log")
        wait_port(PACED)
        cells = sorted(ONLY)
        got = {}
        peer, startup = None, 0.0
        if PEERS:
            peer = ensure_aiperf()
            _, startup = aiperf(peer, tmp, CANNED, 1, 1, "startup")
        for r in range(ROUNDS):
            for kind, c in cells:
                if kind == "stream":
                    for worker, port in (("canned", CANNED), ("paced", PACED)):
                        got.setdefault((worker, c, "replay"), []).append(stream_cell(tmp, con, worker, port, c, r))
                        if peer:
                            row = peer_cell(peer, startup, tmp, port, c, cell_requests(worker, c), f"{worker}-{c}-{r}")
                            got.setdefault((worker, c, f"aiperf {AIPERF_VERSION}"), []).append(row)
                else:
                    got.setdefault(("serve", c, "replay"), []).append(serve_pair(tmp, con, c, r))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    print(report(got))
    return 0


def report(got):
    lines = [f"# Streams ({time.strftime('%Y-%m-%d')})", "",
             f"`{' '.join(f'{k}={os.environ[k]}' for k in ('PEERS', 'ONLY', 'ROUNDS') if k in os.environ)} "
             f"python3 benchmarks/streams.py`: {ROUNDS} rounds, medians (spread = (max - min) / median); "
             f"{os.cpu_count()} CPUs, client on CPU 0, workers on CPU 1; {BIN}.", ""]
    lines += ["req/s is the measured rounds' own rate; the client's CPU is its whole process over every "
              "phase, the Parquet encoding it defers to after each round (`--record-hold`) included.", "",
              "| worker | c | client | req/s | events/s | client CPU s / 1,000 req | in flight reached | "
              "TTFT p50 ms | ITL p50 ms | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (worker, c, client), rows in sorted(got.items()):
        if worker == "serve":
            continue
        col = lambda k: spread([x[k] for x in rows])
        lines.append(f"| {worker} | {c} | {client} | {col('rps')} | {col('events_per_s')} | {col('cpu_s_per_1000')} | "
                     f"{col('in_flight')} | {col('ttft_p50_ms')} | {col('itl_p50_ms')} | "
                     f"{sum(x['failed'] for x in rows)} |")
    paced = {(c, client): rows for (w, c, client), rows in got.items() if w == "paced"}
    if paced:
        lines += ["", f"Paced mock: the truth is TTFT {PREFILL_MS:.0f} ms and ITL {TOKEN_MS:.0f} ms; "
                  "the client's error (median TTFT p50 - truth, ITL p50 - truth):", ""]
        for (c, client), rows in sorted(paced.items()):
            t = statistics.median(x["ttft_p50_ms"] for x in rows) - PREFILL_MS
            i = statistics.median(x["itl_p50_ms"] for x in rows) - TOKEN_MS
            lines.append(f"- {client}, c = {c}: TTFT {t:+.2f} ms, ITL {i:+.3f} ms" + (" (the floor)" if c == 1 else ""))
    for (worker, c, _), rows in sorted(got.items()):
        if worker != "serve":
            continue
        lines += ["", f"Through serve (recording) against direct, paced mock, c = {c} (serve shares CPU 1 with "
                  "the mock), added by serve per round:", ""]
        for k, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50")):
            d = [x["serve"][k] - x["direct"][k] for x in rows]
            lines.append(f"- {label}: " + ", ".join(f"{v:+.2f} ms" for v in d))
        for x in rows:
            p50, p99, n = x["join"]
            lines.append(f"- client TTFT - serve's recorded TTFT, per request joined on the answer id: "
                         f"p50 {p50 / 1000:.2f} ms, p99 {p99 / 1000:.2f} ms ({n} requests)")
    text = "\n".join(lines) + "\n"
    results = ROOT / "benchmarks" / "results"
    stem = f"{time.strftime('%Y-%m-%d')}-streams"
    path, k = results / f"{stem}.md", 2
    while path.exists():
        path, k = results / f"{stem}-{k}.md", k + 1
    path.write_text(text)
    return text + f"\nwritten to {path}\n"


if __name__ == "__main__":
    sys.exit(main())

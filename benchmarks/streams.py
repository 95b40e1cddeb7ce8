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
    the requests in flight (most at once, and the mean while any was; from each client's
    own per-request start and end). wrk (one thread, CPU 0, 3 s, no SSE parsing) drives
    the same nginx in the same round: nginx's own ceiling, so whose core ran out is
    stated (each core's busy share from /proc/stat in the 0.5 s the worker's core was
    busiest);
  * `paced`: the mock worker (`--prefill-ms 50 --per-token-ms 10`, 32 tokens, batch
    4096), whose truth is known: TTFT p50 - 50 ms and ITL p50 - 10 ms are the client's
    error, its floor the c = 1 row.
- `serve-stream:C`: the same client against the paced mock directly and through `serve`
  (recording; serve shares CPU 1 with the mock), back to back in every round with the
  order swapped: TTFT p50 / p99 and ITL p50 added by serve, and per request the client's
  TTFT minus serve's recorded TTFT, the two rows joined on the answer's `id`, split on
  the shared wall clock into inbound (the client's start to serve's) and outbound
  (serve's first-token stamp to the client's); and the CPU per request of serve and of
  the mock (/proc/PID/stat around each replay).

Every replay records its exchanges (as a campaign would). Within a round the clients of
a cell run one after another, their order rotated every round. Knobs: ROUNDS (default
3), ONLY, NEW_BIN. The table goes to stdout and to benchmarks/results/<date>-streams.md.

PEERS=1 adds AIPerf, GuideLLM and inference-perf (pinned in PEER_VERSIONS) to every
`stream:C` cell, on CPU 0 like replay, each installed from PyPI into a venv of its own
under target/peers/ on first use (inference-perf 0.7 needs Python 3.12: python3.12 on
PATH or pyenv's, else it is left out with a warning; GuideLLM's is ~6 GB), all given a
local tokenizer trained by
benchmarks/peer_tokenizer.py from the embedded corpus (no Hub download), 8 prompt tokens
and 32 output tokens, no warm-up; on the canned worker they are asked for
min(replay's count, max(4 C, 1000)) requests (they run at a few hundred a second), on
the paced one for replay's count:
- AIPerf: `aiperf profile --endpoint-type chat --streaming --concurrency C
  --request-count N --isl 8 --osl 32 --ui-type none --no-server-metrics
  --no-gpu-telemetry`; req/s, count and TTFT p50 from its profile_export_aiperf.json,
  errors from its error_summary; in flight and the ITL from its per-request
  profile_export.jsonl (the median gap between content chunks: its own
  inter_token_latency divides by its tokenizer's count of the text, another quantity);
- GuideLLM: `guidellm run --backend kind=openai_http,... --profile
  kind=concurrent,streams=C --constraint kind=max_requests,count=N --data
  kind=synthetic_text,prompt_tokens=8,output_tokens=32 --output kind=json,...
  --disable-console`; req/s, TTFT p50, ITL p50 and the request totals from the first
  benchmark of its JSON, in flight from the per-request timings in the same file
  (requests asked for but in none of its totals are shown beside the failures).
- inference-perf: its config (JSON, which its YAML loader reads) asks for chat streamed
  to the vllm server type, a `concurrent` stage of exactly N requests at C in one worker
  process (pinned to one core; its default, os.cpu_count(), ignores the pinning),
  `shared_prefix` data with no prefix, 8-token questions and 32 output tokens (its only
  synthetic generator that sends chat with a max_tokens of its own, given an empty
  multimodal block), no Prometheus; req/s, counts and TTFT p50 (`median`) from its
  summary_lifecycle_metrics.json, in flight and the ITL (the median gap between content
  chunks: its own inter_token_latency gives every token of a chunk the chunk's time, by
  its tokenizer's count) from per_request_lifecycle_metrics.json.
Each peer's CPU is its whole process tree (wait4) less a one-request run's (its startup).
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from procs import start, stop_all, wait_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("NEW_BIN") or ROOT / "target" / "release" / "matrix-proxy")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CANNED, PACED, SERVE = 18090, 18091, 18092
TOKENS, PREFILL_MS, TOKEN_MS = 32, 50.0, 10.0
PEERS = os.environ.get("PEERS") == "1"
PEER_DIR = ROOT / "target" / "peers"
PEER_VERSIONS = {"aiperf": "0.13.0", "guidellm": "0.8.1", "inference-perf": "0.7.0"}
# Peers that need a newer Python than the one running this script.
PEER_PYTHON = {"inference-perf": "3.12"}
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

class Cores:
    """Each CPU's busy share over time, from /proc/stat sampled every 50 ms on a thread:
    which side of a cell (client on CPU 0, worker on CPU 1) ran out of core."""

    def __init__(self, every=0.05):
        self.samples, self.every = [], every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def read():
        got = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *v = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    v = [int(x) for x in v[:8]]  # user nice system idle iowait irq softirq steal
                    got[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))
        return got

    def run(self):
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.read()))
            time.sleep(self.every)

    def busiest(self, t0, t1, cpu=1, window=0.5):
        """Over [t0, t1]: the `window`-second span in which `cpu` was busiest, and every
        CPU's busy share (0-1) in that span; None if the span was shorter."""
        s = [x for x in list(self.samples) if t0 <= x[0] <= t1]
        best, j = None, 0
        for i in range(len(s)):
            while j < len(s) and s[j][0] - s[i][0] < window:
                j += 1
            if j == len(s):
                break
            share = {c: (s[j][1][c][0] - s[i][1][c][0]) / max(s[j][1][c][1] - s[i][1][c][1], 1) for c in s[i][1]}
            if best is None or share[cpu] > best[cpu]:
                best = share
        return best


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


def in_flight(spans):
    """(most in flight at once, mean in flight while any was) over (start, end) pairs in
    any one unit: the same reading for every client, from its own per-request records."""
    edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans], key=lambda e: (e[0], e[1]))
    n = most = 0
    busy = area = 0.0
    last = None
    for t, d in edges:
        if last is not None and n > 0:
            busy += t - last
            area += n * (t - last)
        n += d
        most = max(most, n)
        last = t
    return most, (area / busy if busy > 0 else None)


def replay_spans(con, out):
    return con.execute(f"""select start_offset_us, start_offset_us + total_us from '{out}/exchanges/*.parquet'
        where phase = 'measured' and total_us is not null""").fetchall()


def events_per_second(con, out, s):
    ev = con.execute(f"""select sum(event_count) from '{out}/exchanges/*.parquet'
        where phase = 'measured' and outcome = 'ok'""").fetchone()[0] or 0
    secs = sum(x["elapsed_seconds"] for x in s["rounds"])
    return ev / secs if secs > 0 else None


def stream_ms(s, metric, q):
    """The median over the measured rounds of a stream quantile, in ms (rounds without
    one, e.g. with no successful stream, left out)."""
    return med(s, lambda x: None if (x.get("stream") or {}).get(metric, {}).get(q) is None
               else x["stream"][metric][q] * 1e3)


def med(s, f):
    vals = [f(x) for x in s["rounds"]]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def ensure_peers():
    """Each peer in a venv of its own under target/peers/ (pip, pinned), and the local
    tokenizer all are given (trained once by peer_tokenizer.py; no Hub download). A peer
    whose Python cannot be found is left out, with a warning."""
    exes = {}
    for name, version in PEER_VERSIONS.items():
        venv = PEER_DIR / name
        exe = venv / "bin" / name
        if not exe.exists():
            python = peer_python(name)
            if python is None:
                print(f"warning: {name} {version} needs Python {PEER_PYTHON[name]}: install python{PEER_PYTHON[name]}"
                      f" (or `pyenv install {PEER_PYTHON[name]}`) to measure it; left out", file=sys.stderr)
                continue
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", f"{name}=={version}"], check=True)
        exes[name] = exe
    tok = PEER_DIR / "tokenizer"
    if not (tok / "tokenizer.json").exists():
        python = PEER_DIR / "aiperf" / "bin" / "python"
        subprocess.run([str(python), str(ROOT / "benchmarks" / "peer_tokenizer.py"), str(tok),
                        str(ROOT / "src" / "dataset" / "corpus.txt")], check=True, stdout=subprocess.DEVNULL)
    return exes, tok


def peer_python(name):
    """The interpreter a peer's venv is made with: this one, or the newer one it needs
    (python3.X on PATH, else pyenv's under $PYENV_ROOT); None when there is none."""
    need = PEER_PYTHON.get(name)
    if need is None:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = shutil.which(f"python{need}") or next(iter(sorted(pyenv.glob(f"versions/{need}.*/bin/python"))), None)
    return str(found) if found else None


def run_peer(name, cmd, tmp, tag):
    """One peer run on CPU 0: its process tree's CPU seconds and its wall span."""
    log = tmp / f"{name}-{tag}.log"
    t0 = time.monotonic()
    with open(log, "w") as lf:
        p = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=lf, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{name} {tag} failed: {log.read_text()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, (t0, time.monotonic())


def aiperf(exe, tok, tmp, port, c, n, tag):
    """AIPerf's own numbers from its profile_export_aiperf.json; in flight and ITL per chunk
    from its per-request profile_export.jsonl."""
    out = tmp / f"aiperf-{tag}"
    cpu, span = run_peer("aiperf", [
        str(exe), "profile", "--model", "mock", "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
        "--streaming", "--concurrency", str(c), "--request-count", str(n), "--isl", "8", "--osl", str(TOKENS),
        "--random-seed", "1", "--tokenizer", str(tok), "--artifact-dir", str(out), "--ui-type", "none",
        "--no-server-metrics", "--no-gpu-telemetry"], tmp, tag)
    found = list(out.rglob("profile_export_aiperf.json"))
    if not found:
        sys.exit(f"aiperf {tag}: no profile_export_aiperf.json under {out}")
    j = json.loads(found[0].read_text())
    spans, gaps = [], []
    for path in out.rglob("profile_export.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            meta = rec.get("metadata") or {}
            if meta.get("benchmark_phase") == "profiling" and meta.get("request_end_ns"):
                spans.append((meta["request_start_ns"], meta["request_end_ns"]))
                gaps += (rec.get("metrics") or {}).get("inter_chunk_latency", {}).get("value") or []
    shutil.rmtree(out, ignore_errors=True)
    count = j["request_count"]["avg"]
    return {
        "rps": j["request_throughput"]["avg"], "count": count, "cpu": cpu, "span": span, "spans": spans,
        "ttft_p50_ms": j["time_to_first_token"]["p50"],
        # Its inter_token_latency divides by its own tokenizer's count of the output; the
        # gap between content chunks (one token each here) is the quantity the others report.
        "itl_p50_ms": statistics.median(gaps) if gaps else None,
        "failed": sum(e.get("count", 1) for e in j.get("error_summary") or []),
    }


def guidellm(exe, tok, tmp, port, c, n, tag):
    """GuideLLM's own numbers from its benchmarks.json (the first benchmark's metrics);
    in flight from its per-request timings in the same file."""
    out = tmp / f"guidellm-{tag}.json"
    cpu, span = run_peer("guidellm", [
        str(exe), "run", "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},model=mock",
        "--profile", f"kind=concurrent,streams={c}", "--constraint", f"kind=max_requests,count={n}",
        "--data", f"kind=synthetic_text,prompt_tokens=8,output_tokens={TOKENS}",
        "--tokenizer", f"kind=huggingface_auto,model={tok}", "--seed", "kind=static,value=1",
        "--output", f"kind=json,path={out}", "--disable-console"], tmp, tag)
    b = json.loads(out.read_text())["benchmarks"][0]
    out.unlink()
    m, totals = b["metrics"], b["metrics"]["request_totals"]
    spans = [(r["info"]["timings"]["request_start"], r["info"]["timings"]["request_end"])
             for r in b["requests"]["successful"] if r["info"]["timings"].get("request_end")]
    return {
        "rps": m["requests_per_second"]["successful"]["mean"], "count": totals["successful"], "cpu": cpu,
        "span": span, "spans": spans,
        "ttft_p50_ms": m["time_to_first_token_ms"]["successful"]["percentiles"]["p50"],
        "itl_p50_ms": m["inter_token_latency_ms"]["successful"]["percentiles"]["p50"],
        "failed": totals["errored"] + totals["incomplete"],
    }


def inference_perf_config(tok, out, port, c, n):
    """inference-perf's config (JSON, which its YAML loader reads as is): chat completions
    streamed, a concurrent stage of exactly n requests at c in flight in one worker process
    (it is pinned to one core; its default is os.cpu_count(), which ignores the pinning),
    shared_prefix prompts (its only synthetic generator that sends chat with a max_tokens
    of its own: random and synthetic send /v1/completions only, and the rest send the
    client's fixed 30) with no prefix, 8-token questions and 32 output tokens, no
    Prometheus, and the summary and per-request reports under out."""
    return {
        "api": {"type": "chat", "streaming": True},
        "server": {"type": "vllm", "model_name": "mock", "base_url": f"http://127.0.0.1:{port}", "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tok)},
        # An empty multimodal block is what makes shared_prefix send chat (its text-only
        # path sends completions); it adds no media. 100 prompts, cycled, whatever n is,
        # so its start-up work does not grow with n.
        "data": {"type": "shared_prefix", "multimodal": {}, "shared_prefix": {
            "num_groups": 1, "num_prompts_per_group": 100, "system_prompt_len": 0, "question_len": 8,
            "output_len": TOKENS, "seed": 1}},
        "load": {"type": "concurrent", "stages": [{"num_requests": n, "concurrency_level": c}], "num_workers": 1,
                 "interval": 0, "request_timeout": 60, "base_seed": 1},
        "report": {"request_lifecycle": {
            "summary": True, "per_stage": False, "per_request": True, "per_adapter": False,
            "per_request_fields": {"request": False, "response": False, "info": True, "response_chunks": False,
                                   "computed_metrics": False}},
            "prometheus": None},
        "storage": {"local_storage": {"path": str(out)}},
    }


def inference_perf(exe, tok, tmp, port, c, n, tag):
    """inference-perf's own numbers from its summary_lifecycle_metrics.json (req/s, counts,
    TTFT p50); in flight and the ITL per chunk from the per-request timings (one
    perf_counter clock across its processes) in per_request_lifecycle_metrics.json."""
    out = tmp / f"inference-perf-{tag}"
    cfg = tmp / f"inference-perf-{tag}.yaml"
    cfg.write_text(json.dumps(inference_perf_config(tok, out, port, c, n)))
    cpu, span = run_peer("inference-perf", ["env", "HF_HUB_OFFLINE=1", str(exe), "--config_file", str(cfg)], tmp, tag)
    cfg.unlink()
    summary = out / "summary_lifecycle_metrics.json"
    if not summary.exists():
        sys.exit(f"inference-perf {tag}: no summary_lifecycle_metrics.json under {out}")
    s = json.loads(summary.read_text())
    spans, gaps = [], []
    for r in json.loads((out / "per_request_lifecycle_metrics.json").read_text()):
        if r.get("error") is None:
            spans.append((r["start_time"], r["end_time"]))
            times = ((r["info"] or {}).get("response_metrics") or {}).get("chunk_times") or []
            gaps += [b - a for a, b in zip(times, times[1:])]
    shutil.rmtree(out, ignore_errors=True)
    ok = s.get("successes") or {}
    ttft = (ok.get("latency") or {}).get("time_to_first_token")
    return {
        "rps": (ok.get("throughput") or {}).get("requests_per_sec", 0.0), "count": ok.get("count", 0), "cpu": cpu, "span": span, "spans": spans,
        "ttft_p50_ms": ttft["median"] * 1e3 if ttft else None,
        # Its own inter_token_latency re-tokenizes each chunk with the local tokenizer and
        # gives every token of a chunk the chunk's time (zero gaps inside a chunk): with a
        # tokenizer not the mock's, another quantity. The gap between content chunks (one
        # mock token each) is the quantity the others report.
        "itl_p50_ms": statistics.median(gaps) * 1e3 if gaps else None,
        "failed": (s.get("failures") or {}).get("count", 0),
    }


PEER_RUNS = {"aiperf": aiperf, "guidellm": guidellm, "inference-perf": inference_perf}


def peer_cell(name, peers, startup_cpu, tmp, cores, port, c, n, tag):
    exes, tok = peers
    got = PEER_RUNS[name](exes[name], tok, tmp, port, c, n, tag)
    most, mean = in_flight(got["spans"])
    return {
        "rps": got["rps"], "events_per_s": None,
        "cpu_s_per_1000": 1000 * max(got["cpu"] - startup_cpu, 0.0) / max(got["count"], 1),
        "in_flight": most, "in_flight_mean": mean,
        "ttft_p50_ms": got["ttft_p50_ms"], "itl_p50_ms": got["itl_p50_ms"], "failed": got["failed"],
        # Asked for but in neither count of its report (GuideLLM's max_requests stops a few short).
        "unreported": max(n - int(got["count"]) - got["failed"], 0),
        "cores": cores.busiest(*got["span"]),
    }

def wrk_cell(tmp, cores, c):
    """nginx's own ceiling on the canned body: wrk (one thread, CPU 0, 3 s) POSTs the same
    request and reads each answer by its Content-Length, parsing no event. Where replay
    reaches less and CPU 0 is the busy one, the client (ours) is the limit."""
    lua = tmp / "post.lua"
    body = json.dumps(plan(CANNED, c, 1, "wrk")["cases"][0]["request"])
    lua.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = {json.dumps(body)}\n')
    cmd = ["taskset", "-c", "0", "wrk", "-t1", f"-c{c}", "-d3s", "-s", str(lua),
           f"http://127.0.0.1:{CANNED}/v1/chat/completions"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    t1 = time.monotonic()
    done = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if os.waitstatus_to_exitcode(status) != 0 or not done or not rps:
        sys.exit(f"wrk -c{c} failed: {out}")
    n = int(done.group(1))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(rps.group(1)), "events_per_s": 36 * float(rps.group(1)),
        "cpu_s_per_1000": 1000 * (usage.ru_utime + usage.ru_stime) / max(n, 1), "in_flight": c,
        "in_flight_mean": None,
        "ttft_p50_ms": None, "itl_p50_ms": None,
        "failed": (sum(int(x) for x in errors.groups()) if errors else 0) + (int(non2xx.group(1)) if non2xx else 0),
        "cores": cores.busiest(t0, t1),
    }


def cell_requests(worker, c):
    if worker == "paced":  # ~0.37 s a request: fewer, or a round takes minutes
        return max(c * 4, 50)
    return {1: 400, 64: 4000, 256: 8000, 1024: 16000}.get(c, 20 * c)


def peer_requests(worker, c):
    """The peers run at a few hundred requests a second at most: on the canned worker they
    get fewer requests than replay (a rate is compared, not a count)."""
    n = cell_requests(worker, c)
    return n if worker == "paced" else min(n, max(4 * c, 1000))


def stream_cell(tmp, con, cores, worker, port, c, r):
    n = cell_requests(worker, c)
    t0 = time.monotonic()
    s, cpu, requests, out = replay(tmp, port, c, n, f"{worker}-{c}-{r}")
    most, mean = in_flight(replay_spans(con, out))
    row = {
        "rps": med(s, lambda x: x["successful_requests_per_second"]),
        "events_per_s": events_per_second(con, out, s),
        "cpu_s_per_1000": 1000 * cpu / max(requests, 1),
        "in_flight": most, "in_flight_mean": mean,
        "ttft_p50_ms": stream_ms(s, "ttft_seconds", "p50"),
        "itl_p50_ms": stream_ms(s, "itl_seconds", "p50"),
        "failed": sum(x["attempted_requests"] - x["successful_requests"] for x in s["rounds"]),
        "cores": cores.busiest(t0, time.monotonic()),
    }
    shutil.rmtree(out, ignore_errors=True)
    return row


def cpu_seconds(pid):
    """User + system CPU seconds of a running process so far (/proc/PID/stat)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def serve_pair(tmp, con, mock_pid, c, r):
    """Direct and through serve, back to back, order swapped every round. Through serve,
    each request's TTFT gap (client's minus serve's) is split in two on the shared wall
    clock: inbound (the client's start to serve's start: the request waiting to be read
    and forwarded) and outbound (serve's first-token stamp to the client's: the event
    waiting to be relayed); and the CPU per request of serve and of the mock is read."""
    rows = {}
    order = ("direct", "serve") if r % 2 == 0 else ("serve", "direct")
    for side in order:
        tag = f"serve-stream-{side}-{c}-{r}"
        n = max(c * 4, 200)
        mock0 = cpu_seconds(mock_pid)
        if side == "serve":
            live = tmp / f"live-{c}-{r}"
            sp = start([str(BIN), "serve", "--quiet", "--listen", f"127.0.0.1:{SERVE}", "--upstream",
                        f"http://127.0.0.1:{PACED}", "--out", str(live)], 1, tmp / f"serve-{r}.log")
            wait_port(SERVE)
            serve0 = cpu_seconds(sp.pid)
            s, _, requests, out = replay(tmp, SERVE, c, n, tag)
            serve_cpu = cpu_seconds(sp.pid) - serve0  # its encoding after the last row is not in it
            sp.send_signal(2)
            sp.wait(timeout=60)
            rows["join"] = con.execute(f"""
                with c as (select regexp_extract(decode(response_body), '"id":"([^"]+)"', 1) id, ttft_us,
                                  epoch_us(started_at) w
                           from '{out}/exchanges/*.parquet' where phase = 'measured' and outcome = 'ok' and is_stream),
                     s as (select regexp_extract(decode(response_body), '"id":"([^"]+)"', 1) id, ttft_us,
                                  epoch_us(started_at) w
                           from '{live}/exchanges/*.parquet' where outcome = 'ok' and is_stream),
                     j as (select c.ttft_us - s.ttft_us gap, s.w - c.w inbound,
                                  (c.w + c.ttft_us) - (s.w + s.ttft_us) outbound from c join s using (id))
                select quantile_disc(gap, 0.5), quantile_disc(gap, 0.99), count(*),
                       quantile_disc(inbound, 0.5), quantile_disc(inbound, 0.99),
                       quantile_disc(outbound, 0.5), quantile_disc(outbound, 0.99) from j""").fetchone()
            rows["serve_cpu_ms"] = 1000 * serve_cpu / max(requests, 1)
            shutil.rmtree(live, ignore_errors=True)
        else:
            s, _, requests, out = replay(tmp, PACED, c, n, tag)
        rows[side] = {
            "ttft_p50_ms": stream_ms(s, "ttft_seconds", "p50"),
            "ttft_p99_ms": stream_ms(s, "ttft_seconds", "p99"),
            "itl_p50_ms": stream_ms(s, "itl_seconds", "p50"),
            "mock_cpu_ms": 1000 * (cpu_seconds(mock_pid) - mock0) / max(requests, 1),
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
    got = {}
    try:
        nginx(tmp)
        mock = start([str(BIN), "mock-worker", "--listen", f"127.0.0.1:{PACED}", "--prefill-ms", str(PREFILL_MS),
               "--per-token-ms", str(TOKEN_MS), "--max-tokens", str(TOKENS), "--max-batch", "4096"],
              1, tmp / "mock.log")
        wait_port(PACED)
        cells = sorted(ONLY)
        cores = Cores()
        peers, startup = None, {}
        if PEERS:
            peers = ensure_peers()
            for name in peers[0]:  # a one-request run: the CPU each spends starting and stopping
                startup[name] = PEER_RUNS[name](peers[0][name], peers[1], tmp, CANNED, 1, 1, "startup")["cpu"]
        for r in range(ROUNDS):
            for kind, c in cells:
                if kind != "stream":
                    got.setdefault(("serve", c, "replay"), []).append(serve_pair(tmp, con, mock.pid, c, r))
                    continue
                for worker, port in (("canned", CANNED), ("paced", PACED)):
                    clients = ["replay"] + (["wrk"] if worker == "canned" else []) + (list(peers[0]) if peers else [])
                    for client in clients[r % len(clients):] + clients[:r % len(clients)]:  # order rotated
                        if client == "replay":
                            row = stream_cell(tmp, con, cores, worker, port, c, r)
                        elif client == "wrk":
                            row, client = wrk_cell(tmp, cores, c), "wrk (no SSE parsing)"
                        else:
                            row = peer_cell(client, peers, startup[client], tmp, cores, port, c,
                                            peer_requests(worker, c), f"{worker}-{c}-{r}")
                            client = f"{client} {PEER_VERSIONS[client]}"
                        got.setdefault((worker, c, client), []).append(row)
    finally:
        stop_all(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
        # The raw rows first: a report that fails to build loses nothing measured.
        raw = ROOT / "target" / "streams-raw.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps({" ".join(map(str, k)): v for k, v in got.items()}, indent=1, default=str))
    print(report(got))
    return 0


def failed(rows):
    f, u = sum(x["failed"] for x in rows), sum(x.get("unreported", 0) for x in rows)
    return f"{f} ({u} asked for, not reported)" if u else str(f)


def busy(rows):
    shares = [x["cores"] for x in rows if x.get("cores")]
    if not shares:
        return "-"
    return " / ".join(f"{100 * statistics.median(sh[c] for sh in shares):.0f} %" for c in (0, 1))


def ceiling(got):
    """Whose core ran out on the canned worker: replay's rate against wrk's on the same nginx."""
    lines = []
    for (worker, c, client), rows in sorted(got.items()):
        w = got.get((worker, c, "wrk (no SSE parsing)"))
        if worker != "canned" or client != "replay" or not w:
            continue
        if not lines:
            lines = ["", "Ceiling on the canned worker: replay against wrk driving the same nginx from the same core "
                     "(wrk reads each answer by its length and parses nothing; the first figure per core is "
                     "replay's, the second wrk's):", ""]
        rr, wr = statistics.median(x["rps"] for x in rows), statistics.median(x["rps"] for x in w)
        lines.append(f"- c = {c}: replay {rr:,.0f} req/s, wrk {wr:,.0f} req/s ({rr / wr:.2f}x); "
                     f"CPU 0 / 1 busy {busy(rows)} against {busy(w)}")
    return lines


def report(got):
    lines = [f"# Streams ({time.strftime('%Y-%m-%d')})", "",
             f"`{' '.join(f'{k}={os.environ[k]}' for k in ('PEERS', 'ONLY', 'ROUNDS') if k in os.environ)} "
             f"python3 benchmarks/streams.py`: {ROUNDS} rounds, medians (spread = (max - min) / median); "
             f"{os.cpu_count()} CPUs, client on CPU 0, workers on CPU 1; {BIN}.", ""]
    lines += ["req/s is each client's own figure (replay: the measured rounds' rate); client CPU is its whole "
              "process tree over every phase (replay's deferred Parquet encoding included; a peer's less a "
              "one-request run's); in flight is the most at once / the mean while any was, from each client's "
              "own per-request records; CPU 0 / 1 busy is each core's share in the 0.5 s when the worker's "
              "core (1) was busiest.", "",
              "| worker | c | client | req/s | events/s | client CPU s / 1,000 req | in flight (most / mean) | "
              "CPU 0 / 1 busy | TTFT p50 ms | ITL p50 ms | failed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    if all(w == "serve" for w, _, _ in got):
        lines = lines[:-2]  # no stream cell: no table
    for (worker, c, client), rows in sorted(got.items()):
        if worker == "serve":
            continue
        col = lambda k: spread([x.get(k) for x in rows])
        most = statistics.median(x["in_flight"] for x in rows) if rows[0]["in_flight"] is not None else None
        mean = [x["in_flight_mean"] for x in rows if x.get("in_flight_mean") is not None]
        flight = f"{most:.0f} / {statistics.median(mean):.1f}" if most is not None and mean else \
            (f"{most:.0f} (connections)" if most is not None else "-")
        lines.append(f"| {worker} | {c} | {client} | {col('rps')} | {col('events_per_s')} | {col('cpu_s_per_1000')} | "
                     f"{flight} | {busy(rows)} | {col('ttft_p50_ms')} | {col('itl_p50_ms')} | "
                     f"{failed(rows)} |")
    lines += ceiling(got)
    paced = {(c, client): rows for (w, c, client), rows in got.items() if w == "paced"}
    if paced:
        lines += ["", f"Paced mock: the truth is TTFT {PREFILL_MS:.0f} ms and ITL {TOKEN_MS:.0f} ms; "
                  "the client's error (median TTFT p50 - truth, ITL p50 - truth):", ""]
        for (c, client), rows in sorted(paced.items()):
            def error(key, truth, digits):
                vals = [x[key] for x in rows if x[key] is not None]
                return f"{statistics.median(vals) - truth:+.{digits}f} ms" if vals else "-"
            lines.append(f"- {client}, c = {c}: TTFT {error('ttft_p50_ms', PREFILL_MS, 2)}, "
                         f"ITL {error('itl_p50_ms', TOKEN_MS, 3)}" + (" (the floor)" if c == 1 else ""))
    for (worker, c, _), rows in sorted(got.items()):
        if worker != "serve":
            continue
        lines += ["", f"Through serve (recording) against direct, paced mock, c = {c} (serve shares CPU 1 with "
                  "the mock), added by serve per round:", ""]
        for k, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50")):
            d = [None if x["serve"][k] is None or x["direct"][k] is None else x["serve"][k] - x["direct"][k]
                 for x in rows]
            lines.append(f"- {label}: " + ", ".join("-" if v is None else f"{v:+.2f} ms" for v in d))
        for x in rows:
            if not x["join"] or x["join"][2] == 0:
                lines.append("- no request of this round could be joined to serve's record")
                continue
            p50, p99, n, in50, in99, out50, out99 = x["join"]
            lines.append(f"- client TTFT - serve's recorded TTFT, per request joined on the answer id: "
                         f"p50 {p50 / 1000:.2f} ms, p99 {p99 / 1000:.2f} ms ({n} requests); inbound (client's "
                         f"start to serve's) p50 {in50 / 1000:.2f} / p99 {in99 / 1000:.2f} ms, outbound (serve's "
                         f"first-token stamp to the client's) p50 {out50 / 1000:.2f} / p99 {out99 / 1000:.2f} ms")
        cpu = lambda f: statistics.median(f(x) for x in rows)
        lines.append(f"- CPU per request on CPU 1 (medians): serve {cpu(lambda x: x['serve_cpu_ms']):.2f} ms "
                     f"(its runtime and recorder threads), the mock {cpu(lambda x: x['serve']['mock_cpu_ms']):.2f} ms "
                     f"through serve, {cpu(lambda x: x['direct']['mock_cpu_ms']):.2f} ms direct")
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

"""Side-by-side speed of matrix-proxy against nginx, HAProxy, wrk and oha (issue 5).

Run through `bash benchmarks/run.sh`, which installs the tools and builds the release
binary. Everything runs on this machine, on loopback only, bounded in time:
- proxy overhead: wrk (CPU 0) -> [no proxy | nginx | HAProxy | matrix-proxy serve] (CPU 1)
  -> nginx upstream returning ~1 KiB of JSON (CPU 1), interleaved A B C D A B C D;
- load generation: [wrk | oha | matrix-proxy replay] (CPU 0) -> the same upstream (CPU 1),
  keep-alive, and fresh connections (oha --disable-keepalive vs replay's fresh policy).
Results are medians over rounds, reported as ratios measured in the same run. A markdown
table goes to stdout and to benchmarks/results/<date>-proxy.md.

Environment: DUR (seconds per measurement, default 5), ROUNDS (default 3), CONC (default
"1,16,64"), SOAK=1 adds the 10-minute soak of serve under 1,000 keep-alive connections,
WRITER=0 skips the writer bench.

Comparing two builds (the re-layout check; see benchmarks/README.md):
- OLD_BIN=/path/to/old/matrix-proxy adds `serve` of that binary to the proxy table and its
  `replay` (recording and --no-record) to the generator table, each measured back to back
  with the new binary's in every round (the order of the two swapped every round), and a
  "Re-layout check: new / old" section with the ratios;
- OLD_WRITER_BENCH=/path/to/old/writer-bench-executable runs the old writer bench and the
  new one (built by `cargo bench --bench writer --no-run`) alternately, WRITER_ROUNDS times
  each (default 3, at least 3), as `taskset -c 0 <exe> --bench`, and adds their ratios;
- ONLY=serve:16,replay:64,writer measures only those cells (with the reference targets
  their rows need), to rerun a noisy cell cheaply; `serve` or `replay` alone means every
  concurrency in CONC;
- NEW_BIN (default target/release/matrix-proxy) and NEW_WRITER_BENCH (default: built as
  above) override the new side.

The cost of live metrics (issue 17): METRICS=1 adds `serve --metrics-listen` (a second
serve of the same binary, its /metrics scraped once a second for the whole run) to the
proxy table and `replay --metrics-listen` to the generator table, each back to back with
the plain target in every round (their order swapped every round), and a "Live metrics
cost" section with the with / without ratios (target: >= 0.97, "<= 3 % apart").
"""

import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import start, stop_all, wait_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("NEW_BIN") or ROOT / "target" / "release" / "matrix-proxy")
OLD_BIN = Path(os.environ["OLD_BIN"]) if os.environ.get("OLD_BIN") else None
OLD_WRITER_BENCH = Path(os.environ["OLD_WRITER_BENCH"]) if os.environ.get("OLD_WRITER_BENCH") else None
DUR = int(os.environ.get("DUR", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONC = [int(c) for c in os.environ.get("CONC", "1,16,64").split(",")]
WRITER_ROUNDS = max(3, int(os.environ.get("WRITER_ROUNDS", "3")))
UP, NGX, HAP, MPX, SOAK, MPX_OLD, MPX_MET, MET_PORT = 18080, 18081, 18082, 18083, 18084, 18085, 18086, 18087
METRICS = os.environ.get("METRICS") == "1"
METRICS_RATIO = 0.97
# The re-layout check's acceptance: new / old median >= ACCEPT_RATIO in every cell; a cell
# whose rounds spread more than NOISY_PCT % on either side is rerun (ONLY=...).
ACCEPT_RATIO, NOISY_PCT, ACCEPT_ROUNDS = 0.97, 10.0, 5
BODY = json.dumps({"id": "bench", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "x" * 880}, "finish_reason": "stop"}]},
    separators=(",", ":"))
assert "'" not in BODY and len(BODY) < 1100


def parse_only(text):
    """ONLY="serve:16,replay:64,fresh:1,writer" -> {("serve", 16), ("replay", 64), ("fresh", 1),
    ("writer", None)}; None when unset (everything). `serve`, `replay` or `fresh` without `:C`
    means every c in CONC."""
    if not text.strip():
        return None
    cells = set()
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        kind, _, c = tok.partition(":")
        if kind == "writer" and not c:
            cells.add(("writer", None))
        elif kind in ("serve", "replay", "fresh") and not c:
            cells.update((kind, x) for x in CONC)
        elif kind in ("serve", "replay", "fresh") and c.isdigit() and int(c) > 0:
            cells.add((kind, int(c)))
        else:
            sys.exit(f"ONLY: cannot read {tok!r}; expected serve:C, replay:C, fresh:C, serve, replay, fresh or "
                     "writer, comma-separated")
    return cells


ONLY = parse_only(os.environ.get("ONLY", ""))
if ONLY is None:
    PROXY_CONC, GEN_CONC, FRESH_CONC, RUN_WRITER = CONC, CONC, CONC, True
else:
    PROXY_CONC = sorted(c for k, c in ONLY if k == "serve")
    GEN_CONC = sorted(c for k, c in ONLY if k == "replay")
    FRESH_CONC = sorted(c for k, c in ONLY if k == "fresh")
    RUN_WRITER = ("writer", None) in ONLY


def to_ms(v, unit):
    return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(port, c, path="/"):
    out = subprocess.run(
        ["taskset", "-c", "0", "wrk", "-t1", f"-c{c}", f"-d{DUR}s", "--latency", f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {}
    for p in ("50", "99"):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        lat[p] = to_ms(m.group(1), m.group(2)) if m else None
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": lat["50"], "p99_ms": lat["99"], "non2xx": int(errors.group(1)) if errors else 0}


def oha(c, fresh=False):
    cmd = ["taskset", "-c", "0", "oha", "--no-tui", "-z", f"{DUR}s", "-c", str(c), "--output-format", "json",
           f"http://127.0.0.1:{UP}/"]
    if fresh:
        cmd.insert(-1, "--disable-keepalive")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    return {"rps": j["summary"]["requestsPerSec"]}


def replay(c, n, tmp, fresh=False, tag="", record=True, binary=None, metrics=False):
    plan = {
        "endpoint": f"http://127.0.0.1:{UP}/",
        "connection": "fresh" if fresh else "keep-alive",
        "cases": [{"name": "bench", "method": "GET", "expected_response_text": BODY}],
        "concurrency": [c], "requests_per_case": max(n, c), "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 10,
        "metadata": {k: "N/A: benchmark" for k in ["gpu", "gpu_ids", "driver", "cuda", "precision",
                     "model_revision", "runtime_revision", "cache_policy", "cuda_evidence", "reservation", "host"]},
    }
    p = tmp / f"plan-{tag}.json"
    p.write_text(json.dumps(plan))
    out = tmp / f"replay-{tag}"
    cmd = ["taskset", "-c", "0", str(binary or BIN), "replay", "--quiet", "--out", str(out), str(p)]
    if not record:
        cmd.insert(5, "--no-record")
    if metrics:
        cmd[5:5] = ["--metrics-listen", "127.0.0.1:0"]
    err = tmp / f"replay-{tag}.err"
    with open(err, "w") as ef:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=ef)
        threads, rusage, rc, hwm_kib = watch_threads(proc)
    if rc != 0:
        sys.exit(f"replay failed ({rc}): {err.read_text()}")
    s = json.loads((out / "summary.json").read_text())
    rates = [x["successful_requests_per_second"] for x in s["rounds"]]
    shares = [x["generator"]["cpu_share"] for x in s["rounds"]]
    warned = sum(1 for x in s["rounds"] if x["generator"]["warning"])
    # Guards against winning by moving work: every request of every phase, the process's
    # whole CPU time (rounds and what was left for after them), rows = requests, a sample
    # of recorded bodies, and every thread's CPU list.
    requests = sum(x["attempted_requests"] for x in s["rounds"]) + \
        sum(x["attempted_requests"] for x in s["excluded_phases"].values())
    cpu_s = rusage.ru_utime + rusage.ru_stime
    guard = {"requests": requests, "cpu_us_per_request": 1e6 * cpu_s / max(requests, 1), "threads": threads,
             "rows_ok": None, "bodies_ok": None,
             # Peak resident memory (Linux: KiB), and the rows one measured round holds.
             "peak_rss_kib": hwm_kib, "round_rows": plan["requests_per_case"]}
    if record:
        guard["rows_ok"] = s.get("rows_written") == requests
        guard["bodies_ok"] = sample_bodies(out / "exchanges")
        guard["encoded_during_rounds"] = s.get("rows_encoded_during_rounds")
    shutil.rmtree(out, ignore_errors=True)
    return {"rps": statistics.median(rates), "cpu_share": statistics.median(shares), "warned": warned,
            "rounds": len(rates), "guard": guard}


def watch_threads(proc, every_s=0.2):
    """Wait for a process, reading each of its threads' name, allowed CPUs and CPU ticks
    every `every_s` (the last reading of a thread is kept), and the process's peak resident
    memory (`VmHWM`, its last reading: wait4's `ru_maxrss` is not the child's own here).
    Returns (threads: name -> {cpus, ticks}, rusage of the process, exit status, peak KiB)."""
    seen = {}
    hwm = None
    while True:
        try:
            m = re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text())
            hwm = int(m.group(1)) if m else hwm
        except OSError:
            pass
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                status = (task / "status").read_text()
            except OSError:
                continue
            ticks = cpu_ticks(None, task / "stat")
            if ticks is None:
                continue
            fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
            seen[task.name] = {"name": fields.get("Name", "?").strip(),
                               "cpus": fields.get("Cpus_allowed_list", "?").strip(),
                               "ticks": ticks}
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        time.sleep(every_s)
    threads = {}
    for t in seen.values():
        name = re.sub(r"[-_]?\d+$", "", t["name"])  # tokio-runtime-w, matrix-recorder, ...
        entry = threads.setdefault(name, {"cpus": set(), "ticks": 0, "count": 0})
        entry["cpus"].add(t["cpus"])
        entry["ticks"] += t["ticks"]
        entry["count"] += 1
    return threads, rusage, proc.returncode, hwm


def sample_bodies(exchanges, n=20):
    """Whether n measured rows read back from the Parquet parts carry the upstream's body
    byte for byte; None when pyarrow is not installed."""
    try:
        import pyarrow.dataset as ds
    except ImportError:
        return None
    t = ds.dataset(str(exchanges), format="parquet").to_table(
        columns=["phase", "response_body", "outcome"], filter=ds.field("phase") == "measured")
    if t.num_rows == 0:
        return False
    step = max(1, t.num_rows // n)
    rows = t.take(list(range(0, t.num_rows, step))[:n]).to_pylist()
    return all(r["response_body"] == BODY.encode() and r["outcome"] == "ok" for r in rows)


SERVE, SERVE_OLD = "matrix-proxy serve", "matrix-proxy serve, old binary"
SERVE_MET = "matrix-proxy serve --metrics-listen (scraped 1/s)"
GEN_NAMES = {"replay": "matrix-proxy replay (validating, recording)",
             "replay norec": "matrix-proxy replay (validating, --no-record)",
             "replay old": "matrix-proxy replay (validating, recording), old binary",
             "replay old norec": "matrix-proxy replay (validating, --no-record), old binary",
             "oha fresh": "oha --disable-keepalive", "replay fresh": "matrix-proxy replay, fresh connections",
             "replay metrics": "matrix-proxy replay --metrics-listen (validating, recording)"}
TAGS = {"replay": "", "replay old": "o", "replay norec": "n", "replay old norec": "no", "replay metrics": "m"}
SHORT = {"replay norec": "replay --no-record", "replay old": "replay-old",
         "replay old norec": "replay-old --no-record", "replay metrics": "replay --metrics-listen"}


def serve_cmd(binary, port, out):
    return [str(binary), "serve", "--quiet", "--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{UP}",
            "--out", str(out)]


def with_metrics(r, targets, plain, metered):
    """With METRICS=1, `metered` placed back to back with `plain` in `targets`: after it in
    even rounds, before it in odd ones."""
    if not METRICS:
        return targets
    i = next(k for k, t in enumerate(targets) if t[0] == plain)
    return targets[:i + 1] + [metered] + targets[i + 1:] if r % 2 == 0 else targets[:i] + [metered] + targets[i:]


def scraper(port, stop):
    """Scrape http://127.0.0.1:PORT/metrics once a second until `stop` is set; the count."""
    import urllib.request
    n = 0
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            n += 1
        except OSError:
            pass
    return n


def pair(r, new, old):
    """The new binary's target and, with OLD_BIN, the old one's, back to back; their order
    swaps every round, so neither always runs right after the other (on serve's core the
    recorder of the one before may still be busy) nor always first."""
    if OLD_BIN is None:
        return [new]
    return [new, old] if r % 2 == 0 else [old, new]


def cpu_ticks(pid, stat=None):
    """utime + stime of a process (all its threads), or of the thread whose /proc stat file
    is `stat`, in clock ticks; None when gone."""
    try:
        f = Path(stat or f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return None


def settle(proc, quiet_s=0.3, limit_s=10.0):
    """Wait until a serve process stops using CPU (its recorder has caught up after wrk
    ended), at most limit_s, so the next target on its core does not pay for it."""
    deadline = time.monotonic() + limit_s
    last = cpu_ticks(proc.pid)
    while last is not None and time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_ticks(proc.pid)
        if now == last:
            return
        last = now


def result_path():
    """benchmarks/results/<date>-proxy.md, or -2, -3 ... when a run of the same day is there."""
    day = datetime.date.today().isoformat()
    out = ROOT / "benchmarks" / "results" / f"{day}-proxy.md"
    n = 2
    while out.exists():
        out = out.with_name(f"{day}-proxy-{n}.md")
        n += 1
    return out


def cpu_times():
    """(all CPU time, steal time) in ticks since boot, from /proc/stat; None where unreadable."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return sum(f[:8]), (f[7] if len(f) > 7 else 0)


def steal_share(a, b):
    """Share of CPU time the hypervisor gave to others between two cpu_times() samples."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    return (b[1] - a[1]) / (b[0] - a[0])


def values(rows, key):
    return [r[key] for r in rows if r.get(key) is not None]


def spread_pct(rows, key):
    """(max - min) / median of the rounds, as a percentage: how far the rounds disagreed;
    None with fewer than two rounds."""
    vals = values(rows, key)
    mid = statistics.median(vals) if len(vals) >= 2 else 0
    if mid == 0:
        return None
    return 100 * (max(vals) - min(vals)) / mid


def spread(rows, key):
    s = spread_pct(rows, key)
    return "-" if s is None else f"{s:.0f}%"


def median(rows, key):
    vals = values(rows, key)
    return statistics.median(vals) if vals else None


def paired(rows, ref, key="rps"):
    """The median of the per-round ratios rows[r] / ref[r] (both measured in round r, one
    after the other) and their range, as the issues' targets define a ratio."""
    xs = sorted(a[key] / b[key] for a, b in zip(rows, ref) if a.get(key) and b.get(key))
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f}x ({xs[0]:.2f}-{xs[-1]:.2f})"


def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"


def main():
    tmp = Path(tempfile.mkdtemp(prefix="mp-bench-"))
    try:
        return run(tmp)
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def upstream_conf(tmp):
    """The nginx upstream's config (1 KiB of JSON on 127.0.0.1:UP, keep-alive without
    limits), written under `tmp` (which has logs/); its path."""
    conf = tmp / "upstream.conf"
    conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/up.pid; error_log {tmp}/logs/up.err;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;
  server {{ listen 127.0.0.1:{UP} backlog=8192; location / {{ default_type application/json; return 200 '{BODY}'; }} }} }}
""")
    return conf


def run(tmp):
    (tmp / "logs").mkdir()
    up_conf = upstream_conf(tmp)
    ngx_conf = tmp / "proxy.conf"
    ngx_conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/ngx.pid; error_log {tmp}/logs/ngx.err;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;
  upstream up {{ server 127.0.0.1:{UP}; keepalive 256; keepalive_requests 100000000; }}
  server {{ listen 127.0.0.1:{NGX} backlog=8192;
    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering on; }} }} }}
""")
    hap_conf = tmp / "haproxy.cfg"
    hap_conf.write_text(f"""
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  http-reuse always
frontend f
  bind 127.0.0.1:{HAP}
  default_backend b
backend b
  server s1 127.0.0.1:{UP} maxconn 10000
""")
    for b in [BIN] + ([OLD_BIN] if OLD_BIN else []):
        if not (b.is_file() and os.access(b, os.X_OK)):
            sys.exit(f"no executable matrix-proxy at {b}")
    start(["nginx", "-p", str(tmp), "-c", str(up_conf)], 1, tmp / "logs/up.log")
    start(["nginx", "-p", str(tmp), "-c", str(ngx_conf)], 1, tmp / "logs/ngx.log")
    start(["haproxy", "-f", str(hap_conf)], 1, tmp / "logs/hap.log")
    ports = [UP, NGX, HAP]
    serves = {}  # target name -> its serve process, to let its recorder settle (OLD_BIN only)
    scraping = None
    if PROXY_CONC:
        serves[SERVE] = start(serve_cmd(BIN, MPX, tmp / "serve-run"), 1, tmp / "logs/serve.log")
        ports.append(MPX)
        if METRICS:
            cmd = serve_cmd(BIN, MPX_MET, tmp / "serve-met-run") + ["--metrics-listen", f"127.0.0.1:{MET_PORT}"]
            serves[SERVE_MET] = start(cmd, 1, tmp / "logs/serve-met.log")
            ports += [MPX_MET, MET_PORT]
        if OLD_BIN:
            serves[SERVE_OLD] = start(serve_cmd(OLD_BIN, MPX_OLD, tmp / "serve-old-run"), 1, tmp / "logs/serve-old.log")
            ports.append(MPX_OLD)
    for port in ports:
        wait_port(port)

    if METRICS and PROXY_CONC:
        import concurrent.futures
        import threading
        stop_scrape = threading.Event()
        scraping = (stop_scrape, concurrent.futures.ThreadPoolExecutor(1).submit(scraper, MET_PORT, stop_scrape))
    cpu_at_start = cpu_times()
    proxy = {}
    for r in range(ROUNDS):
        for c in PROXY_CONC:
            targets = [("no proxy", UP), ("nginx", NGX)]
            if ONLY is None:  # a rerun of some cells measures the references their rows need
                targets.append(("HAProxy", HAP))
            targets += pair(r, (SERVE, MPX), (SERVE_OLD, MPX_OLD))
            targets = with_metrics(r, targets, SERVE, (SERVE_MET, MPX_MET))
            for name, port in targets:
                proxy.setdefault((name, c), []).append(wrk(port, c))
                print(f"round {r + 1}/{ROUNDS} c={c} {name}: {proxy[(name, c)][-1]['rps']:,.0f} req/s", file=sys.stderr)
                if name in serves and (OLD_BIN or METRICS):
                    settle(serves[name])

    gen = {}

    def add(key, c, v):
        gen.setdefault((key, c), []).append(v)
        return v

    for r in range(ROUNDS):
        for c in sorted(set(GEN_CONC) | set(FRESH_CONC)):
            if c in GEN_CONC:
                w = add("wrk", c, wrk(UP, c))
                add("oha", c, oha(c))
                n = int(w["rps"] * DUR / 2)  # two measured rounds of DUR/2 s each, roughly
                plain = pair(r, ("replay", BIN), ("replay old", OLD_BIN))
                for key, b in with_metrics(r, plain, "replay", ("replay metrics", BIN)):
                    add(key, c, replay(c, n, tmp, tag=f"{TAGS[key]}{r}-{c}", binary=b,
                                       metrics=key == "replay metrics"))
                for key, b in pair(r, ("replay norec", BIN), ("replay old norec", OLD_BIN)):
                    add(key, c, replay(c, n, tmp, tag=f"{TAGS[key]}{r}-{c}", record=False, binary=b))
            if c in FRESH_CONC:
                of = add("oha fresh", c, oha(c, fresh=True))
                add("replay fresh", c, replay(c, int(of["rps"] * DUR / 2), tmp, fresh=True, tag=f"f{r}-{c}"))
            print(f"round {r + 1}/{ROUNDS} c={c}: " + ", ".join(
                f"{SHORT.get(k, k)} {v[-1]['rps']:,.0f}" for (k, cc), v in gen.items() if cc == c), file=sys.stderr)

    steal = steal_share(cpu_at_start, cpu_times())
    if scraping:
        scraping[0].set()
        print(f"scraped serve's /metrics {scraping[1].result()} times", file=sys.stderr)
    # The main tables are written before the soak, so a failed soak loses nothing.
    wb = wcheck = None
    if os.environ.get("WRITER", "1") == "1" and RUN_WRITER:
        if OLD_WRITER_BENCH:
            wcheck = writer_compare(tmp)
            wb = wcheck["lines"]
        else:
            wb = writer_bench()
    out = result_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report(proxy, gen, None, None, wb, steal, wcheck)) + "\n")
    soak = None
    if os.environ.get("SOAK") == "1":
        soak = run_soak(tmp)

    serve_rows = {}
    stop_all(timeout=60)
    for name, d in ((SERVE, "serve-run"), (SERVE_OLD, "serve-old-run")):
        s = tmp / d / "summary.json"
        if s.exists():
            serve_rows[name] = json.loads(s.read_text()).get("rows_written")

    lines = report(proxy, gen, soak, serve_rows, wb, steal, wcheck)
    text = "\n".join(lines) + "\n"
    print(text)
    out.write_text(text)
    print(f"written to {out.relative_to(ROOT)}", file=sys.stderr)


def run_soak(tmp):
    """A serve of its own under 1,000 keep-alive connections for SOAK_SECONDS (default 600);
    RSS every 10 s; then rows written against the requests wrk completed."""
    secs = int(os.environ.get("SOAK_SECONDS", "600"))
    out = tmp / "soak-run"
    p = subprocess.Popen(["taskset", "-c", "1", str(BIN), "serve", "--quiet", "--listen", f"127.0.0.1:{SOAK}",
                          "--upstream", f"http://127.0.0.1:{UP}", "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=open(tmp / "logs/soak.log", "w"))
    wait_port(SOAK)
    samples = []
    w = subprocess.Popen(["taskset", "-c", "0", "wrk", "-t1", "-c1000", f"-d{secs}s", f"http://127.0.0.1:{SOAK}/"],
                         stdout=subprocess.PIPE, text=True)
    for _ in range(secs // 10):
        time.sleep(10)
        m = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{p.pid}/status").read_text())
        if p.poll() is not None or m is None:
            w.kill()
            log = (tmp / "logs/soak.log").read_text()[-2000:]
            return {"error": f"serve exited with code {p.wait()} during the soak; its log ends:\n{log}"}
        samples.append(int(m.group(1)))
    wout = w.communicate()[0]
    total = int(re.search(r"(\d+) requests in", wout).group(1))
    errors = re.search(r"Socket errors: (.*)", wout)
    p.terminate()
    p.wait(timeout=120)
    summ = json.loads((out / "summary.json").read_text())
    return {"rss_kb": samples, "requests": total, "rows": summ.get("rows_written"), "served": summ.get("requests"),
            "ok": summ.get("successful_requests"), "failures": summ.get("failures"),
            "backlog_peak": summ.get("recorder_backlog_peak_rows"),
            "socket_errors": errors.group(1) if errors else None, "seconds": secs}


def writer_bench():
    """The criterion bench of the Parquet sink, pinned to one core; its summary lines."""
    r = subprocess.run(["taskset", "-c", "0", "cargo", "bench", "--quiet", "--bench", "writer"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        return [f"writer bench failed: {r.stderr[-500:]}"]
    return parse_writer(r.stdout)[0]


UNITS = {"elem/s": 1.0, "Kelem/s": 1e3, "Melem/s": 1e6, "Gelem/s": 1e9,
         "B/s": 1.0, "KiB/s": 1024.0, "MiB/s": 1024.0 ** 2, "GiB/s": 1024.0 ** 3}


def parse_writer(stdout):
    """benchmarks/writer.rs's output -> (summary lines, {measurement: number}): criterion's
    throughput estimate per bench (exchanges/s, body bytes/s) and the long run's rows/s."""
    lines, nums, name = [], {}, None
    for l in stdout.splitlines():
        if l.startswith("long run:"):
            lines.append(l)
            m = re.search(r"\((\d+) rows/s", l)
            if m:
                nums["long run"] = float(m.group(1))
        m = re.match(r"^writer/(.+?)\s*(time:.*)?$", l)
        if m and not l.strip().startswith(("time:", "thrpt:", "change:")):
            name = m.group(1).strip()
        # criterion: "thrpt:  [low unit estimate unit high unit]" (" elem/s" has a space of its own)
        t = re.search(r"thrpt:\s+\[\s*\S+\s+\S+\s+(\S+)\s+(\S+)\s+\S+\s+\S+\s*\]", l)
        if t and name and "%" not in l:
            v, unit = t.group(1), t.group(2)
            lines.append(f"{name}: {v} {unit} (criterion's estimate)")
            if unit in UNITS:
                nums[name] = float(v) * UNITS[unit]
            name = None
    return lines, nums


def new_writer_exe():
    """The new writer bench executable: NEW_WRITER_BENCH, else what `cargo bench --bench
    writer --no-run` builds (its path from cargo's JSON messages, else the newest executable
    target/release/deps/writer-*)."""
    if os.environ.get("NEW_WRITER_BENCH"):
        return Path(os.environ["NEW_WRITER_BENCH"])
    r = subprocess.run(["cargo", "bench", "--bench", "writer", "--no-run", "--message-format=json"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cargo bench --bench writer --no-run failed: {r.stderr[-1000:]}")
    exe = writer_exe_from_cargo_json(r.stdout)
    if exe is None:
        deps = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target") / "release" / "deps"
        found = [x for x in deps.glob("writer-*") if x.is_file() and not x.suffix and os.access(x, os.X_OK)]
        if not found:
            sys.exit(f"cannot find the writer bench executable (cargo's JSON names none; none in {deps})")
        exe = max(found, key=lambda x: x.stat().st_mtime)
    return exe


def writer_exe_from_cargo_json(stdout):
    """The `executable` of the writer bench in cargo's --message-format=json messages."""
    exe = None
    for l in stdout.splitlines():
        try:
            j = json.loads(l)
        except ValueError:
            continue
        t = j.get("target") or {}
        if j.get("reason") == "compiler-artifact" and t.get("name") == "writer" and "bench" in t.get("kind", []) \
                and j.get("executable"):
            exe = Path(j["executable"])
    return exe


def writer_compare(tmp):
    """The old writer bench executable and the new one, alternately (old, new, old, new ...)
    WRITER_ROUNDS times each, each as cargo bench runs it (`<exe> --bench`) pinned to CPU 0,
    each side with its own criterion directory (so neither compares against the other)."""
    exes = {"old": OLD_WRITER_BENCH, "new": new_writer_exe()}
    for side, exe in exes.items():
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            sys.exit(f"no executable {side} writer bench at {exe}")
    runs, lines, errors = {"old": [], "new": []}, None, []
    for i in range(WRITER_ROUNDS):
        for side in ("old", "new"):
            env = dict(os.environ, CRITERION_HOME=str(tmp / f"criterion-{side}"))
            r = subprocess.run(["taskset", "-c", "0", str(exes[side]), "--bench"], cwd=ROOT, env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"{side} writer bench, run {i + 1}, failed ({r.returncode}): {r.stderr[-500:]}")
                print(errors[-1], file=sys.stderr)
                continue
            ls, nums = parse_writer(r.stdout)
            runs[side].append(nums)
            if side == "new" and lines is None:
                lines = ls
            print(f"writer run {i + 1}/{WRITER_ROUNDS} {side}: " +
                  ", ".join(f"{k} {v:,.0f}" for k, v in nums.items() if k == "long run" or k.endswith("exchanges")),
                  file=sys.stderr)
    return {"exes": exes, "runs": runs, "errors": errors,
            "lines": (lines or []) + errors}


def command():
    """The command that reproduces this run, with every knob that was set."""
    env = [f"DUR={DUR}", f"ROUNDS={ROUNDS}"]
    for k in ("CONC", "ONLY", "WRITER", "WRITER_ROUNDS", "NEW_BIN", "OLD_BIN", "NEW_WRITER_BENCH", "OLD_WRITER_BENCH"):
        if os.environ.get(k) and not (k == "WRITER" and os.environ[k] == "1"):
            env.append(f"{k}={os.environ[k]}")
    if os.environ.get("SOAK") == "1":
        env.append("SOAK=1")
    return " ".join(env) + " bash benchmarks/run.sh"


def judge(new, old, s_new, s_old):
    """The flag of one new/old cell: ratio under ACCEPT_RATIO, or a spread over NOISY_PCT."""
    flags = []
    if new is None or old is None:
        return "no data"
    if new / old < ACCEPT_RATIO:
        flags.append(f"ratio < {ACCEPT_RATIO}")
    if (s_new is not None and s_new > NOISY_PCT) or (s_old is not None and s_old > NOISY_PCT):
        flags.append(f"spread > {NOISY_PCT:.0f} %: rerun")
    if s_new is None or s_old is None:
        flags.append("no spread (one round)")
    return "; ".join(flags) or "ok"


def pct(v):
    return "-" if v is None else f"{v:.0f}%"


def guard_section(gen):
    """What each replay cell cost in all (CPU per request over the whole process, so work
    moved out of the measured rounds still counts), where its threads were allowed to run,
    and whether its rows and bodies are all there."""
    cells = [(k, c) for (k, c) in sorted(gen, key=lambda kc: (kc[1], kc[0])) if k.startswith("replay")
             and any("guard" in x for x in gen[(k, c)])]
    if not cells:
        return []
    lines = ["", "## Guards (replay)", "",
             "CPU per request: the replay process's whole user + system time (every phase, and the Parquet "
             "encoding left for after each round) over every request it sent. Threads: each thread's "
             "`Cpus_allowed_list` from /proc, read every 0.2 s (the generator is pinned to CPU 0), and its share "
             "of the CPU ticks seen at each thread's last reading (a lower bound for threads busy in the last "
             "0.2 s of the run, such as the recorder finishing its parts). Rows: `rows_written` = requests sent, every run. Bodies: 20 measured rows "
             "per run read back from the Parquet parts with pyarrow and compared with the upstream's body. "
             "Peak RSS: the process's `VmHWM` read every 0.2 s (median over runs), and per 1,000 rows of one measured round "
             "(a recording replay holds a round's rows until the round ends; `--no-record` beside it is what "
             "the rest of the process takes).", "",
             "| c | generator | CPU µs/request | threads (CPUs allowed, share of CPU) | rows = requests | bodies | "
             "rows encoded during rounds | peak RSS MiB | peak RSS KiB per 1,000 round rows |",
             "|---|---|---|---|---|---|---|---|---|"]
    bad = []
    for k, c in cells:
        gs = [x["guard"] for x in gen[(k, c)] if "guard" in x]
        cpu = statistics.median(g["cpu_us_per_request"] for g in gs)
        names = {}
        for g in gs:
            for name, t in g["threads"].items():
                e = names.setdefault(name, {"cpus": set(), "ticks": 0})
                e["cpus"] |= t["cpus"]
                e["ticks"] += t["ticks"]
        total = sum(e["ticks"] for e in names.values()) or 1
        th = "; ".join(f"{n} [{','.join(sorted(e['cpus']))}] {100 * e['ticks'] / total:.0f}%"
                       for n, e in sorted(names.items(), key=lambda ne: -ne[1]["ticks"]))
        if any(e["cpus"] != {"0"} for e in names.values()):
            bad.append(f"{GEN_NAMES.get(k, k)} c={c}: a thread was allowed off CPU 0")

        def verdict(key):
            vals = [g[key] for g in gs if g[key] is not None]
            if not vals:
                return "-"
            if not all(vals):
                bad.append(f"{GEN_NAMES.get(k, k)} c={c}: {key} failed")
            return f"{sum(1 for v in vals if v)}/{len(vals)} runs"
        enc = [g.get("encoded_during_rounds") for g in gs if g.get("encoded_during_rounds") is not None]
        rss = [g["peak_rss_kib"] for g in gs if g.get("peak_rss_kib")]
        per = [g["peak_rss_kib"] * 1000 / g["round_rows"] for g in gs if g.get("peak_rss_kib")]
        rss_cells = (f"{statistics.median(rss) / 1024:.0f} | {statistics.median(per):,.0f}" if rss else "- | -")
        lines.append(f"| {c} | {GEN_NAMES.get(k, k)} | {cpu:.1f} | {th} | {verdict('rows_ok')} | "
                     f"{verdict('bodies_ok')} | {sum(enc) if enc else '-'} | {rss_cells} |")
    lines += ["", "Guard failures: " + "; ".join(bad) + "." if bad else "No guard failed."]
    return lines


def check_section(proxy, gen, wcheck):
    """Re-layout check: new / old, one row per cell, with the flags of the acceptance rule."""
    lines = ["## Re-layout check: new / old", ""]
    if OLD_BIN:
        lines.append(f"New: `{BIN}`; old: `{OLD_BIN}`. Each pair measured back to back in every round (same CPU "
                     "pinning, same upstream nginx, same recording settings, a run directory each), the order of "
                     "new and old swapped every round; in the proxy table each serve waits for its recorder to go "
                     "idle before the next target runs.")
    if wcheck:
        if OLD_BIN:
            lines.append("")
        lines.append(f"Writer bench: new `{wcheck['exes']['new']}`, old `{wcheck['exes']['old']}`, each run as "
                     f"`taskset -c 0 <exe> --bench`, alternated old/new, {WRITER_ROUNDS} runs each.")
    lines += ["", f"**Acceptance: each new/old median ratio >= {ACCEPT_RATIO}; cells with a spread over "
              f"{NOISY_PCT:.0f} % are rerun** (`ONLY=serve:C,replay:C,writer`, ROUNDS>={ACCEPT_ROUNDS}). "
              "Rows marked (informative) are not part of the acceptance.", ""]
    if ROUNDS < ACCEPT_ROUNDS and OLD_BIN:
        lines += [f"ROUNDS={ROUNDS} < {ACCEPT_ROUNDS}: not an acceptance run.", ""]
    lines += ["| cell | new median | new spread | old median | old spread | new/old | flag |",
              "|---|---|---|---|---|---|---|"]
    noisy, low = [], []

    def row(label, cell, new_rows, old_rows, key="rps", informative=False, d=0):
        new, old = median(new_rows, key), median(old_rows, key)
        s_new, s_old = spread_pct(new_rows, key), spread_pct(old_rows, key)
        flag = judge(new, old, s_new, s_old)
        if not informative and ("rerun" in flag or "no spread" in flag) and cell:
            noisy.append(cell)  # noisy, or one round only: measure again before judging
        elif not informative and "ratio" in flag:
            low.append(label)
        ratio = "-" if new is None or old is None else f"{new / old:.3f}"
        lines.append(f"| {label}{' (informative)' if informative else ''} | {fmt(new, d)} | {pct(s_new)} | "
                     f"{fmt(old, d)} | {pct(s_old)} | {ratio} | {flag} |")

    if OLD_BIN:
        for c in PROXY_CONC:
            row(f"serve c={c}, req/s", f"serve:{c}", proxy.get((SERVE, c), []), proxy.get((SERVE_OLD, c), []))
        for c in GEN_CONC:
            row(f"replay c={c}, req/s", f"replay:{c}", gen.get(("replay", c), []), gen.get(("replay old", c), []))
        for c in GEN_CONC:
            row(f"replay --no-record c={c}, req/s", f"replay:{c}", gen.get(("replay norec", c), []),
                gen.get(("replay old norec", c), []), informative=True)
    if wcheck:
        names = sorted({k for side in wcheck["runs"].values() for r in side for k in r if k.endswith("exchanges")})
        for k in names:
            row(f"writer, {k.rsplit(',', 1)[0]}, exchanges/s", "writer",
                [r for r in wcheck["runs"]["new"] if k in r], [r for r in wcheck["runs"]["old"] if k in r], key=k)
        row("writer, long run 1 KiB with back-pressure, rows/s", "writer",
            [r for r in wcheck["runs"]["new"] if "long run" in r], [r for r in wcheck["runs"]["old"] if "long run" in r],
            key="long run", informative=True)
        for e in wcheck["errors"]:
            lines.append(f"\n{e}")
    lines.append("")
    if low:
        lines += [f"Below {ACCEPT_RATIO} with both spreads within {NOISY_PCT:.0f} % (fails the acceptance): {'; '.join(low)}.", ""]
    if noisy:
        cells = ",".join(dict.fromkeys(noisy))
        keep = ["NEW_BIN", "OLD_BIN"] + (["NEW_WRITER_BENCH", "OLD_WRITER_BENCH", "WRITER_ROUNDS"] if "writer" in noisy else [])
        env = "".join(f"{k}={os.environ[k]} " for k in keep if os.environ.get(k))
        lines.append(f"Noisy (or a single round), to rerun: `ONLY={cells} {env}DUR={DUR} "
                     f"ROUNDS={max(ROUNDS, ACCEPT_ROUNDS)} bash benchmarks/run.sh`.")
    if not low and not noisy:
        lines.append("No cell flagged.")
    return lines


def metrics_section(proxy, gen):
    """Live metrics cost: with / without --metrics-listen, one row per cell."""
    lines = ["## Live metrics cost: with / without --metrics-listen", "",
             f"Target: with / without >= {METRICS_RATIO} (at most 3 % apart). serve's metered instance is "
             "scraped once a second for the whole run; replay's endpoint is up and counting but not scraped. "
             "Each pair ran back to back in every round, its order swapped every round.", "",
             "| cell | without | spread | with | spread | with/without | meets |", "|---|---|---|---|---|---|---|"]
    cells = [(f"serve c={c}, req/s", proxy.get((SERVE, c), []), proxy.get((SERVE_MET, c), [])) for c in PROXY_CONC]
    cells += [(f"replay c={c}, req/s", gen.get(("replay", c), []), gen.get(("replay metrics", c), []))
              for c in GEN_CONC]
    cells += [(f"serve c={c}, p99 ms (lower is better)", proxy.get((SERVE, c), []), proxy.get((SERVE_MET, c), []))
              for c in PROXY_CONC]
    for label, plain, metered in cells:
        key = "p99_ms" if "p99" in label else "rps"
        a, b = median(plain, key), median(metered, key)
        ratio = None if a is None or b is None else (b / a if key == "rps" else a / b)
        meets = "-" if ratio is None else ("yes" if ratio >= METRICS_RATIO else "no")
        lines.append(f"| {label} | {fmt(a, 3 if key != 'rps' else 0)} | {spread(plain, key)} | "
                     f"{fmt(b, 3 if key != 'rps' else 0)} | {spread(metered, key)} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {meets} |")
    return lines + [""]


def report(proxy, gen, soak, serve_rows, wb, steal=None, wcheck=None):
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    only = ""
    if ONLY is not None:
        only = ("Only the cells " + ", ".join(f"{k}:{c}" if c else k for k, c in sorted(ONLY, key=str)) +
                " (ONLY), with the reference targets their rows need (no HAProxy; the fresh-connection pair only "
                "in fresh:C cells). ")
    lines = [
        f"# {datetime.date.today().isoformat()} — proxy overhead and load generation",
        "",
        f"Machine: {cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}. "
        f"Command: `{command()}`. Medians of {ROUNDS} interleaved rounds of {DUR} s. " + only +
        "Load generator on CPU 0; upstream nginx (1 KiB JSON) and the proxy under test on CPU 1. "
        "matrix-proxy records every exchange (bodies and all columns) in both roles. "
        "Spread: (max - min) / median of a cell's rounds; a wide one says the machine was noisy then. "
        "vs nginx / vs wrk: ratios of the medians; paired: the median of each round's ratio (the two "
        "measured back to back in that round) and the range of those ratios. "
        + ("CPU steal time during the measurements (share of all CPU time the hypervisor gave to others): "
           f"{100 * steal:.1f}%." if steal is not None else "CPU steal time: not readable here."),
        "",
    ]
    if OLD_BIN or wcheck:
        lines += check_section(proxy, gen, wcheck)
    if METRICS:
        lines += metrics_section(proxy, gen)
    if PROXY_CONC:
        if lines[-1]:
            lines.append("")
        lines += [
            "## Proxy overhead (wrk -> proxy -> nginx upstream)",
            "",
            "| c | target | req/s | spread | vs no proxy | vs nginx | paired vs nginx | p50 ms | p99 ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for c in PROXY_CONC:
        base = median(proxy[("no proxy", c)], "rps")
        ngx = median(proxy[("nginx", c)], "rps")
        for t in ("no proxy", "nginx", "HAProxy", SERVE, SERVE_OLD, SERVE_MET):
            if (t, c) not in proxy:
                continue
            rows = proxy[(t, c)]
            rps = median(rows, "rps")
            lines.append(f"| {c} | {t} | {fmt(rps, 0)} | {spread(rows, 'rps')} | {rps / base:.2f}x | {rps / ngx:.2f}x | "
                         f"{paired(rows, proxy[('nginx', c)])} | "
                         f"{fmt(median(rows, 'p50_ms'), 3)} | {fmt(median(rows, 'p99_ms'), 3)} |")
    if GEN_CONC or FRESH_CONC:
        if lines[-1]:
            lines.append("")
        lines += ["## Load generation (generator -> nginx upstream)", "",
                  "| c | generator | req/s | spread | vs wrk | vs oha | paired vs wrk |", "|---|---|---|---|---|---|---|"]
    for c in sorted(set(GEN_CONC) | set(FRESH_CONC)):
        for t in ("wrk", "oha", "replay", "replay old", "replay norec", "replay old norec", "replay metrics"):
            if (t, c) not in gen:
                continue
            w = median(gen[("wrk", c)], "rps")
            o = median(gen[("oha", c)], "rps")
            v = median(gen[(t, c)], "rps")
            lines.append(f"| {c} | {GEN_NAMES.get(t, t)} | {fmt(v, 0)} | {spread(gen[(t, c)], 'rps')} | {v / w:.2f}x | {v / o:.2f}x | "
                         f"{paired(gen[(t, c)], gen[('wrk', c)])} |")
        if ("oha fresh", c) in gen:
            of = median(gen[("oha fresh", c)], "rps")
            rf = median(gen[("replay fresh", c)], "rps")
            lines.append(f"| {c} | oha --disable-keepalive | {fmt(of, 0)} | {spread(gen[('oha fresh', c)], 'rps')} | - | - | - |")
            lines.append(f"| {c} | matrix-proxy replay, fresh connections | {fmt(rf, 0)} | {spread(gen[('replay fresh', c)], 'rps')} | - | {rf / of:.2f}x vs oha fresh | - |")
    # replay's own reports, of the new binary (the old one's runs are its own matter)
    runs = [x for k, v in gen.items() if k[0] in ("replay", "replay norec", "replay fresh") for x in v]
    if runs:
        warned = sum(x["warned"] for x in runs)
        total = sum(x["rounds"] for x in runs)
        share = statistics.median(x["cpu_share"] for x in runs)
        lines += ["", f"replay's own reports: median CPU share of its one core {share:.2f}; {warned} of {total} measured "
                  "rounds carry the generator-bound warning (the generator is pinned to one core and saturates it, "
                  "as wrk and oha do)."]
    lines += guard_section(gen)
    if serve_rows and serve_rows.get(SERVE) is not None:
        if SERVE_OLD in serve_rows:
            lines += ["", f"serve recorded {serve_rows[SERVE]:,} exchanges during the proxy runs "
                      f"(the old binary's serve: {serve_rows[SERVE_OLD]:,})."]
        else:
            lines += ["", f"serve recorded {serve_rows[SERVE]:,} exchanges during the proxy runs."]
    if wb and wcheck:
        lines += ["", f"## Recorder (`taskset -c 0 {wcheck['exes']['new']} --bench`, the new build's first run)", ""] + \
                 [f"- {l}" for l in wb]
    elif wb:
        lines += ["", "## Recorder (`taskset -c 0 cargo bench --bench writer`)", ""] + [f"- {l}" for l in wb]
    if soak and "error" in soak:
        lines += ["", "## Soak", "", "The soak failed: " + soak["error"]]
    elif soak:
        rss = soak["rss_kb"]
        lines += ["", "## Soak", "", f"serve (its own instance, recording) under 1,000 keep-alive connections from wrk for "
                  f"{soak['seconds']} s: wrk completed {soak['requests']:,} responses (socket errors: {soak['socket_errors'] or 'none'}); "
                  f"serve counted {soak['served']:,} requests ({soak['ok']:,} ok, failures {soak['failures']}) and wrote "
                  f"{soak['rows']:,} rows. Most finished exchanges waiting at once for room in the recorder's queue "
                  f"(each holds its client's next request): {soak['backlog_peak']}.",
                  "", f"RSS (MiB) every 10 s: {', '.join(str(r // 1024) for r in rss)}"]
    return lines


if __name__ == "__main__":
    main()

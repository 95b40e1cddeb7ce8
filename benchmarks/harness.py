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
"1,16,64"), SOAK=1 adds the 10-minute soak of serve under 1,000 keep-alive connections.
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

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "matrix-proxy"
DUR = int(os.environ.get("DUR", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONC = [int(c) for c in os.environ.get("CONC", "1,16,64").split(",")]
UP, NGX, HAP, MPX, SOAK = 18080, 18081, 18082, 18083, 18084
BODY = json.dumps({"id": "bench", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "x" * 880}, "finish_reason": "stop"}]},
    separators=(",", ":"))
assert "'" not in BODY and len(BODY) < 1100

procs = []


def start(cmd, cpu, log):
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    procs.append(p)
    return p


def wait_port(port, timeout=20):
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


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


def replay(c, n, tmp, fresh=False, tag="", record=True):
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
    cmd = ["taskset", "-c", "0", str(BIN), "replay", "--quiet", "--out", str(out), str(p)]
    if not record:
        cmd.insert(5, "--no-record")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"replay failed ({r.returncode}): {r.stderr}")
    s = json.loads((out / "summary.json").read_text())
    rates = [x["successful_requests_per_second"] for x in s["rounds"]]
    shares = [x["generator"]["cpu_share"] for x in s["rounds"]]
    warned = sum(1 for x in s["rounds"] if x["generator"]["warning"])
    shutil.rmtree(out, ignore_errors=True)
    return {"rps": statistics.median(rates), "cpu_share": statistics.median(shares), "warned": warned,
            "rounds": len(rates)}


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


def spread(rows, key):
    """(max - min) / median of the rounds, as a percentage: how far the rounds disagreed."""
    vals = values(rows, key)
    mid = statistics.median(vals) if len(vals) >= 2 else 0
    if mid == 0:
        return "-"
    return f"{100 * (max(vals) - min(vals)) / mid:.0f}%"


def median(rows, key):
    vals = values(rows, key)
    return statistics.median(vals) if vals else None


def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"


def main():
    tmp = Path(tempfile.mkdtemp(prefix="mp-bench-"))
    try:
        return run(tmp)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp):
    (tmp / "logs").mkdir()
    up_conf = tmp / "upstream.conf"
    up_conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/up.pid; error_log {tmp}/logs/up.err;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;
  server {{ listen 127.0.0.1:{UP} backlog=8192; location / {{ default_type application/json; return 200 '{BODY}'; }} }} }}
""")
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
    start(["nginx", "-p", str(tmp), "-c", str(up_conf)], 1, tmp / "logs/up.log")
    start(["nginx", "-p", str(tmp), "-c", str(ngx_conf)], 1, tmp / "logs/ngx.log")
    start(["haproxy", "-f", str(hap_conf)], 1, tmp / "logs/hap.log")
    serve = start([str(BIN), "serve", "--quiet", "--listen", f"127.0.0.1:{MPX}", "--upstream", f"http://127.0.0.1:{UP}",
                   "--out", str(tmp / "serve-run")], 1, tmp / "logs/serve.log")
    for port in (UP, NGX, HAP, MPX):
        wait_port(port)

    cpu_at_start = cpu_times()
    targets = [("no proxy", UP), ("nginx", NGX), ("HAProxy", HAP), ("matrix-proxy serve", MPX)]
    proxy = {(t, c): [] for t, _ in targets for c in CONC}
    for r in range(ROUNDS):
        for c in CONC:
            for name, port in targets:
                proxy[(name, c)].append(wrk(port, c))
                print(f"round {r + 1}/{ROUNDS} c={c} {name}: {proxy[(name, c)][-1]['rps']:,.0f} req/s", file=sys.stderr)

    gen = {(t, c): [] for t in ("wrk", "oha", "replay", "replay norec", "oha fresh", "replay fresh") for c in CONC}
    for r in range(ROUNDS):
        for c in CONC:
            w = wrk(UP, c)
            gen[("wrk", c)].append(w)
            gen[("oha", c)].append(oha(c))
            n = int(w["rps"] * DUR / 2)  # two measured rounds of DUR/2 s each, roughly
            gen[("replay", c)].append(replay(c, n, tmp, tag=f"{r}-{c}"))
            gen[("replay norec", c)].append(replay(c, n, tmp, tag=f"n{r}-{c}", record=False))
            of = oha(c, fresh=True)
            gen[("oha fresh", c)].append(of)
            gen[("replay fresh", c)].append(replay(c, int(of["rps"] * DUR / 2), tmp, fresh=True, tag=f"f{r}-{c}"))
            print(f"round {r + 1}/{ROUNDS} c={c}: wrk {w['rps']:,.0f}, oha {gen[('oha', c)][-1]['rps']:,.0f}, "
                  f"replay {gen[('replay', c)][-1]['rps']:,.0f}, replay --no-record {gen[('replay norec', c)][-1]['rps']:,.0f}, "
                  f"oha fresh {of['rps']:,.0f}, "
                  f"replay fresh {gen[('replay fresh', c)][-1]['rps']:,.0f}", file=sys.stderr)

    steal = steal_share(cpu_at_start, cpu_times())
    # The main tables are written before the soak, so a failed soak loses nothing.
    wb = writer_bench() if os.environ.get("WRITER", "1") == "1" else None
    out = result_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report(proxy, gen, None, None, wb, steal)) + "\n")
    soak = None
    if os.environ.get("SOAK") == "1":
        soak = run_soak(tmp)

    serve_rows = None
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)
    procs.clear()
    s = tmp / "serve-run" / "summary.json"
    if s.exists():
        serve_rows = json.loads(s.read_text()).get("rows_written")

    lines = report(proxy, gen, soak, serve_rows, wb, steal)
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
    lines, name = [], None
    for l in r.stdout.splitlines():
        if l.startswith("long run:"):
            lines.append(l)
        m = re.match(r"^writer/(.+?)\s*(time:.*)?$", l)
        if m and not l.strip().startswith(("time:", "thrpt:", "change:")):
            name = m.group(1).strip()
        t = re.search(r"thrpt:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", l)
        if t and name and "%" not in l:
            lines.append(f"{name}: {t.group(1)} (criterion's estimate)")
            name = None
    return lines


def report(proxy, gen, soak, serve_rows, wb, steal=None):
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        f"# {datetime.date.today().isoformat()} — proxy overhead and load generation",
        "",
        f"Machine: {cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}. "
        f"Command: `DUR={DUR} ROUNDS={ROUNDS}{' SOAK=1' if os.environ.get('SOAK') == '1' else ''} bash benchmarks/run.sh`. Medians of {ROUNDS} interleaved rounds of {DUR} s. "
        "Load generator on CPU 0; upstream nginx (1 KiB JSON) and the proxy under test on CPU 1. "
        "matrix-proxy records every exchange (bodies and all columns) in both roles. "
        "Spread: (max - min) / median of a cell's rounds; a wide one says the machine was noisy then. "
        + ("CPU steal time during the measurements (share of all CPU time the hypervisor gave to others): "
           f"{100 * steal:.1f}%." if steal is not None else "CPU steal time: not readable here."),
        "",
        "## Proxy overhead (wrk -> proxy -> nginx upstream)",
        "",
        "| c | target | req/s | spread | vs no proxy | vs nginx | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in CONC:
        base = median(proxy[("no proxy", c)], "rps")
        ngx = median(proxy[("nginx", c)], "rps")
        for t in ("no proxy", "nginx", "HAProxy", "matrix-proxy serve"):
            rows = proxy[(t, c)]
            rps = median(rows, "rps")
            lines.append(f"| {c} | {t} | {fmt(rps, 0)} | {spread(rows, 'rps')} | {rps / base:.2f}x | {rps / ngx:.2f}x | "
                         f"{fmt(median(rows, 'p50_ms'), 3)} | {fmt(median(rows, 'p99_ms'), 3)} |")
    lines += ["", "## Load generation (generator -> nginx upstream)", "",
              "| c | generator | req/s | spread | vs wrk | vs oha |", "|---|---|---|---|---|---|"]
    for c in CONC:
        w = median(gen[("wrk", c)], "rps")
        o = median(gen[("oha", c)], "rps")
        names = {"replay": "matrix-proxy replay (validating, recording)",
                 "replay norec": "matrix-proxy replay (validating, --no-record)"}
        for t in ("wrk", "oha", "replay", "replay norec"):
            v = median(gen[(t, c)], "rps")
            lines.append(f"| {c} | {names.get(t, t)} | {fmt(v, 0)} | {spread(gen[(t, c)], 'rps')} | {v / w:.2f}x | {v / o:.2f}x |")
        of = median(gen[("oha fresh", c)], "rps")
        rf = median(gen[("replay fresh", c)], "rps")
        lines.append(f"| {c} | oha --disable-keepalive | {fmt(of, 0)} | {spread(gen[('oha fresh', c)], 'rps')} | - | - |")
        lines.append(f"| {c} | matrix-proxy replay, fresh connections | {fmt(rf, 0)} | {spread(gen[('replay fresh', c)], 'rps')} | - | {rf / of:.2f}x vs oha fresh |")
    runs = [x for k, v in gen.items() if k[0].startswith("replay") for x in v]
    warned = sum(x["warned"] for x in runs)
    total = sum(x["rounds"] for x in runs)
    share = statistics.median(x["cpu_share"] for x in runs)
    lines += ["", f"replay's own reports: median CPU share of its one core {share:.2f}; {warned} of {total} measured "
              "rounds carry the generator-bound warning (the generator is pinned to one core and saturates it, "
              "as wrk and oha do)."]
    if serve_rows is not None:
        lines += ["", f"serve recorded {serve_rows:,} exchanges during the proxy runs."]
    if wb:
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

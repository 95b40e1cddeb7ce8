"""serve's CPU per request, an old build and a new one alternated (old, new, old, new ...):
`python3 benchmarks/serve_cpu.py OLD_BIN NEW_BIN` (RUNS pairs, default 6).

The harness's pinning: an nginx upstream (1 KiB JSON) and serve on CPU 1, wrk -c64 on
CPU 0. Each run starts a fresh serve (recording), warms it with 1 s of wrk, then reads its
CPU ticks (utime + stime from /proc/PID/stat, and its recorder thread's from
/proc/PID/task/TID/stat) around 3 s of wrk: CPU per request is ticks / requests wrk
completed. Throughput on this shared VM spreads 10-40 %; CPU per request spreads less and
says where a change moved the work. Prints every run, the medians and the per-pair ratios.
"""
import os
import shutil
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h
if len(sys.argv) != 3:
    sys.exit("usage: python3 benchmarks/serve_cpu.py OLD_BIN NEW_BIN")
OLD, NEW = sys.argv[1], sys.argv[2]
RUNS = int(os.environ.get("RUNS", "6"))
tmp = Path(tempfile.mkdtemp())
(tmp / "logs").mkdir()
conf = tmp / "up.conf"
conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/up.pid; error_log {tmp}/logs/up.err;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;
  server {{ listen 127.0.0.1:{h.UP} backlog=8192; location / {{ default_type application/json; return 200 '{h.BODY}'; }} }} }}
""")
up = subprocess.Popen(["taskset", "-c", "1", "nginx", "-c", str(conf)])
time.sleep(0.5)
tick = os.sysconf("SC_CLK_TCK")
res = {"old": [], "new": []}
for i in range(RUNS):
    for side, b in (("old", OLD), ("new", NEW)):
        out = tmp / f"run-{side}-{i}"
        p = subprocess.Popen(["taskset", "-c", "1"] + h.serve_cmd(b, h.MPX, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.8)
        subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c64", "-d1s", f"http://127.0.0.1:{h.MPX}/"], capture_output=True)
        def ticks(path=f"/proc/{p.pid}/stat"):
            f = open(path).read().rsplit(")", 1)[1].split()
            return int(f[11]) + int(f[12])
        rec = [t for t in os.listdir(f"/proc/{p.pid}/task") if open(f"/proc/{p.pid}/task/{t}/comm").read().strip() == "matrix-recorder"][0]
        rpath = f"/proc/{p.pid}/task/{rec}/stat"
        t0, r0 = ticks(), ticks(rpath)
        r = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c64", "-d3s", f"http://127.0.0.1:{h.MPX}/"], capture_output=True, text=True)
        t1, r1 = ticks(), ticks(rpath)
        res.setdefault(side + " recorder", []).append((r1 - r0) / tick / int(re.search(r"(\d+) requests in", r.stdout).group(1)) * 1e6)
        n = int(re.search(r"(\d+) requests in", r.stdout).group(1))
        us = (t1 - t0) / tick / n * 1e6
        res[side].append(us)
        print(f"run {i+1} {side}: {n/3:.0f} req/s, {us:.2f} us CPU/request, recorder {res[side + ' recorder'][-1]:.2f}", flush=True)
        p.send_signal(2); p.wait(timeout=30)
up.terminate(); up.wait()
shutil.rmtree(tmp, ignore_errors=True)
for s in res:
    v = sorted(res[s]); print(s, "median", v[len(v)//2] if len(v) % 2 else (v[len(v)//2-1]+v[len(v)//2])/2, v)
for k in ("", " recorder"):
    ratios = sorted(n/o for o, n in zip(res["old" + k], res["new" + k]))
    print("new/old per pair" + k, [round(x, 3) for x in ratios])

"""Interop check: `--metrics-listen` scraped mid-run and parsed by the reference parser.

replay (the demo plan on the built-in mock) and serve (in front of the mock) each run
with `--metrics-listen 127.0.0.1:0`; /metrics is scraped twice while they run and parsed
with `prometheus_client`'s text parser. Checks: the content type is exposition format
0.0.4; counters never fall and rise between the scrapes; every histogram's +Inf bucket
equals its count and its buckets are cumulative; the recorder's gauges and counters are
there; serve's route labels are its routes; and after the run, the requests counted equal
the rows recorded (read back with DuckDB).

Usage: python3 tests/interop/metrics_scrape.py PATH/TO/matrix-proxy WORKDIR
"""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from support import free_port, wait_http  # noqa: E402

import duckdb
from prometheus_client.parser import text_string_to_metric_families


def metrics_address(run: Path, key_path, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = json.loads((run / "config.json").read_text())
            v = c
            for k in key_path:
                v = v[k]
            return v
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            time.sleep(0.05)
    raise AssertionError(f"no metrics address in {run}/config.json")


def scrape(addr: str):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        assert ctype == "text/plain; version=0.0.4; charset=utf-8", ctype
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families


def value(families, name, suffix="", **labels):
    total = 0.0
    for s in families[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def check_histograms(families) -> int:
    n = 0
    for name in ("matrix_proxy_request_duration_seconds", "matrix_proxy_time_to_first_token_seconds",
                 "matrix_proxy_inter_token_latency_seconds"):
        f = families[name]
        assert f.type == "histogram", (name, f.type)
        buckets = [(s.labels["le"], s.value) for s in f.samples if s.name == name + "_bucket"]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), (name, counts)
        inf = dict(buckets)["+Inf"]
        count = [s.value for s in f.samples if s.name == name + "_count"][0]
        assert inf == count, (name, inf, count)
        n += 2
    return n


def check_twice(first, second) -> int:
    checks = check_histograms(first) + check_histograms(second)
    req = "matrix_proxy_requests"  # the parser names a counter's family without _total
    a, b = value(first, req, "_total"), value(second, req, "_total")
    assert 0 < a < b, ("requests counted", a, b)
    for name in ("matrix_proxy_rows_written", "matrix_proxy_parts_closed", "matrix_proxy_rows_dropped"):
        assert first[name].type == "counter", name
        assert value(second, name, "_total") >= value(first, name, "_total"), name
    for name in ("matrix_proxy_in_flight_requests", "matrix_proxy_recorder_queue_rows"):
        assert first[name].type == "gauge", name
        assert value(first, name) >= 0, name
    d = "matrix_proxy_request_duration_seconds"
    assert value(second, d, "_count") > value(first, d, "_count")
    return checks + 6


def replay_check(binary: str, work: Path) -> int:
    run = work / "metrics-replay"
    p = subprocess.Popen([binary, "replay", "plans/demo.json", "--mock-worker", "--quiet",
                          "--metrics-listen", "127.0.0.1:0", "--out", str(run)])
    try:
        addr = metrics_address(run, ["extra", "metrics_listen"])
        wait_for = lambda fam: value(fam, "matrix_proxy_requests", "_total") > 20  # noqa: E731
        first = scrape(addr)
        while not wait_for(first):
            time.sleep(0.05)
            first = scrape(addr)
        time.sleep(0.5)
        second = scrape(addr)
        checks = check_twice(first, second)
        routes = {s.labels["route"] for s in second["matrix_proxy_requests"].samples}
        assert "GET /health" in routes and "POST /v1/chat/completions" in routes, routes
        assert p.wait(timeout=300) == 0
    finally:
        if p.poll() is None:
            p.kill()
    return checks + 2


def serve_check(binary: str, work: Path) -> int:
    run = work / "metrics-serve"
    mock_port, proxy_port = free_port(), free_port()
    mock = subprocess.Popen([binary, "mock-worker", "--listen", f"127.0.0.1:{mock_port}"], stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([binary, "serve", "--quiet", "--listen", f"127.0.0.1:{proxy_port}",
                              "--upstream", f"http://127.0.0.1:{mock_port}", "--metrics-listen", "127.0.0.1:0",
                              "--out", str(run)])
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health")
        wait_http(f"http://127.0.0.1:{proxy_port}/health")
        addr = metrics_address(run, ["metrics_listen"])

        def chat(n, stream):
            body = json.dumps({"model": "mock", "max_tokens": 5, "stream": stream,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            for _ in range(n):
                req = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/v1/chat/completions?key=SECRET",
                                             data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()

        chat(5, False)
        first = scrape(addr)
        chat(5, True)
        # A stream's row (and its count) is built just after the client read its end: wait
        # for the tenth, with a deadline.
        deadline = time.monotonic() + 10
        while True:
            second = scrape(addr)
            ok = value(second, "matrix_proxy_requests", "_total", route="POST /v1/chat/completions",
                       status_class="2xx", outcome="ok")
            if ok == 10 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        checks = check_twice(first, second)
        assert ok == 10, ok
        # Nothing is left in flight once every client has its answer.
        assert value(second, "matrix_proxy_in_flight_requests") == 0, "in flight after the traffic"
        assert value(second, "matrix_proxy_time_to_first_token_seconds", "_count") == 5
        assert value(second, "matrix_proxy_inter_token_latency_seconds", "_count") > 0
        assert "SECRET" not in str([s for f in second.values() for s in f.samples])
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=60) == 130
        total = value(second, "matrix_proxy_requests", "_total")
        rows = duckdb.connect().execute(f"select count(*) from '{run}/exchanges/*.parquet'").fetchone()[0]
        assert rows == total, (rows, total)
        checks += 5
    finally:
        for p in (proxy, mock):
            if p.poll() is None:
                p.kill()
    return checks


def main(binary: str, work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    checks = replay_check(binary, work) + serve_check(binary, work)
    print(f"metrics interop: /metrics of replay and serve parsed by prometheus_client mid-run, {checks} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))

"""Interop check: a run's worker_metrics.parquet (replay --worker-metrics) read with DuckDB
and pandas, no glue: its columns and types, the labels map, a scrape window around every
measured round of summary.json (named by its case, level and repetition), the mock's
request counter equal to the run's own count of answered requests, and every round's
`worker` numbers in summary.json recomputed from the rows (histogram deltas interpolated
inside their bucket as Prometheus's histogram_quantile does, counter deltas, gauge means,
the prefix-cache hit rate, ours minus the worker's p50). With gpu.parquet (a fake
nvidia-smi on PATH in CI): its columns, and a line per GPU and field.

Usage: python3 tests/interop/check_worker_metrics.py RUN_DIR
"""

import json
import sys
from pathlib import Path

import duckdb
import pandas as pd

from worker_numbers import close, delta_buckets, quantile, window


def check_round_numbers(con, path, summary):
    n = 0
    for r in summary["rounds"]:
        w = r["worker"]
        assert w["server"] == "vllm", w
        edges = window(con, path, r)
        assert edges is not None, ("every round of the demo has its window", r["case"], r["repetition"])
        start, end = edges
        assert close(w["window_start_seconds"], start / 1e6) and close(w["window_end_seconds"], end / 1e6), w

        def at(offset, metric):
            return con.execute(f"select sum(value) from '{path}' where offset_us = ? and metric = ?",
                               [offset, metric]).fetchone()[0]

        def delta(metric):
            return at(end, metric) - at(start, metric)

        assert w["requests"] == delta("vllm:request_success_total"), w
        assert w["generation_tokens"] == delta("vllm:generation_tokens_total"), w
        queries, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
        assert close(w["prefix_cache_hit_rate"], hits / queries if queries > 0 else None), w
        running = con.execute(f"""select avg(v) from (select offset_us, sum(value) v from '{path}'
            where metric = 'vllm:num_requests_running' and offset_us between ? and ? group by offset_us)""",
                              [start, end]).fetchone()[0]
        assert close(w["running_mean"], running), (w["running_mean"], running)
        for key_, metric in (("ttft_seconds", "vllm:time_to_first_token_seconds"),
                             ("e2e_seconds", "vllm:e2e_request_latency_seconds")):
            rows = delta_buckets(con, path, start, end, metric)
            p50, p95 = quantile(rows, 0.5), quantile(rows, 0.95)
            q = w[key_]
            assert q["metric"] == metric and q["estimate"] == "bucket-interpolated", q
            assert q["observations"] == rows[-1][1], (q, rows[-1])
            assert close(q["p50"], p50[0]) and q["p50_bucket"] == [p50[1], p50[2]], (q, p50)
            assert close(q["p95"], p95[0]) and q["p95_bucket"] == [p95[1], p95[2]], (q, p95)
            n += 6
        two = w["two_sided"]
        assert two["scope"].startswith("difference of p50s, not per request"), two
        ours = r["stream"]["ttft_seconds"]["p50"] if r.get("stream") else None
        if ours is not None:
            t = two["ttft"]
            assert close(t["difference_seconds"], ours - w["ttft_seconds"]["p50"]), t
            lo, hi = w["ttft_seconds"]["p50_bucket"]
            assert close(t["bucket_width_seconds"], None if hi is None else hi - lo), t
        e = two["e2e"]
        assert close(e["difference_seconds"], r["service_latency_seconds"]["p50"] - w["e2e_seconds"]["p50"]), e
        n += 6
    return n


def check_gpu(con, path):
    if not path.exists():
        return "no gpu.parquet"
    cols = [c[0] for c in con.execute(f"describe select * from '{path}'").fetchall()]
    assert cols == ["offset_us", "wall_time", "source", "gpu", "uuid", "metric", "value", "unit"], cols
    per = dict(((g, m), c) for g, m, c in con.execute(
        f"select gpu, metric, count(*) from '{path}' group by all").fetchall())
    assert per.get((0, "utilization.gpu"), 0) >= 2 and per.get((0, "memory.used"), 0) >= 2, per
    units = dict(con.execute(f"select distinct metric, unit from '{path}'").fetchall())
    assert units["utilization.gpu"] == "%" and units["memory.used"] == "MiB", units
    return f"gpu.parquet: {sum(per.values())} samples of {len({g for g, _ in per})} GPU(s)"


def main(run: Path) -> int:
    path = run / "worker_metrics.parquet"
    con = duckdb.connect()
    cols = con.execute(f"describe select * from '{path}'").fetchall()
    types = {c[0]: c[1] for c in cols}
    assert list(types) == ["offset_us", "wall_time", "cause", "case_name", "concurrency",
                           "target_rate_per_second", "repetition", "arm", "metric", "labels",
                           "value", "type"], types
    assert types["labels"] == "MAP(VARCHAR, VARCHAR)", types["labels"]
    assert types["wall_time"].startswith("TIMESTAMP"), types["wall_time"]
    summary = json.loads((run / "summary.json").read_text())
    measured = len(summary["rounds"])
    windows = dict(con.execute(
        f"select cause, count(distinct offset_us) from '{path}' group by cause").fetchall())
    assert windows.get("round_start") == measured and windows.get("round_end") == measured, windows
    # Each window names its round as summary.json does: one start and one end per round.
    for r in summary["rounds"]:
        n = con.execute(
            f"""select count(distinct offset_us) from '{path}'
                where case_name = ? and concurrency = ? and repetition = ?""",
            [r["case"], r["concurrency"], r["repetition"]]).fetchone()[0]
        assert n == 2, (r["case"], r["concurrency"], r["repetition"], n)
    # A bucket row keeps its le label in the map.
    les = con.execute(
        f"""select count(*) from '{path}'
            where metric = 'vllm:time_to_first_token_seconds_bucket' and labels['le'] = '+Inf'""").fetchone()[0]
    assert les > 0
    # The worker counted every request the run sent it (health probes are not requests):
    # its success counter grew by the run's ok generation requests, warm-ups included.
    last = con.execute(
        f"""select value from '{path}' where metric = 'vllm:request_success_total'
            order by offset_us desc limit 1""").fetchone()[0]
    ok = con.execute(
        f"""select count(*) from '{run / "exchanges" / "*.parquet"}'
            where outcome = 'ok' and url like '%/v1/%'""").fetchone()[0]
    # The last scrape is the interval's after the last round_end: every request counted.
    assert last == ok, (last, ok)
    checked = check_round_numbers(con, path, summary)
    gpu = check_gpu(con, run / "gpu.parquet")
    df = pd.read_parquet(path)
    assert len(df) == con.execute(f"select count(*) from '{path}'").fetchone()[0]
    assert isinstance(df["labels"].iloc[0], (list, dict)), type(df["labels"].iloc[0])
    print(f"worker metrics interop: {len(df)} samples, {measured} round windows, "
          f"success counter {last:.0f} of {ok} ok requests at the last scrape; "
          f"{checked} worker numbers of summary.json recomputed; {gpu}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

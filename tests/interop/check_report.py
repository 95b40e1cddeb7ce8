"""Interop check: every chart of a `matrix-proxy report` recomputed from exchanges/ with DuckDB
(the worker's and the GPU's lines from worker_metrics.parquet and gpu.parquet).

Each chart of the report embeds the numbers it draws (a JSON block per chart). This
check parses every block and recomputes it from the runs' exchanges/*.parquet with
DuckDB (and campaign.json for drift), requiring exact equality for counts and
microseconds and 1e-9 relative for rates; it also requires that every group the rows
hold has its series, so a chart cannot be empty, short or wrong and still pass.

Usage: python3 tests/interop/check_report.py REPORT.html RUN_DIR [RUN_DIR ...]
(run directories are matched to the report's series by their folder names)
"""

import json
import math
import re
import sys
from statistics import NormalDist
from pathlib import Path

import duckdb

from worker_numbers import delta_buckets, quantile, window

BLOCK = re.compile(r'<script type="application/json" class="chart-data" data-for="([^"]+)">(.*?)</script>', re.S)
FIGURE = re.compile(r'<figure class="chart" id="([^"]+)"')


def close(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


class Run:
    def __init__(self, con, d: Path):
        self.dir = d
        self.name = d.resolve().name
        self.summary = json.loads((d / "summary.json").read_text())
        cj = d / "campaign.json"
        self.campaign = json.loads(cj.read_text()) if cj.exists() else None
        self.view = "ex_" + re.sub(r"\W", "_", self.name)
        if (d / "shards").is_dir() and not (d / "config.json").exists():
            # A sharded run: every shard's rows, their offsets moved onto the shared
            # timeline (microseconds from --start-at), read with Hive partitioning.
            configs = [json.loads(c.read_text()) for c in sorted((d / "shards").glob("*/config.json"))]
            self.config = configs[0]
            offs = ", ".join(f"({c['shard']['index']}, {c['shard']['start_at_offset_us']})" for c in configs)
            con.execute(f"""create view {self.view} as
                select * exclude (off) replace (start_offset_us - off as start_offset_us,
                                                scheduled_offset_us - off as scheduled_offset_us)
                from read_parquet('{d / 'exchanges' / '*' / '*.parquet'}', hive_partitioning = true)
                join (values {offs}) o(shard, off) using (shard)""")
        else:
            self.config = json.loads((d / "config.json").read_text())
            con.execute(f"create view {self.view} as select * from read_parquet('{d / 'exchanges' / '*.parquet'}')")


LATENCY = "total_us + coalesce(send_lag_us, 0)"


def level_filter(s):
    c, r = s.get("concurrency"), s.get("rate_per_second")
    conc = "concurrency is null" if c is None else f"concurrency = {int(c)}"
    rate = "target_rate_per_second is null" if r is None else f"target_rate_per_second = {float(r)!r}"
    return f"{conc} and {rate}"


def arm_filter(arm):
    return "arm is null" if arm is None else "arm = " + sql_str(arm)


def sql_str(s):
    return "'" + s.replace("'", "''") + "'"


def nearest_rank_cdf(con, view, where, expr):
    """[[pct, value]] for pct 0..100: the nearest rank, computed in DuckDB."""
    rows = con.execute(f"""
        with v as (select {expr} as x, row_number() over (order by {expr}) as rn, count(*) over () as n
                   from {view} where {where} and {expr} is not null)
        select p.range as pct, v.x from range(0, 101) p join v
          on v.rn = greatest(1, (p.range * v.n + 99) // 100)
        order by pct""").fetchall()
    return [[int(p), int(x)] for p, x in rows]


def check_latency_cdf(con, runs, chart):
    n = 0
    for s in chart["series"]:
        run = runs[s["run"]]
        ok = "outcome = 'ok'" if s["outcome"] == "ok" else "outcome <> 'ok'"
        where = (f"phase = 'measured' and case_name = {sql_str(s['case'])} and {arm_filter(s['arm'])} "
                 f"and {level_filter(s)} and {ok}")
        want = nearest_rank_cdf(con, run.view, where, LATENCY)
        assert s["points"] == want, (chart["id"], s["name"], s["points"][:5], want[:5])
        count = con.execute(f"select count(*) from {run.view} where {where} and {LATENCY} is not null").fetchone()[0]
        assert s["n"] == count, (chart["id"], s["name"], s["n"], count)
        assert s["latency_from"] == ("intended_send_time" if s["rate_per_second"] is not None else "actual_send")
        n += 1
    return n


def measured_groups(con, run):
    """(case, arm, concurrency, rate, ok?) of measured rows with a latency, as DuckDB groups them."""
    return set(con.execute(f"""select case_name, arm, concurrency, target_rate_per_second, outcome = 'ok'
        from {run.view} where phase = 'measured' and {LATENCY} is not null group by all""").fetchall())


def round_values(con, run, level_col):
    """Per measured round: throughput, goodput, TTFT p50, ITL p50 and output tok/s, from rows."""
    slo = run.config["effective_budget"].get("slo")
    q = f"""select arm, case_name, {level_col} as lvl, repetition,
              count(*) filter (where outcome = 'ok') as ok,
              max(start_offset_us + coalesce(total_us, 0)) - min(start_offset_us) as elapsed,
              sum(output_tokens) filter (where outcome = 'ok' and is_stream) as tokens
            from {run.view} where phase = 'measured' and {level_col} is not null group by all"""
    out = {}
    for arm, case, lvl, rep, ok, elapsed, tokens in con.execute(q).fetchall():
        where = (f"phase = 'measured' and {arm_filter(arm)} and case_name = {sql_str(case)} "
                 f"and {level_col} = {lvl!r} and repetition = {rep}")
        secs = elapsed / 1e6
        v = {"throughput": ok / secs if secs > 0 else None}
        ttft = nearest_rank_cdf(con, run.view, where + " and outcome = 'ok' and is_stream", "ttft_us")
        v["TTFT p50"] = ttft[50][1] / 1e6 if ttft else None
        gaps = con.execute(f"""
            with g as (select unnest(list_transform(range(1, len(content_offsets_us)),
                                     lambda i: content_offsets_us[i + 1] - content_offsets_us[i])) as gap
                       from {run.view} where {where} and outcome = 'ok' and is_stream),
                 v as (select gap, row_number() over (order by gap) rn, count(*) over () n from g)
            select gap from v where rn = greatest(1, (50 * n + 99) // 100)""").fetchall()
        v["ITL p50"] = gaps[0][0] / 1e6 if gaps else None
        v["output tok/s"] = tokens / secs if tokens is not None and secs > 0 else None
        two_sided(con, run, where, (arm, case, lvl, rep, level_col), v)
        if slo:
            e2e = slo.get("e2e_ms")
            ttft_b = slo.get("ttft_ms")
            tpot_b = slo.get("tpot_ms")
            conds = ["outcome = 'ok'"]
            if ttft_b is not None:
                conds.append(f"coalesce(case when is_stream then ttft_us else first_byte_us end, 1e18) <= {ttft_b * 1000}")
            if tpot_b is not None:
                conds.append(f"(tpot_us is null or tpot_us <= {tpot_b * 1000})")
            if e2e is not None:
                conds.append(f"coalesce({LATENCY}, 1e18) <= {e2e * 1000}")
            good = con.execute(f"select count(*) from {run.view} where {where} and {' and '.join(conds)}").fetchone()[0]
            v["goodput"] = good / secs if secs > 0 else None
        out[(arm, case, float(lvl), rep)] = v
    return out


def two_sided(con, run, where, key, v):
    """Ours and the worker's TTFT and e2e p50 of one round (only where the worker was scraped)."""
    path = run.dir / "worker_metrics.parquet"
    if not path.exists():
        return
    arm, case, lvl, rep, level_col = key
    r = {"case": case, "repetition": rep, "arm": arm,
         "concurrency" if level_col == "concurrency" else "rate_per_second": lvl}
    edges = window(con, path, r)
    if edges is None:
        return  # no window for this round (a failed edge scrape): no point is drawn
    start, end = edges
    v["TTFT p50 (ours)"] = v["TTFT p50"]
    e2e = nearest_rank_cdf(con, run.view, where + " and outcome = 'ok'", "total_us")
    v["e2e p50 (ours)"] = e2e[50][1] / 1e6 if e2e else None
    for label, metric in (("TTFT p50 (worker)", "vllm:time_to_first_token_seconds"),
                          ("e2e p50 (worker)", "vllm:e2e_request_latency_seconds")):
        q = quantile(delta_buckets(con, path, start, end, metric), 0.5)
        v[label] = q[0] if q else None


def check_series(con, runs, chart):
    """The worker's and the GPU's lines, recomputed from worker_metrics.parquet and gpu.parquet."""
    run = runs[chart["run"]]
    n = 0
    for s in chart["series"]:
        m, name = s["metric"], s["name"]
        if chart["id"].startswith("gpu-"):
            g = int(name.split()[-1])
            want = con.execute(f"""select offset_us, value from '{run.dir / "gpu.parquet"}'
                where metric = ? and gpu = ? order by offset_us""", [m, g]).fetchall()
        else:
            path = run.dir / "worker_metrics.parquet"
            arm = arm_filter(s["arm"])
            if name.endswith("running") or name.endswith("waiting"):
                agg = "sum(value)"
            elif name.endswith("KV-cache use"):
                agg = "100 * avg(value)"
            else:
                agg = None
            if agg:
                want = con.execute(f"""select offset_us, {agg} from '{path}' where metric = ? and {arm}
                    group by offset_us, cause order by offset_us""", [m]).fetchall()
            else:
                # Prefix-cache hits: hits / queries between two consecutive scrapes.
                q = m.replace("_hits", "_queries")
                rows = con.execute(f"""select offset_us,
                        sum(value) filter (where metric = ?), sum(value) filter (where metric = ?)
                    from '{path}' where metric in (?, ?) and {arm}
                    group by offset_us, cause order by offset_us""",
                                   [q + "_total", m + "_total", q + "_total", m + "_total"]).fetchall()
                want = [(t, 100 * (h - ph) / (qv - pq)) for (_, pq, ph), (t, qv, h) in zip(rows, rows[1:])
                        if qv > pq and h >= ph]
        got = [tuple(p) for p in s["points"]]
        assert len(got) == len(want) and all(a[0] == b[0] and abs(a[1] - b[1]) <= 1e-9 * max(1, abs(b[1]))
                                             for a, b in zip(got, want)), (chart["id"], name, got[:3], want[:3])
        n += len(got)
    return n


def check_rounds(con, runs, chart, cache):
    level_col = "concurrency" if chart["level"] == "concurrency" else "target_rate_per_second"
    n = 0
    for s in chart["series"]:
        run = runs[s["run"]]
        key = (run.name, level_col)
        if key not in cache:
            cache[key] = round_values(con, run, level_col)
        values = cache[key]
        for x, rep, y in s["points"]:
            want = values[(s["arm"], s["case"], float(x), rep)][s["metric"]]
            assert close(y, want), (chart["id"], s["name"], x, rep, y, want)
            n += 1
    # Every measured round of every run in the chart has its throughput point.
    for run in {runs[s["run"]] for s in chart["series"]}:
        if (run.name, level_col) in cache and chart["id"].startswith("throughput"):
            pts = sum(len(s["points"]) for s in chart["series"] if s["run"] == run.name and s["metric"] == "throughput")
            assert pts == len(cache[(run.name, level_col)]), (chart["id"], run.name, pts)
    return n


SEARCH_VALUE = {
    "ttft": "coalesce(ttft_us, first_byte_us) + coalesce(send_lag_us, 0)",
    "tpot": "tpot_us",
    "e2e": LATENCY,
}


def probe_values(con, run, arm, case, kind, probe, quantity):
    """A probe's values of `quantity` from its rows, sorted; a failed row is above every
    bound (inf), an ok row without a value (a TPOT of one token) is no sample."""
    level = f"concurrency = {int(probe['load'])}" if kind == "concurrency" else f"target_rate_per_second = {float(probe['load'])!r}"
    rows = con.execute(f"""select outcome = 'ok', {SEARCH_VALUE[quantity]} from {run.view}
        where phase = 'measured' and {arm_filter(arm)} and case_name = {sql_str(case)}
          and {level} and repetition = {int(probe['repetition'])}""").fetchall()
    inf = float("inf")
    return sorted(inf if not ok else (inf if x is None and quantity != "tpot" else x)
                  for ok, x in rows if not (ok and x is None and quantity == "tpot"))


def check_search(con, runs, chart):
    """A search chart is search.json's probes, and each probe's percentile and its bound
    are the nearest rank and the order statistics at the recorded ranks of its own rows
    (DuckDB), failed rows above every bound; an extension pools two rounds and is checked
    against search.json only."""
    checks = 0
    for series in chart["series"]:
        run = runs[series["run"]]
        doc = json.loads((run.dir / "search.json").read_text())
        search = next(x for x in doc["searches"] if x["arm"] == series["arm"] and x["case"] == series["case"])
        probes = search["probes"]
        knee = search["answer"]["load"] if search["answer"] else None
        assert chart["knee"] == knee, (chart["id"], chart["knee"], knee)
        if series["name"] == "goodput":
            want = [[p["load"], p["goodput_per_second"], None, None] for p in probes if p["goodput_per_second"] is not None]
            assert series["points"] == want, chart["id"]
            checks += len(want)
            continue
        k = doc["slos"].index(series["name"])
        quantity, pct = series["name"].split("<=")[0].split("_p")
        p = float(pct) / 100
        assert len(series["points"]) == len(probes), chart["id"]
        for point, probe in zip(series["points"], probes):
            b = probe["slos"][k]
            assert point == [probe["load"], b["estimate_ms"], b["lower_ms"], b["upper_ms"]], (chart["id"], point)
            if probe["step"] == "extend":
                continue
            v = probe_values(con, run, series["arm"], series["case"], doc["kind"], probe, quantity)
            assert len(v) == b["samples"], (chart["id"], probe["index"], len(v), b["samples"])
            ms = lambda x: None if x == float("inf") else x / 1000
            n = len(v)
            rank = min(max(-(-round(p * n * 1e9) // 10**9), 1), n)
            assert close(ms(v[rank - 1]), b["estimate_ms"]), (chart["id"], probe["index"], v[rank - 1], b)
            # The ranks from n, p and the statement's confidence: n p ∓ z √(n p (1 − p)).
            z = NormalDist().inv_cdf(1 - (1 - doc["statement_confidence"]) / 2)
            spread = z * math.sqrt(n * p * (1 - p))
            want_lo, want_hi = math.floor(n * p - spread), math.ceil(n * p + spread - 1e-9)
            want = [want_lo if want_lo >= 1 else None, max(want_hi, 1) if want_hi <= n else None]
            assert b["ranks"] == want, (chart["id"], probe["index"], b["ranks"], want)
            lo, hi = b["ranks"]
            assert close(ms(v[lo - 1]) if lo else 0.0, b["lower_ms"]), (chart["id"], probe["index"], b)
            assert close(ms(v[hi - 1]) if hi else None, b["upper_ms"]), (chart["id"], probe["index"], b)
            checks += 4
    return checks


def check_drift(runs, chart):
    n = 0
    for s in chart["series"]:
        drift = next(d for d in runs[s["run"]].campaign["drift"] if d["arm"] == s["arm"])
        want = sorted([float(c), None, cell[s["metric"]]] for c, cell in drift["concurrency"].items())
        assert sorted(s["points"]) == want, (chart["id"], s["name"], s["points"], want)
        n += len(want)
    return n


def check_timeline(con, runs, chart):
    run = runs[chart["run"]]
    bin_us, first = chart["bin_us"], chart["first_bin"]
    series = {s["name"]: s["counts"] for s in chart["series"]}
    nbins = len(series["sends"])
    want = {"sends": [0] * nbins}
    for b, c in con.execute(f"select floor(start_offset_us / {bin_us}) - {first}, count(*) from {run.view} group by 1").fetchall():
        want["sends"][int(b)] = c
    # Open loops and traces: the intended sends (a trace's own arrivals) beside them.
    scheduled = con.execute(f"""select floor(scheduled_offset_us / {bin_us}) - {first}, count(*)
        from {run.view} where scheduled_offset_us is not null group by 1""").fetchall()
    if scheduled:
        want["scheduled"] = [0] * nbins
        for b, c in scheduled:
            want["scheduled"][int(b)] = c
    q = f"""select case when outcome = 'ok' then 'completed ok' else 'failed: ' || outcome end,
              floor((start_offset_us + coalesce(total_us, 0)) / {bin_us}) - {first}, count(*)
            from {run.view} group by 1, 2"""
    for name, b, c in con.execute(q).fetchall():
        want.setdefault(name, [0] * nbins)[int(b)] = c
    want.setdefault("completed ok", [0] * nbins)
    assert series == want, (chart["id"], {k: sum(v) for k, v in series.items()}, {k: sum(v) for k, v in want.items()})
    spans = con.execute(f"""select min(start_offset_us), max(start_offset_us + coalesce(total_us, 0)), count(*)
        from {run.view} where phase = 'measured' group by arm, case_name, concurrency, target_rate_per_second, repetition
        order by 1""").fetchall()
    assert [(r["start_us"], r["end_us"]) for r in chart["rounds"]] == [(a, b) for a, b, _ in spans], chart["id"]
    return sum(sum(v) for v in series.values())


def route_sql():
    # The path as report::routes::path_of takes it: no scheme, authority, query or fragment.
    rest = "regexp_replace(url, '^[^:/?#]*://', '')"
    path = f"regexp_extract(regexp_replace({rest}, '[?#].*$', ''), '(/.*)$', 1)"
    return f"method || ' ' || (case when {path} = '' then '/' else {path} end)"


def check_serve(con, runs, chart):
    n = 0
    for s in chart["series"]:
        run = runs[s["run"]]
        if chart["id"] == "serve-overhead":
            want = nearest_rank_cdf(con, run.view, "phase = 'live'", "downstream_done_us - total_us")
        else:
            top = [r for r, in con.execute(f"""select {route_sql()} r from {run.view} where phase = 'live'
                group by r order by count(*) desc, r limit 8""").fetchall()]
            if s["route"] == "other":
                where = "phase = 'live' and outcome = 'ok' and " + " and ".join(f"{route_sql()} <> {sql_str(r)}" for r in top)
            else:
                assert s["route"] in top, (s["route"], top)
                where = f"phase = 'live' and outcome = 'ok' and {route_sql()} = {sql_str(s['route'])}"
            want = nearest_rank_cdf(con, run.view, where, "total_us")
        assert s["points"] == want, (chart["id"], s["name"], s["points"][:3], want[:3])
        n += 1
    return n


def main(report: Path, dirs) -> int:
    html = report.read_text()
    con = duckdb.connect()
    runs = {}
    for d in dirs:
        r = Run(con, Path(d))
        runs[r.name] = r
    blocks = BLOCK.findall(html)
    figures = FIGURE.findall(html)
    assert blocks, "the report has no chart"
    assert [b[0] for b in blocks] == figures, "every figure has exactly one data block"
    kinds, checks, cache = {}, 0, {}
    groups_drawn = set()
    for fid, text in blocks:
        chart = json.loads(text)
        assert chart["id"] == fid
        assert chart["series"], f"{fid}: no series"
        kinds[chart["kind"]] = kinds.get(chart["kind"], 0) + 1
        if fid.startswith("latency-cdf-"):
            checks += check_latency_cdf(con, runs, chart)
            for s in chart["series"]:
                groups_drawn.add((s["run"], s["case"], s["arm"], s["concurrency"], s["rate_per_second"], s["outcome"] == "ok"))
        elif fid.startswith("drift-"):
            checks += check_drift(runs, chart)
        elif chart["kind"] == "search":
            checks += check_search(con, runs, chart)
        elif chart["kind"] == "rounds":
            checks += check_rounds(con, runs, chart, cache)
        elif chart["kind"] == "timeline":
            checks += check_timeline(con, runs, chart)
        elif chart["kind"] == "series":
            checks += check_series(con, runs, chart)
        elif fid.startswith("serve-"):
            checks += check_serve(con, runs, chart)
        else:
            raise AssertionError(f"{fid}: no check for this chart")
    # Every group of measured rows has its CDF series: none left out.
    for run in runs.values():
        if run.config["command"] != "replay":
            continue
        for case, arm, c, r, ok in measured_groups(con, run):
            key = (run.name, case, arm, c, r, ok)
            assert key in groups_drawn, f"no CDF series for {key}"
            checks += 1
        timelines = [b for b in blocks if json.loads(b[1]).get("run") == run.name and json.loads(b[1])["kind"] == "timeline"]
        assert len(timelines) == 1, (run.name, len(timelines))
    print(f"check_report: {len(blocks)} charts ({kinds}) of {len(runs)} run(s) equal DuckDB's numbers ({checks} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))

"""Interop check: a real run directory read with DuckDB, pandas, polars and pyarrow, no glue.

Recomputes every measured round's counts, failure kinds, elapsed time and nearest-rank
percentiles from exchanges/*.parquet and requires them to equal rounds.parquet and
summary.json. Usage: python3 tests/interop/check_run.py RUN_DIR
"""

import json
import sys
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq

KINDS = ["http", "correctness", "timeout", "transport", "client_aborted", "shutdown_cut"]


def nearest_rank(sorted_values, pct):
    """sorted[ceil(pct/100 * n) - 1], in integers (docs/metrics.md)."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, -(-pct * n // 100))
    return int(sorted_values[rank - 1])


def value(v):
    """A JSON or pandas value, nulls (None, NaN) as None, numbers as float."""
    return None if v is None or pd.isna(v) else float(v)


def same(column, v):
    """Rows of `column` equal to `v`, null matching null."""
    return column.isna() if value(v) is None else column == v


def main(run: Path) -> int:
    checks = 0
    # pandas / pyarrow read the directory as a dataset (dot-files are skipped).
    ex = pd.read_parquet(run / "exchanges")
    rounds = pd.read_parquet(run / "rounds.parquet")
    summary = json.loads((run / "summary.json").read_text())

    # polars reads exchanges/ by directory too (it holds Parquet parts only), and agrees.
    pl_ex = pl.read_parquet(run / "exchanges")
    assert pl_ex.height == len(ex), (pl_ex.height, len(ex))
    assert pl_ex["outcome"].to_list() == ex["outcome"].tolist()
    checks += 2

    # DuckDB globs the same parts and agrees on the count and per-phase totals.
    con = duckdb.connect()
    glob = str(run / "exchanges" / "*.parquet")
    assert con.execute(f"select count(*) from '{glob}'").fetchone()[0] == len(ex)
    by_phase = dict(con.execute(f"select phase, count(*) from '{glob}' group by all").fetchall())
    assert by_phase == ex.groupby("phase").size().to_dict(), by_phase
    checks += 2
    # Typed columns: a real timestamp with time zone, headers as list<struct>.
    types = dict(con.execute(f"select column_name, column_type from (describe select * from '{glob}')").fetchall())
    assert types["started_at"] == "TIMESTAMP WITH TIME ZONE", types["started_at"]
    assert types["request_headers"].startswith("STRUCT(\"name\" VARCHAR, \"value\" BLOB)[]"), types["request_headers"]
    names = {r[0] for r in con.execute(f"select unnest(request_headers).name from '{glob}'").fetchall()}
    assert "host" in names, names
    checks += 3
    # The last five columns: a turn's session and index, the server's cached prompt tokens,
    # a trace turn's session lag and why an oracle judged an answer wrong; a turn belongs to
    # a session and counts from 1, a cached count and a lag are never negative, only a
    # session's turn has a lag, and only a judged-wrong answer has a detail.
    described = con.execute(f"select column_name, column_type from (describe select * from '{glob}')").fetchall()
    last = [tuple(r) for r in described[-5:]]
    assert last == [("session_id", "VARCHAR"), ("turn", "INTEGER"), ("cached_prompt_tokens", "BIGINT"),
                    ("session_lag_us", "BIGINT"), ("oracle_detail", "VARCHAR")], last
    bad = con.execute(
        f"""select count(*) from '{glob}'
            where (session_id is null) <> (turn is null) or turn < 1 or cached_prompt_tokens < 0
               or session_lag_us < 0 or (session_lag_us is not null and turn is null)
               or (oracle_detail is not null) <> (oracle_passed is not null and not oracle_passed)"""
    ).fetchone()[0]
    assert bad == 0, bad
    checks += 2
    # Nearest rank in SQL, in integers, equals rounds.parquet.
    # A round's level is its concurrency, or (open loop) its rate: one of the two is null.
    sql_p95 = con.execute(
        f"""select case_name, concurrency, target_rate_per_second, repetition,
                   list_sort(list(total_us))[(95 * count(*) + 99) // 100] as p95
            from '{glob}' where phase = 'measured' and outcome = 'ok' group by all"""
    ).fetchall()
    for case, c, rate, rep, p95 in sql_p95:
        row = rounds[(rounds.case_name == case) & same(rounds.concurrency, c) & same(rounds.target_rate_per_second, rate) & (rounds.repetition == rep)]
        assert int(row.total_p95_us.iloc[0]) == p95, (case, c, rate, rep, p95)
        checks += 1

    measured = ex[ex.phase == "measured"]
    assert len(rounds) == len(summary["rounds"]) > 0
    for _, r in rounds.iterrows():
        sub = measured[
            (measured.case_name == r.case_name)
            & same(measured.concurrency, r.concurrency)
            & same(measured.target_rate_per_second, r.target_rate_per_second)
            & (measured.repetition == r.repetition)
        ]
        ok = sub[sub.outcome == "ok"]
        assert len(sub) == r.attempted_requests, (r.case_name, len(sub), r.attempted_requests)
        assert len(ok) == r.successful_requests
        for kind in KINDS:
            assert (sub.outcome == kind).sum() == r[f"failures_{kind}"], kind
        for col in ["total", "first_byte", "connect"]:
            values = sorted(ok[f"{col}_us"].dropna().tolist())
            for pct in (50, 95, 99):
                want = nearest_rank(values, pct)
                got = r[f"{col}_p{pct}_us"]
                got = None if pd.isna(got) else int(got)
                assert got == want, (r.case_name, r.concurrency, r.repetition, col, pct, got, want)
                checks += 1
        # Streaming: TTFT per exchange, ITL pooled over every gap of every exchange.
        streams = ok[ok.is_stream]
        if len(streams):
            ttft = sorted(streams.ttft_us.dropna().astype(int).tolist())
            gaps = sorted(
                int(b - a)
                for offs in streams.content_offsets_us
                for a, b in zip(list(offs)[:-1], list(offs)[1:])
            )
            for name, values in (("ttft", ttft), ("itl", gaps)):
                for pct in (50, 95, 99):
                    got = r[f"{name}_p{pct}_us"]
                    assert int(got) == nearest_rank(values, pct), (r.case_name, name, pct)
                    checks += 1
            tokens = int(streams.output_tokens.sum())
            assert tokens == r.output_tokens
            assert abs(tokens / r.elapsed_seconds - r.output_tokens_per_second_aggregate) < 1e-6
            checks += 2
        else:
            assert pd.isna(r.ttft_p50_us) and r.stream_requests == 0
        end = (sub.start_offset_us + sub.total_us).max()
        elapsed = (end - sub.start_offset_us.min()) / 1e6
        assert abs(elapsed - r.elapsed_seconds) < 1e-9, (elapsed, r.elapsed_seconds)
        s = next(
            x for x in summary["rounds"]
            if x["case"] == r.case_name
            and value(x["concurrency"]) == value(r.concurrency)
            and value(x["rate_per_second"]) == value(r.target_rate_per_second)
            and x["repetition"] == r.repetition
        )
        assert s["attempted_requests"] == r.attempted_requests
        assert s["successful_requests"] == r.successful_requests
        # The user's latency: from the intended send time in an open loop.
        p50 = r.total_p50_us if pd.isna(r.target_rate_per_second) else r.latency_from_schedule_p50_us
        assert s["successful_latency_seconds"]["p50"] == (None if pd.isna(p50) else p50 / 1e6)
        checks += 4
        if not pd.isna(r.target_rate_per_second):
            # Open loop: lag and latency from intended times, recomputed from the rows.
            # A session's arrival is its first turn: send lag is the arrivals'; latency
            # from the schedule every request's (a trace's later turn from when it was due).
            arrivals = sub[sub.turn.isna() | (sub.turn == 1)]
            lag = sorted(int(v) for v in (arrivals.start_offset_us - arrivals.scheduled_offset_us))
            assert lag == sorted(int(v) for v in arrivals.send_lag_us)
            user = sorted(int(v) for v in (ok.send_lag_us + ok.total_us))
            for pct in (50, 95, 99):
                assert int(r[f"send_lag_p{pct}_us"]) == nearest_rank(lag, pct)
                assert int(r[f"latency_from_schedule_p{pct}_us"]) == nearest_rank(user, pct)
                checks += 2
            assert int(r.send_lag_max_us) == max(lag)
            assert bool(r.saturated) == (max(lag) > 5000) == (r.late_sends > 0)
            checks += 2
        # Decisions: the sum over the round's successful rows, and the seed's list of
        # failure latencies in completion order.
        decisions = int(ok.decisions.fillna(0).sum())
        assert decisions == r.successful_decisions == s["successful_decisions"], (decisions, r.successful_decisions)
        failed = sub[sub.outcome != "ok"].assign(end=sub.start_offset_us + sub.total_us)
        failed = failed.sort_values(["end", "exchange_id"])
        want = [t / 1e6 for t in failed.total_us.dropna().tolist()]
        assert s["failure_latency_seconds"] == want, (s["failure_latency_seconds"], want)
        checks += 2

    # The footer metadata carries the schema version.
    for part in sorted((run / "exchanges").glob("part-*.parquet")):
        meta = pq.read_metadata(part).metadata
        assert meta[b"matrix_proxy.schema_version"] == b"1"
        checks += 1
    print(f"interop: {len(ex)} exchanges, {len(rounds)} rounds, {checks} checks passed")
    print(f"{checks} passed, 0 failed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

"""Interop check: a run of sessions read with DuckDB, no glue.

Recomputes every measured round's per-turn numbers (attempted, successful, nearest-rank
p50 / p95 / p99 of first byte, TTFT, latency, prompt and cached prompt tokens) from
exchanges/*.parquet grouped by the `turn` column, and requires them to equal
summary.json's rounds[].turns. Checks that every turn after the first resent the history
(its request holds more messages than the turn before it in the same session run), and
with --prefix-cache that turn 1 found no cached tokens and every later turn some. In a
trace's sessions, recomputes each turn's session lag percentiles too and checks that every
later turn was due (its scheduled_offset_us) no earlier than the turn before it ended, and
sent no earlier than it was due.
Usage: python3 tests/interop/check_sessions.py RUN_DIR [--prefix-cache]
"""

import json
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from check_run import nearest_rank  # noqa: E402

PCTS = {"p50": 50, "p95": 95, "p99": 99}


def pcts(values, scale):
    s = sorted(v for v in values if v is not None)
    return {k: (None if nearest_rank(s, p) is None else nearest_rank(s, p) / scale) for k, p in PCTS.items()}


def main(run: Path, prefix_cache: bool) -> int:
    checks = 0
    summary = json.loads((run / "summary.json").read_text())
    con = duckdb.connect()
    glob = str(run / "exchanges" / "*.parquet")
    rows = con.execute(
        f"""select concurrency, repetition, dispatch_index, session_id, turn, outcome,
                   first_byte_us, ttft_us, total_us, prompt_tokens, cached_prompt_tokens,
                   json_array_length(json_extract(decode(request_body), '$.messages')) as sent,
                   case_name, scheduled_offset_us, session_lag_us, start_offset_us
            from '{glob}' where phase = 'measured' order by exchange_id"""
    ).fetchall()
    assert rows and all(r[3] is not None and r[4] is not None for r in rows), "every measured row is a turn"
    for r in summary["rounds"]:
        mine = [x for x in rows if (x[12], x[0], x[1]) == (r["case"], r["concurrency"], r["repetition"])]
        for t in r["turns"]:
            of_k = [x for x in mine if x[4] == t["turn"]]
            ok = [x for x in of_k if x[5] == "ok"]
            assert (t["attempted"], t["successful"]) == (len(of_k), len(ok)), (r["repetition"], t)
            want = {
                "first_byte_seconds": pcts([x[6] for x in ok], 1e6),
                "ttft_seconds": pcts([x[7] for x in ok], 1e6),
                "latency_seconds": pcts([x[8] for x in ok], 1e6),
                "prompt_tokens": pcts([x[9] for x in ok], 1),
                "cached_prompt_tokens": pcts([x[10] for x in ok], 1),
            }
            for field, p in want.items():
                for k, v in p.items():
                    got = t[field][k]
                    assert (got is None and v is None) or abs(got - v) < 1e-9, (field, k, got, v, t)
                    checks += 1
            assert t["cached_reported"] == sum(1 for x in ok if x[10] is not None)
            lag = pcts([x[14] for x in of_k], 1e6)
            for k, v in lag.items():
                got = t["session_lag_seconds"][k]
                assert (got is None and v is None) or abs(got - v) < 1e-9, ("session_lag_seconds", k, got, v, t)
            checks += 2
    # Each later turn of a session run sent the history: more messages than the turn before.
    runs = {}
    for x in rows:
        runs.setdefault((x[12], x[0], x[1], x[2]), []).append(x)
    for turns in runs.values():
        turns.sort(key=lambda x: x[4])
        assert len({x[3] for x in turns}) == 1, "one session per run"
        for a, b in zip(turns, turns[1:]):
            assert b[4] == a[4] + 1 and b[11] > a[11], (a, b)
            checks += 1
            if b[14] is not None:
                # A trace's later turn: due after the turn before it ended, sent when due.
                assert b[13] >= a[15] + a[8] - 2 and b[15] >= b[13] and b[14] >= 0, (a, b)
                checks += 1
        if turns[0][14] is not None:
            assert turns[0][14] == 0, turns[0]
    if prefix_cache:
        for x in rows:
            if x[5] == "ok":
                assert (x[10] == 0) if x[4] == 1 else (x[10] > 0), x
                checks += 1
    print(f"check_sessions: {checks} checks passed on {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), "--prefix-cache" in sys.argv[2:]))

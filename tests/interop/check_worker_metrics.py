"""Interop check: a run's worker_metrics.parquet (replay --worker-metrics) read with DuckDB
and pandas, no glue: its columns and types, the labels map, a scrape window around every
measured round of summary.json (named by its case, level and repetition), and the mock's
request counter equal to the run's own count of answered requests.

Usage: python3 tests/interop/check_worker_metrics.py RUN_DIR
"""

import json
import sys
from pathlib import Path

import duckdb
import pandas as pd


def main(run: Path) -> int:
    path = run / "worker_metrics.parquet"
    con = duckdb.connect()
    cols = con.execute(f"describe select * from '{path}'").fetchall()
    types = {c[0]: c[1] for c in cols}
    assert list(types) == ["offset_us", "wall_time", "cause", "case_name", "concurrency",
                           "target_rate_per_second", "repetition", "metric", "labels", "value",
                           "type"], types
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
    df = pd.read_parquet(path)
    assert len(df) == con.execute(f"select count(*) from '{path}'").fetchone()[0]
    assert isinstance(df["labels"].iloc[0], (list, dict)), type(df["labels"].iloc[0])
    print(f"worker metrics interop: {len(df)} samples, {measured} round windows, "
          f"success counter {last:.0f} of {ok} ok requests at the last scrape")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

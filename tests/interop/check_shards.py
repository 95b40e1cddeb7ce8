"""Interop check: an open-loop plan (plans/open-demo.json's first case with short
rounds, each process with its own built-in mock worker) replayed unsharded and as two shards started at one instant, the
shards merged by `summarize OUT`, then read back with DuckDB over the Hive-partitioned
layout (the query docs/load.md shows). Checks: the merged rounds are the unsharded run's
rounds (same levels, planned and attempted counts); DuckDB's per-shard counts are each
shard's own summary's; each merged round's nearest-rank p99 of the latency from intended
times, recomputed in SQL over both shards' rows, equals rounds.parquet's.

Usage: python3 tests/interop/check_shards.py PATH/TO/matrix-proxy WORKDIR
"""

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import check_run  # noqa: E402
from support import cli_main, passed  # noqa: E402

PLAN = Path(__file__).parent.parent.parent / "plans" / "open-demo.json"

# The query docs/load.md shows, as written there.
DOCS_QUERY = """
SELECT shard, target_rate_per_second AS rate, repetition,
       count(*) AS sends,
       quantile_disc(send_lag_us, 0.99) AS send_lag_p99_us
FROM read_parquet('OUT/exchanges/*/*.parquet', hive_partitioning = true)
WHERE phase = 'measured'
GROUP BY ALL
ORDER BY rate, repetition, shard;
"""


def main(binary: str, work: Path) -> int:
    checks = 0
    single, out = work / "open-single", work / "open-sharded"
    for d in (single, out):
        shutil.rmtree(d, ignore_errors=True)
    # The demo's first case, with short rounds and a short deadline: a sharded run spaces
    # its waves by timeout_seconds + 1 s, and CI's time is short.
    plan = json.loads(PLAN.read_text())
    plan["cases"] = plan["cases"][:1]
    plan["timeout_seconds"] = 1
    plan["load"]["duration_seconds"] = 2
    path = work / "open-check.json"
    path.write_text(json.dumps(plan))
    subprocess.run([binary, "replay", str(path), "--mock-worker", "--quiet", "--out", str(single)], check=True)
    # The unsharded open run, read back by every reader (check_run recomputes its lag and
    # latency from intended times).
    check_run.main(single)
    start = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=4)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )
    shards = [
        subprocess.Popen(
            [binary, "replay", str(path), "--mock-worker", "--quiet", "--shard", f"{i}/2", "--start-at", start, "--out", str(out)]
        )
        for i in range(2)
    ]
    for p in shards:
        assert p.wait(timeout=300) == 0, "a shard failed"
    subprocess.run([binary, "summarize", "--quiet", str(out)], check=True)

    merged = json.loads((out / "summary.json").read_text())
    whole = json.loads((single / "summary.json").read_text())
    assert merged["shards"]["count"] == 2
    keys = ("case", "rate_per_second", "repetition", "planned_requests", "attempted_requests")
    assert [[r[k] for k in keys] for r in merged["rounds"]] == [[r[k] for k in keys] for r in whole["rounds"]]
    # Each shard also runs the prelude (health check, readiness probe, warm-ups) once.
    prelude = 1 + sum(len(c.get("variants", [None])) * (1 + plan.get("warmup_per_case", 2)) for c in plan["cases"])
    assert merged["planned_requests"] == whole["planned_requests"] + (2 - 1) * prelude, (merged["planned_requests"], whole["planned_requests"], prelude)
    checks += 3

    # The docs' query, on this OUT.
    con = duckdb.connect()
    per_shard = con.execute(DOCS_QUERY.replace("OUT", str(out))).df()
    for i in range(2):
        own = json.loads((out / "shards" / str(i) / "summary.json").read_text())
        sent = per_shard[per_shard["shard"] == i]["sends"].sum()
        assert sent == sum(r["attempted_requests"] for r in own["rounds"]), (i, sent)
        checks += 1
    assert per_shard["sends"].sum() == sum(r["attempted_requests"] for r in merged["rounds"])
    checks += 1

    # Nearest rank over both shards' rows, in SQL, equals the merged rounds.parquet.
    rounds = pd.read_parquet(out / "rounds.parquet")
    got = con.execute(
        f"""
        WITH ok AS (
          SELECT case_name, target_rate_per_second AS rate, repetition, send_lag_us + total_us AS v,
                 row_number() OVER (PARTITION BY case_name, target_rate_per_second, repetition
                                    ORDER BY send_lag_us + total_us) AS k,
                 count(*) OVER (PARTITION BY case_name, target_rate_per_second, repetition) AS n
          FROM read_parquet('{out}/exchanges/*/*.parquet', hive_partitioning = true)
          WHERE phase = 'measured' AND outcome = 'ok')
        SELECT case_name, rate, repetition, v AS p99 FROM ok WHERE k = (99 * n + 99) // 100
        """
    ).df()
    for _, r in rounds.iterrows():
        row = got[(got.case_name == r.case_name) & (got.rate == r.target_rate_per_second) & (got.repetition == r.repetition)]
        assert len(row) == 1 and int(row.p99.iloc[0]) == int(r.latency_from_schedule_p99_us), (r.case_name, r.target_rate_per_second, r.repetition)
        checks += 1
    return passed(f"shards: {len(rounds)} merged rounds from 2 shards", checks)


if __name__ == "__main__":
    cli_main(main, __doc__)

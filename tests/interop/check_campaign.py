"""Interop check: a campaign run's campaign.json, recomputed from exchanges/ with DuckDB.

For every arm and concurrency level, the cell's denominators, nearest-rank latency and
TTFT, mean per-request decode rate and aggregate decode rate are recomputed from the
measured rows (and rounds.parquet's elapsed times) and must equal campaign.json.

Usage: python3 tests/interop/check_campaign.py RUN_DIR
"""

import json
import math
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from check_run import nearest_rank  # noqa: E402


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def main(run: Path) -> int:
    checks = 0
    campaign = json.loads((run / "campaign.json").read_text())
    con = duckdb.connect()
    glob = str(run / "exchanges" / "*.parquet")
    rows = con.execute(
        f"""select arm, concurrency, outcome, total_us, is_stream, ttft_us, output_tokens,
                   decode(response_body) as body
            from '{glob}' where phase = 'measured'"""
    ).fetchall()
    elapsed = dict(
        ((arm, c), e)
        for arm, c, e in con.execute(
            f"select arm, concurrency, sum(elapsed_seconds) from '{run / 'rounds.parquet'}' group by all"
        ).fetchall()
    )
    for arm in campaign["arms"]:
        for level, cell in arm["concurrency"].items():
            c = int(level)
            mine = [r for r in rows if r[0] == arm["name"] and r[1] == c]
            ok = [r for r in mine if r[2] == "ok"]
            assert cell["attempted_requests"] == len(mine), (arm["name"], c)
            assert cell["failed_requests"] == len(mine) - len(ok), (arm["name"], c)
            lat = sorted(r[3] for r in ok)
            streams = [r for r in ok if r[4]]
            ttft = sorted(r[5] for r in streams if r[5] is not None)
            for key, values, pct in (("latency_p50_ms", lat, 50), ("latency_p95_ms", lat, 95),
                                     ("ttft_p50_ms", ttft, 50), ("ttft_p95_ms", ttft, 95)):
                want = nearest_rank(values, pct)
                assert cell[key] == (None if want is None else want / 1000), (arm["name"], c, key)
                checks += 1
            decode = [r[6] / ((r[3] - r[5]) / 1e6) for r in streams
                      if r[5] is not None and r[6] and r[3] > r[5]]
            want = sum(sorted(decode)) / len(decode) if decode else None
            assert close(cell["decode_tokens_per_sec"], want), (arm["name"], c, cell, want)
            tokens = 0
            for r in ok:
                if r[4]:
                    tokens += r[6] or 0
                else:
                    usage = json.loads(r[7]).get("usage") or {}
                    tokens += usage.get("completion_tokens", 0)
            assert cell["output_tokens"] == tokens, (arm["name"], c)
            assert close(cell["aggregate_decode_tokens_per_sec"], tokens / elapsed[(arm["name"], c)])
            checks += 5
    print(f"campaign interop: {len(campaign['arms'])} arms, {checks} checks passed")
    print(f"{checks} passed, 0 failed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

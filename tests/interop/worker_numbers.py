"""What the worker-metrics checks share: Prometheus's histogram_quantile over a histogram's
delta between two scrapes of worker_metrics.parquet, recomputed with DuckDB."""


def close(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def quantile(cumulative, q):
    """histogram_quantile over [(upper bound, cumulative count)]: (value, lower, upper), the
    upper bound None for +Inf; None without observations or with only a +Inf bucket."""
    if not cumulative or not cumulative[-1][1] > 0:
        return None
    rank = q * cumulative[-1][1]
    prev = None
    for upper, count in cumulative:
        if count >= rank:
            if upper == float("inf"):
                return None if prev is None else (prev[0], prev[0], None)
            if prev is None and upper <= 0:
                return upper, upper, upper
            lower, below = prev if prev is not None else (0.0, 0.0)
            inside = count - below
            at = lower + (upper - lower) * (rank - below) / inside if inside > 0 else upper
            return at, lower, upper
        prev = (upper, count)
    return None


def window(con, path, r):
    """(start, end) offsets of the round_start and round_end scrapes of summary round `r`;
    None when the round has neither (a failed edge scrape); two of either is an error."""
    level = ("concurrency = ?", r["concurrency"]) if r.get("concurrency") is not None \
        else ("target_rate_per_second = ?", r["rate_per_second"])
    arm = ("arm = ?", r["arm"]) if r.get("arm") is not None else ("arm is null and ? is null", None)
    where = f"case_name = ? and repetition = ? and {level[0]} and {arm[0]}"
    args = [r["case"], r["repetition"], level[1], arm[1]]
    out = []
    for cause in ("round_start", "round_end"):
        rows = con.execute(f"select distinct offset_us from '{path}' where cause = '{cause}' and {where}",
                           args).fetchall()
        assert len(rows) <= 1, (cause, r["case"], r["repetition"], rows)
        out.append(rows[0][0] if rows else None)
    return None if None in out else (out[0], out[1])


def delta_buckets(con, path, start, end, metric):
    """[(le, count)] of a histogram's delta between two scrapes, summed over label sets."""
    return con.execute(f"""select cast(labels['le'] as double) le,
            sum(value) filter (where offset_us = ?) - coalesce(sum(value) filter (where offset_us = ?), 0)
        from '{path}' where metric = ? and offset_us in (?, ?) group by le order by le""",
                       [end, start, metric + "_bucket", start, end]).fetchall()

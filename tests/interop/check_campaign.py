"""Interop check: a campaign run's campaign.json, recomputed from exchanges/ with DuckDB.

For every arm and concurrency level, the cell's denominators, nearest-rank latency and
TTFT, mean per-request decode rate and aggregate decode rate are recomputed from the
measured rows (and rounds.parquet's elapsed times) and must equal campaign.json. Drift
(pairs, exact match, mean similarity, first divergence) is recomputed from the recorded
answers with an independent Levenshtein, and when the run has verdict.json, every gate's
result per arm, the lanes and the verdict are re-derived from campaign.json and the
thresholds it recorded. The statistics a v2 verdict reads are recomputed with this file's
own code: each cell's pooled decode estimator and its exclusions (stream_bundled from
content_offsets_us), each drift entry's exact McNemar p-value and validity per oracle
kind (rates, exact intervals, the paired drop), and one bootstrap
interval, drawn from a ChaCha8 stream written here from the block function.

Usage: python3 tests/interop/check_campaign.py RUN_DIR
"""

import json
import math
import struct
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
                   decode(response_body) as body, output_tokens_source
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
                    n = usage.get("completion_tokens")
                    # A JSON answer's row holds its usage, with its source.
                    assert (r[6], r[8]) == ((n, "usage") if n is not None else (None, None)), r
                    tokens += n or 0
            assert cell["output_tokens"] == tokens, (arm["name"], c)
            assert close(cell["aggregate_decode_tokens_per_sec"], tokens / elapsed[(arm["name"], c)])
            checks += 5
    checks += check_decode(con, glob, campaign)
    checks += check_mcnemar(con, glob, campaign)
    checks += check_validity(con, glob, campaign, run)
    checks += check_interval(con, glob, campaign)
    checks += check_drift(con, glob, campaign)
    for name in ("verdict.json", "verdict-v2.json"):
        if (run / name).exists():
            checks += check_verdict(campaign, json.loads((run / name).read_text()))
    print(f"campaign interop: {len(campaign['arms'])} arms, {checks} checks passed")
    print(f"{checks} passed, 0 failed")
    return 0


def bundled(offsets) -> bool:
    """More than half of the content events after the first arrived in one read."""
    after = list(offsets[1:])
    if len(after) < 2:
        return False
    best = run = 1
    for x, y in zip(after, after[1:]):
        run = run + 1 if x == y else 1
        best = max(best, run)
    return best * 2 > len(after)


def check_decode(con, glob: str, campaign: dict) -> int:
    """Each cell's pooled decode estimator and decode_excluded, and the stream_bundled
    column, from the rows."""
    rows = con.execute(
        f"""select arm, concurrency, total_us, ttft_us, output_tokens, content_offsets_us,
                   stream_bundled
            from '{glob}' where phase = 'measured' and outcome = 'ok' and is_stream"""
    ).fetchall()
    checks = 0
    for arm in campaign["arms"]:
        for level, cell in arm["concurrency"].items():
            mine = [r for r in rows if r[0] == arm["name"] and r[1] == int(level)]
            excluded = {"no_first_token": 0, "no_tokens": 0, "no_decode_time": 0, "bundled": 0,
                        "pooled_streams": 0}
            tokens = decode_us = 0
            for _, _, total, ttft, n, offsets, is_bundled in mine:
                assert is_bundled == bundled(offsets), (arm["name"], offsets)
                if ttft is None:
                    excluded["no_first_token"] += 1
                elif not n:
                    excluded["no_tokens"] += 1
                elif total - ttft <= 0:
                    excluded["no_decode_time"] += 1
                elif is_bundled:
                    excluded["bundled"] += 1
                else:
                    excluded["pooled_streams"] += 1
                    tokens += n
                    decode_us += total - ttft
            if not mine:
                continue
            assert cell["decode_excluded"] == excluded, (arm["name"], level, cell["decode_excluded"])
            want = tokens / (decode_us / 1e6) if decode_us else None
            assert close(cell["decode_pooled_tokens_per_sec"], want), (arm["name"], level)
            checks += 2 + len(mine)
    return checks


def mcnemar_p(b: int, c: int) -> float:
    """The exact two-sided McNemar p-value, with integer binomial coefficients."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def check_mcnemar(con, glob: str, campaign: dict) -> int:
    """Each drift entry's McNemar counts and p-value from the rows' oracle_passed (the
    oracle's judgment, also where a performance-fit arm's mismatch stayed ok), paired by
    answer slot."""
    rows = con.execute(
        f"""select arm, case_name, variant, concurrency, repetition, dispatch_index,
                   oracle_passed
            from '{glob}' where phase = 'measured' and outcome in ('ok', 'correctness')
              and oracle_passed is not null"""
    ).fetchall()
    # Only cases judged by an oracle (summary.json's cases[].judged) are McNemar items.
    summary = json.loads((Path(glob).parent.parent / "summary.json").read_text())
    oracle_cases = {c["name"] for c in summary["cases"] if c["judged"] == "oracle"}
    judged: dict = {}
    for arm, *key, passed in rows:
        if key[0] in oracle_cases:
            judged.setdefault(arm, {})[tuple(key)] = passed
    ref = judged.get(campaign["reference_arm"], {})
    checks = 0
    for e in campaign["drift"]:
        m = e.get("mcnemar")
        if m is None:
            continue
        mine = judged.get(e["arm"], {})
        # One item per distinct request (case, variant): passed on a side when every
        # answer to it, at slots both sides had judged, passed.
        items: dict = {}
        for k in mine:
            if k in ref:
                r, a = items.get(k[:2], (True, True))
                items[k[:2]] = (r and ref[k], a and mine[k])
        pairs = list(items.values())
        b = sum(1 for r, a in pairs if r and not a)
        c = sum(1 for r, a in pairs if a and not r)
        assert (m["pairs"], m["only_reference_passed"], m["only_arm_passed"]) == (len(pairs), b, c), m
        assert close(m["p_value"], mcnemar_p(b, c)), (m["p_value"], mcnemar_p(b, c))
        checks += 2
    return checks


ORACLE_KINDS = [("expected_response", "json"), ("expected_response_text", "bytes"),
                ("expected_stream_text", "stream"), ("expected_events", "stream"),
                ("expected_schema", "schema"), ("expected_tool_calls", "tool_calls"),
                ("expected_choice", "choice"), ("expected_pattern", "pattern")]


def binomial_mass(lo: int, hi: int, n: int, p: float) -> float:
    """P(lo <= X <= hi) for X ~ Binomial(n, p), summed with lgamma (as src/stats.rs)."""
    if p <= 0:
        return 1.0 if lo == 0 else 0.0
    if p >= 1:
        return 1.0 if hi >= n else 0.0
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * math.log(p) + (n - i) * math.log1p(-p))
                        for i in range(lo, min(hi, n) + 1)))


def clopper_pearson(k: int, n: int, confidence: float = 0.95):
    """The exact interval by bisection on the binomial tails, ends rounded outwards."""
    a = (1 - confidence) / 2
    def bisect(lo, hi, above):
        for _ in range(64):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if above(mid) else (lo, mid)
        return lo, hi
    upper = 1.0 if k == n else bisect(k / n, 1.0, lambda p: binomial_mass(0, k, n, p) > a)[1]
    lower = 0.0 if k == 0 else bisect(0.0, k / n, lambda p: binomial_mass(k, n, n, p) < a)[0]
    return lower, upper


def check_validity(con, glob: str, campaign: dict, run: Path) -> int:
    """Each drift entry's validity per oracle kind from the rows' oracle_passed: a
    distinct request valid when every judged answer to it is; its rate and exact
    interval, the reference's, and the paired drop with its Bonferroni interval."""
    plan = json.loads((run / "plan.json").read_text())
    kinds = {}
    for case in plan["cases"]:
        for v in case.get("variants") or [case]:
            name = v.get("name") if "variants" in case else None
            kinds[(case["name"], name)] = next((k for f, k in ORACLE_KINDS if f in v), "none")
    rows = con.execute(
        f"""select arm, case_name, variant, oracle_passed
            from '{glob}' where phase = 'measured' and outcome in ('ok', 'correctness')
              and oracle_passed is not null"""
    ).fetchall()
    sides: dict = {}
    for arm, case, variant, passed in rows:
        kind = kinds.get((case, variant), "json")
        valid, answers, ok = sides.setdefault(arm, {}).get((kind, case, variant), (True, 0, 0))
        sides[arm][(kind, case, variant)] = (valid and passed, answers + 1, ok + int(passed))
    ref = sides.get(campaign["reference_arm"], {})
    checks = 0
    for e in campaign["drift"]:
        mine = sides.get(e["arm"], {})
        for v in e.get("validity") or []:
            of_kind = {k: x for k, x in mine.items() if k[0] == v["kind"]}
            refs = {k: x for k, x in ref.items() if k[0] == v["kind"]}
            n = len(of_kind)
            k = sum(1 for x in of_kind.values() if x[0])
            assert (v["answers"], v["valid_answers"]) == (sum(x[1] for x in of_kind.values()),
                                                         sum(x[2] for x in of_kind.values())), v
            assert (v["requests"], v["valid_requests"]) == (n, k), v
            lo, hi = clopper_pearson(k, n)
            assert close(v["interval"][0], lo) and close(v["interval"][1], hi), (v, lo, hi)
            assert (v["reference_requests"], v["reference_valid_requests"]) == (
                len(refs), sum(1 for x in refs.values() if x[0])), v
            both = [(refs[r][0], x[0]) for r, x in of_kind.items() if r in refs]
            b = sum(1 for r, a in both if r and not a)
            c = sum(1 for r, a in both if a and not r)
            p = v["paired"]
            assert (p["requests"], p["only_reference_valid"], p["only_arm_valid"]) == (len(both), b, c), p
            (bl, bh), (cl, ch) = clopper_pearson(b, len(both), 0.975), clopper_pearson(c, len(both), 0.975)
            assert close(p["drop_interval"][0], bl - ch) and close(p["drop_interval"][1], bh - cl), p
            checks += 6
    return checks


class ChaCha8:
    """The ChaCha block function, 8 rounds, keyed by a u64 seed (little-endian, then 24
    zero bytes), nonce 0, 64-bit block counter from 0: the stream docs/campaigns.md names."""

    def __init__(self, seed: int):
        self.key = list(struct.unpack("<8I", struct.pack("<Q", seed) + bytes(24)))
        self.counter = 0
        self.words: list = []

    def _block(self) -> list:
        mask = 0xFFFFFFFF

        def rotl(x, n):
            return ((x << n) & mask) | (x >> (32 - n))

        def quarter(s, a, b, c, d):
            s[a] = (s[a] + s[b]) & mask; s[d] = rotl(s[d] ^ s[a], 16)
            s[c] = (s[c] + s[d]) & mask; s[b] = rotl(s[b] ^ s[c], 12)
            s[a] = (s[a] + s[b]) & mask; s[d] = rotl(s[d] ^ s[a], 8)
            s[c] = (s[c] + s[d]) & mask; s[b] = rotl(s[b] ^ s[c], 7)

        init = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *self.key,
                self.counter & mask, self.counter >> 32, 0, 0]
        self.counter += 1
        s = init[:]
        for _ in range(4):
            quarter(s, 0, 4, 8, 12); quarter(s, 1, 5, 9, 13)
            quarter(s, 2, 6, 10, 14); quarter(s, 3, 7, 11, 15)
            quarter(s, 0, 5, 10, 15); quarter(s, 1, 6, 11, 12)
            quarter(s, 2, 7, 8, 13); quarter(s, 3, 4, 9, 14)
        return [(x + y) & mask for x, y in zip(s, init)]

    def next_u64(self) -> int:
        if len(self.words) < 2:
            self.words += self._block()
        lo, hi = self.words.pop(0), self.words.pop(0)
        return lo | (hi << 32)


def check_interval(con, glob: str, campaign: dict) -> int:
    """Bootstrap intervals recomputed: the first arm's latency p95 ratio at its first level
    and the first aggregate decode ratio (every ok answer's tokens, a JSON answer's from
    its body's usage, over the rounds' spans), rounds resampled within each case (paired
    under the interleaved schedule)."""
    iv = campaign.get("intervals")
    if not iv:
        return 0
    checks = 0
    for metric in ("latency_p95_ms", "aggregate_decode_tokens_per_sec"):
        entry = next((e for e in iv["entries"] if e["metric"] == metric
                      and e["interval"] is not None), None)
        if entry is not None:
            checks += check_one_interval(con, glob, campaign, iv, entry)
    return checks


def check_one_interval(con, glob: str, campaign: dict, iv: dict, entry: dict) -> int:
    rows = con.execute(
        f"""select arm, case_name, repetition, outcome, start_offset_us, total_us, is_stream,
                   output_tokens, decode(response_body)
            from '{glob}' where phase = 'measured' and concurrency = ?""",
        [entry["concurrency"]],
    ).fetchall()
    def tokens(outcome, is_stream, output_tokens, body):
        if outcome != "ok":
            return 0
        if is_stream:
            return output_tokens or 0
        return ((json.loads(body).get("usage") or {}).get("completion_tokens")) or 0

    # Each row as (ok, start, end, total, tokens).
    rounds: dict = {}
    for arm, case, rep, outcome, start, total, is_stream, output_tokens, body in rows:
        row = (outcome == "ok", start, start + (total or 0), total,
               tokens(outcome, is_stream, output_tokens, body))
        rounds.setdefault(arm, {}).setdefault(case, {}).setdefault(rep, []).append(row)
    ref, arm = rounds[campaign["reference_arm"]], rounds[entry["arm"]]
    paired = iv["paired"]
    groups = []
    for case in sorted(arm):
        if case not in ref:
            continue
        if paired:
            reps = sorted(r for r in arm[case] if r in ref[case])
            groups.append(([ref[case][r] for r in reps], [arm[case][r] for r in reps]))
        else:
            groups.append(([ref[case][r] for r in sorted(ref[case])],
                           [arm[case][r] for r in sorted(arm[case])]))

    def value(drawn):
        if entry["metric"] == "latency_p95_ms":
            return nearest_rank(sorted(r[3] for rnd in drawn for r in rnd if r[0]), 95) / 1000
        span = sum((max(r[2] for r in rnd) - min(r[1] for r in rnd)) / 1e6 for rnd in drawn)
        return sum(r[4] for rnd in drawn for r in rnd) / span

    point = value([r for g in groups for r in g[1]]) / value([r for g in groups for r in g[0]])
    assert close(entry["ratio"], point), (entry["ratio"], point)
    rng = ChaCha8(iv["seed"])
    stats = []
    for _ in range(iv["resamples"]):
        xa, xb = [], []
        for ga, gb in groups:
            if paired:
                for _ in ga:
                    i = rng.next_u64() % len(ga)
                    xa.append(ga[i])
                    xb.append(gb[i])
            else:
                xa += [ga[rng.next_u64() % len(ga)] for _ in ga]
                xb += [gb[rng.next_u64() % len(gb)] for _ in gb]
        stats.append(value(xb) / value(xa))
    stats.sort()
    n = len(stats)
    low, high = stats[math.ceil(0.025 * n) - 1], stats[math.ceil(0.975 * n) - 1]
    got = entry["interval"]
    assert close(got["low"], low) and close(got["high"], high), (got, low, high)
    print(f"interval recomputed: {entry['arm']} c={entry['concurrency']} {entry['metric']} ratio "
          f"{point:.4f} [{low:.4f}, {high:.4f}] from {n} resamples")
    return 2


def answer_text(body: bytes, is_stream: bool) -> str:
    """The compared answer: a stream's assembled content, else the first choice's content."""
    text = body.decode("utf-8", "replace")
    if is_stream:
        out = []
        for line in text.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data and data != "[DONE]":
                    for ch in json.loads(data).get("choices") or []:
                        if ch.get("index", 0) == 0:
                            piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                            out.append(piece)
        return "".join(out)
    doc = json.loads(text)
    first = doc["choices"][0]
    return first["message"]["content"] if "message" in first else first["text"]


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def check_drift(con, glob: str, campaign: dict) -> int:
    rows = con.execute(
        f"""select arm, case_name, variant, concurrency, repetition, dispatch_index, is_stream,
                   response_body
            from '{glob}' where phase = 'measured' and outcome = 'ok'"""
    ).fetchall()
    answers: dict = {}
    for arm, case, variant, c, rep, idx, is_stream, body in rows:
        answers.setdefault(arm, {})[(case, variant, c, rep, idx)] = answer_text(body, is_stream)
    ref = answers.get(campaign["reference_arm"], {})
    checks = 0
    entries = {e["arm"]: e for e in campaign["drift"]}
    for arm in campaign["arms"]:
        if arm["reference"] or not arm["available"]:
            assert arm["name"] not in entries, arm["name"]
            continue
        e = entries[arm["name"]]
        mine = answers.get(arm["name"], {})
        keys = sorted(k for k in mine if k in ref)
        assert e["compared_prompts"] == len(keys), (arm["name"], e["compared_prompts"], len(keys))
        # The distinct requests (case, variant) behind the pairs, in all and per level.
        assert e["distinct_requests"] == len({k[:2] for k in keys}), e["arm"]
        for level, lv in e["concurrency"].items():
            assert lv["distinct_requests"] == len({k[:2] for k in keys if k[2] == int(level)}), level
        sims, equal = [], 0
        for k in keys:
            a, b = ref[k], mine[k]
            equal += a == b
            longest = max(len(a), len(b))
            sims.append(1.0 if longest == 0 else 1 - levenshtein(a, b) / longest)
        assert close(e["exact_match_rate"], equal / len(keys) if keys else None), e["arm"]
        assert close(e["mean_similarity"], sum(sims) / len(keys) if keys else None), e["arm"]
        assert e["advisory"] == (arm["lane"] == "performance-fit"), e["arm"]
        by_key = {(p["case"], p["variant"], p["concurrency"], p["repetition"], p["dispatch_index"]): p
                  for p in e["prompts"]}
        for k in keys:
            a, b = ref[k], mine[k]
            div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert by_key[k]["first_divergence_char"] == (None if a == b else div), (k, by_key[k])
            assert (by_key[k]["reference_chars"], by_key[k]["arm_chars"]) == (len(a), len(b)), k
        checks += 4 + 2 * len(keys)
    # The floor: the reference against itself, every pair of its repetitions per answer
    # slot (case, variant, level, dispatch index).
    slots: dict = {}
    for (case, variant, c, rep, idx), text in ref.items():
        slots.setdefault((case, variant, c, idx), {})[rep] = text
    pairs, equal, sims = 0, 0, []
    for reps in slots.values():
        order = sorted(reps)
        for i, r1 in enumerate(order):
            for r2 in order[i + 1:]:
                a, b = reps[r1], reps[r2]
                pairs += 1
                equal += a == b
                longest = max(len(a), len(b))
                sims.append(1.0 if longest == 0 else 1 - levenshtein(a, b) / longest)
    floor = campaign["drift_floor"]
    assert floor["compared_prompts"] == pairs, (floor["compared_prompts"], pairs)
    repeated = {k[:2] for k, reps in slots.items() if len(reps) > 1}
    assert floor["distinct_requests"] == len(repeated), (floor["distinct_requests"], len(repeated))
    assert close(floor["exact_match_rate"], equal / pairs if pairs else None), floor
    assert close(floor["mean_similarity"], sum(sims) / pairs if pairs else None), floor
    for e in campaign["drift"]:
        want = None if e["exact_match_rate"] is None or floor["exact_match_rate"] is None \
            else e["exact_match_rate"] - floor["exact_match_rate"]
        assert close(e["exact_match_rate_minus_floor"], want), e["arm"]
    checks += 3 + len(campaign["drift"])
    return checks


def check_verdict_v2(campaign: dict, verdict: dict) -> int:
    """A version 2 verdict: every floor-relative level against drift_floor, every
    interval-rule level against campaign.json's intervals, the fit answer gates against
    drift, each with the rules docs/campaigns.md gives."""
    t = verdict["contract"]["thresholds"]
    tol = 1e-9
    floor = campaign["drift_floor"]["concurrency"]
    drift = {e["arm"]: e for e in campaign["drift"]}
    intervals = {(e["arm"], e["concurrency"], e["metric"]): e
                 for e in campaign["intervals"]["entries"]}

    def ge(a, b):
        return b <= a + tol * max(abs(a), abs(b))

    checks = 0
    for g in verdict["gates"]:
        name = g["gate"]
        for entry in g["arms"]:
            for lv in entry["levels"]:
                c = lv.get("concurrency")
                if name in ("quality_max_exact_match_drop_vs_floor", "quality_min_similarity_vs_floor"):
                    key = "exact_match_rate" if "exact" in name else "mean_similarity"
                    f = floor[str(c)]
                    limit = f[key] - t[name] if "exact" in name else t[name] * f[key]
                    assert lv["floor"] == f[key] and lv["floor_pairs"] == f["compared_prompts"], lv
                    assert lv["floor_distinct_requests"] == f["distinct_requests"], lv
                    assert close(lv["limit"], limit), (lv, limit)
                    mine = drift[entry["arm"]]["concurrency"][str(c)]
                    assert lv["measured"] == mine[key]
                    # The minimum counts distinct requests, the floor's and the arm's.
                    enough = f["distinct_requests"] >= 30 and mine["distinct_requests"] >= 30
                    want = ge(lv["measured"], limit) if enough else None
                    assert lv.get("pass") == want, (name, lv, want)
                    checks += 4
                elif lv.get("interval") is not None:
                    iv = intervals[(entry["arm"], c, lv["metric"])]["interval"]
                    assert lv["interval"] == [iv["low"], iv["high"]], (lv, iv)
                    bound = lv["limit"] / lv["reference"]
                    at_most = name == "max_p95_latency_ratio"
                    want = ge(bound, iv["high"]) if at_most else ge(iv["low"], bound)
                    assert lv["pass"] == want, (name, lv, want)
                    checks += 2
                elif name in ("fit_min_mean_similarity", "fit_min_exact_match"):
                    key = "mean_similarity" if "similarity" in name else "exact_match_rate"
                    measured = drift[entry["arm"]]["concurrency"][str(c)][key]
                    assert lv["measured"] == measured and lv["pass"] == ge(measured, t[name]), lv
                    checks += 1
    assert verdict["rules"]["decode"].startswith("pooled"), verdict["rules"]
    print(f"v2 verdict re-derived: {checks} checks ({verdict['verdict']})")
    return checks + 1


def check_verdict(campaign: dict, verdict: dict) -> int:
    """Re-derive every gate and the verdict from campaign.json and the recorded thresholds."""
    if verdict["rules"]["contract_version"] == 2:
        return check_verdict_v2(campaign, verdict)
    t = verdict["contract"]["thresholds"]
    arms = {a["name"]: a for a in campaign["arms"]}
    ref = arms[campaign["reference_arm"]]
    drift = {e["arm"]: e for e in campaign["drift"]}
    tol = 1e-9

    def le(a, b):
        return a <= b + tol * max(abs(a), abs(b))

    def levels(a):
        return a["concurrency"].items() if a["available"] else []

    def failed_ok(a):
        ls = list(levels(a))
        return bool(ls) and sum(cell["failed_requests"] for _, cell in ls) <= t["max_failed_requests"]

    def ratio_ok(a, pick, factor, at_most):
        if not a["available"] or not ref["available"]:
            return False
        results = []
        for c, cell in levels(a):
            rcell = ref["concurrency"].get(c)
            if not rcell or not cell.get("complete", True) or not rcell.get("complete", True):
                continue
            got = pick(cell, rcell)
            if got is None:
                continue
            x, r = got
            results.append(le(x, factor * r) if at_most else le(factor * r, x))
        return bool(results) and all(results)

    def both(key, zero_ok=True):
        def pick(a, r):
            if a.get(key) is None or r.get(key) is None or (not zero_ok and r[key] <= 0):
                return None
            return a[key], r[key]
        return pick

    def memory(a, r):
        return both("peak_vram_bytes")(a, r) or both("peak_rss_bytes")(a, r)

    def decode(a, r):
        return both("decode_tokens_per_sec", False)(a, r) or both("aggregate_decode_tokens_per_sec", False)(a, r)

    quality = [a for a in campaign["arms"] if a["lane"] == "quality"]
    fit = [a for a in campaign["arms"] if a["lane"] == "performance-fit"]
    exact_ok = all(
        a["available"] and a["name"] in drift and drift[a["name"]]["concurrency"]
        and all(le(t["quality_min_exact_match"], lv["exact_match_rate"])
                for lv in drift[a["name"]]["concurrency"].values() if lv["exact_match_rate"] is not None)
        for a in quality if not a["reference"])
    quality_pass = exact_ok and all(failed_ok(a) for a in quality)
    benefit, ready, gates = {}, {}, {}
    for a in fit:
        g = {
            "max_failed_requests": failed_ok(a),
            "fit_min_memory_reduction": ratio_ok(a, memory, 1 - t["fit_min_memory_reduction"], True),
            "fit_min_decode_speedup": ratio_ok(a, decode, 1 + t["fit_min_decode_speedup"], False),
            "max_p95_latency_ratio": ratio_ok(a, both("latency_p95_ms", False), t["max_p95_latency_ratio"], True),
            "min_decode_ratio": ratio_ok(a, decode, t["min_decode_ratio"], False),
        }
        gates[a["name"]] = g
        benefit[a["name"]] = g["max_failed_requests"] and (g["fit_min_memory_reduction"] or g["fit_min_decode_speedup"])
        ready[a["name"]] = g["max_p95_latency_ratio"] and g["min_decode_ratio"]
    if not quality_pass:
        want = "reject"
    elif not any(benefit.values()):
        want = "keep-reference"
    elif any(benefit[n] and ready[n] for n in benefit):
        want = "adopt"
    else:
        want = "optimize"
    assert verdict["quality_lane_pass"] == quality_pass, verdict["quality_lane_pass"]
    assert verdict["fit_benefit"] == any(benefit.values())
    assert verdict["verdict"] == want, (verdict["verdict"], want)
    checks = 4
    for f in verdict["fit_arms"]:
        assert f["benefit"] == benefit[f["arm"]], f
        assert f["ready"] == (benefit[f["arm"]] and ready[f["arm"]]), f
        for gate, passed in gates[f["arm"]].items():
            assert f[gate] == passed, (f["arm"], gate, f[gate], passed)
            checks += 1
    # Every gate entry, per arm, as the rules above give it.
    quality_failed = {a["name"]: failed_ok(a) for a in quality}
    for g in verdict["gates"]:
        for entry in g["arms"]:
            name = entry["arm"]
            if g["gate"] == "max_failed_requests":
                want = quality_failed.get(name, gates.get(name, {}).get("max_failed_requests"))
            elif g["gate"] == "quality_min_exact_match":
                continue  # re-derived as part of quality_pass above
            else:
                want = gates[name][g["gate"]]
            assert entry["pass"] == want, (g["gate"], name, entry["pass"], want)
            checks += 1
    assert verdict["post_hoc"] is False, "replay --contract writes a pre-registered verdict"
    return checks


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

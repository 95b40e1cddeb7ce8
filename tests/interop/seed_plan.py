"""Interop check: the seed tool's frozen plan (tests/fixtures/serving_matrix.example.json)
with a top-level `ignore_paths` excluding a native timer, against a plain Python server
whose answers carry a volatile `/metadata/inference_seconds`. The plan runs unchanged:
22 POSTs and 1 GET, every exchange `ok`, two decisions per answer. The run directory is
then checked by check_run.py (DuckDB, pandas, pyarrow), which recomputes each round's
counts, percentiles, decisions and failure latencies from the rows.

Usage: python3 tests/interop/seed_plan.py PATH/TO/matrix-proxy WORKDIR
"""

import json
import random
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
import check_run  # noqa: E402
from support import cli_main, passed  # noqa: E402

FIXTURE = Path(__file__).parent.parent / "fixtures" / "serving_matrix.example.json"


class Seed(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers = None
    seen = []

    def log_message(self, *args):
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        Seed.seen.append(("GET", self.path))
        self.reply({"status": "ok"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        Seed.seen.append(("POST", self.path))
        # A different timer on every answer, as a real server's would be.
        self.reply({"answers": Seed.answers, "metadata": {"inference_seconds": random.uniform(0.001, 0.05)}})


def main(binary: str, work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    plan = json.loads(FIXTURE.read_text())
    Seed.answers = plan["cases"][0]["expected_response"]["answers"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Seed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    plan["endpoint"] = f"{origin}/v1/systemone"
    plan["health_endpoint"] = f"{origin}/health"
    plan["ignore_paths"] = ["/metadata/inference_seconds"]
    plan["cases"][0]["expected_response"]["metadata"] = {"inference_seconds": 0.0}
    plan_path = work / "seed-plan.json"
    plan_path.write_text(json.dumps(plan, indent=2))
    run = work / "seed-run"
    try:
        code = subprocess.run([binary, "replay", str(plan_path), "--quiet", "--out", str(run)]).returncode
    finally:
        server.shutdown()
    checks = 0
    assert code == 0, code
    posts = sum(1 for m, _ in Seed.seen if m == "POST")
    gets = sum(1 for m, _ in Seed.seen if m == "GET")
    assert (posts, gets) == (22, 1), (posts, gets)
    checks += 2
    con = duckdb.connect()
    glob = str(run / "exchanges" / "*.parquet")
    by = con.execute(
        f"select phase, outcome, count(*), min(decisions), max(decisions) from '{glob}' group by all order by all"
    ).fetchall()
    for phase, outcome, n, lo, hi in by:
        assert outcome == "ok", by
        assert (lo, hi) == ((None, None) if phase == "health" else (2, 2)), by
        checks += 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is True
    assert [r["successful_decisions"] for r in summary["rounds"]] == [8, 8, 8, 8]
    checks += 2
    check_run.main(run)
    return passed("seed plan: 22 POST + 1 GET (and check_run's above)", checks)


if __name__ == "__main__":
    cli_main(main, __doc__)

"""Interop check: a streaming server that never sends `data: [DONE]`, as `transformers
serve` does, through both `matrix-proxy serve` (driven by the official `openai` SDK) and
`matrix-proxy replay`. The streams are complete by their framing, so every exchange is
`ok` with `stream_done_seen = false`; a plan that sets `require_done` turns the same
streams into `correctness` failures. Rows are read back with DuckDB.

The server here is plain Python (http.server): one route answers with a chunked body,
another with a body ended by closing the connection, both like `transformers serve`'s
chat streams (a role chunk, content chunks, a finish chunk, no [DONE]).

Usage: python3 tests/interop/stream_without_done.py PATH/TO/matrix-proxy WORKDIR
"""

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from support import cli_main, free_port, passed, wait_http  # noqa: E402

import duckdb
from openai import OpenAI

WORDS = ["the", "sea", "is", "blue", "and", "green"]
TEXT = "".join(f" {w}" if i else w for i, w in enumerate(WORDS))
METADATA = {k: "N/A: interop check" for k in [
    "gpu", "gpu_ids", "driver", "cuda", "precision", "model_revision", "runtime_revision",
    "cache_policy", "cuda_evidence", "reservation", "host"]}


def chunk(delta: dict, finish=None) -> bytes:
    event = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0,
             "model": "tiny", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(event)}\n\n".encode()


def events() -> list:
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": w if i == 0 else f" {w}"}) for i, w in enumerate(WORDS)]
    out.append(chunk({}, "stop"))
    return out  # and no "data: [DONE]"


class NoDone(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        chunked = not self.path.startswith("/close")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        for e in events():
            self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e) if chunked else e)
            self.wfile.flush()
            time.sleep(0.002)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


def rows(run: Path, where: str = "true") -> list:
    glob = str(run / "exchanges" / "*.parquet")
    return duckdb.connect().execute(
        f"""select url, outcome, is_stream, stream_done_seen, output_tokens, event_count,
                   error_message
            from '{glob}' where method = 'POST' and {where} order by exchange_id"""
    ).fetchall()


def through_serve(binary: str, upstream: str, work: Path) -> int:
    run = work / "no-done-serve"
    port = free_port()
    proxy = subprocess.Popen([binary, "serve", "--quiet", "--listen", f"127.0.0.1:{port}",
                              "--upstream", upstream, "--out", str(run)])
    checks = 0
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        for prefix in ["/v1", "/close/v1"]:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}{prefix}", api_key="x", max_retries=0)
            stream = client.chat.completions.create(
                model="tiny", stream=True, messages=[{"role": "user", "content": "sea?"}])
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert text == TEXT, text
            checks += 1
    finally:
        proxy.send_signal(signal.SIGTERM)
        code = proxy.wait(timeout=30)
    assert code == 130, code
    got = rows(run)
    assert len(got) == 2, got
    for url, outcome, is_stream, done, tokens, n_events, err in got:
        assert (outcome, is_stream, done) == ("ok", True, False), (url, outcome, done, err)
        assert tokens == len(WORDS) and n_events == len(WORDS) + 2, (url, tokens, n_events)
        checks += 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["successful_requests"] == summary["requests"], summary
    checks += 1
    return checks


def through_replay(binary: str, upstream: str, work: Path, require_done: bool) -> int:
    name = "require-done" if require_done else "no-done"
    plan = {
        "endpoint": f"{upstream}/v1/chat/completions",
        "on_failure": "continue",
        "cases": [
            {"name": f"{p.strip('/') or 'chunked'}", "path": f"{p}/v1/chat/completions",
             "request": {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "sea?"}]},
             "expected_stream_text": TEXT, "require_done": require_done}
            for p in ["", "/close"]
        ],
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 10, "metadata": METADATA,
    }
    plan_path = work / f"{name}.json"
    plan_path.write_text(json.dumps(plan))
    run = work / f"{name}-replay"
    code = subprocess.run([binary, "replay", str(plan_path), "--quiet", "--out", str(run)]).returncode
    assert code == (1 if require_done else 0), code
    got = rows(run)
    # per case: readiness 1, warm-up 2, (feasibility 1 + 2 x 4) + (feasibility 2 + 2 x 4)
    assert len(got) == 2 * 22, len(got)
    want = "correctness" if require_done else "ok"
    checks = 1
    for url, outcome, is_stream, done, tokens, n_events, err in got:
        assert (outcome, is_stream, done) == (want, True, False), (url, outcome, err)
        checks += 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is (not require_done), summary["complete"]
    return checks + 1


def main(binary: str, work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoDone)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        checks = through_serve(binary, upstream, work)
        checks += through_replay(binary, upstream, work, require_done=False)
        checks += through_replay(binary, upstream, work, require_done=True)
    finally:
        server.shutdown()
    return passed("streams without [DONE]: serve and replay", checks)


if __name__ == "__main__":
    cli_main(main, __doc__)

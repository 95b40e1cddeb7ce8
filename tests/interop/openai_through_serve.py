"""Interop check: the official `openai` SDK talks to the built-in mock worker through
`matrix-proxy serve` and gets the same answer as directly; the exchange is then found
with DuckDB, with the API key redacted.

Usage: python3 tests/interop/openai_through_serve.py PATH/TO/matrix-proxy WORKDIR
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from support import cli_main, free_port, passed, wait_http  # noqa: E402

import duckdb
from openai import OpenAI

API_KEY = "sk-interop-SECRET-5150"


def main(binary: str, work: Path) -> int:
    checks = 0
    work.mkdir(parents=True, exist_ok=True)
    run = work / "openai-live"
    mock_port, proxy_port = free_port(), free_port()
    mock = subprocess.Popen([binary, "mock-worker", "--listen", f"127.0.0.1:{mock_port}"], stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen(
        [binary, "serve", "--quiet", "--listen", f"127.0.0.1:{proxy_port}",
         "--upstream", f"http://127.0.0.1:{mock_port}", "--out", str(run)],
    )
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health")
        wait_http(f"http://127.0.0.1:{proxy_port}/health")
        messages = [{"role": "user", "content": "Name three colours of the sea."}]
        via = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key=API_KEY, max_retries=0)
        direct = OpenAI(base_url=f"http://127.0.0.1:{mock_port}/v1", api_key=API_KEY, max_retries=0)
        a = via.chat.completions.create(model="mock", messages=messages, max_tokens=6)
        b = direct.chat.completions.create(model="mock", messages=messages, max_tokens=6)
        assert a.choices[0].message.content == b.choices[0].message.content, (a, b)
        assert a.usage.completion_tokens == b.usage.completion_tokens == 6
        checks += 2
        models = via.models.list()
        assert [m.id for m in models.data] == ["mock"]
        checks += 1
    finally:
        proxy.send_signal(signal.SIGTERM)
        code = proxy.wait(timeout=30)
        mock.send_signal(signal.SIGTERM)
        mock.wait(timeout=30)
    assert code == 130, code
    checks += 1

    con = duckdb.connect()
    glob = str(run / "exchanges" / "*.parquet")
    rows = con.execute(
        f"""select url, status, outcome, response_body,
                   list_filter(request_headers, lambda h: h.name = 'authorization')[1].value as auth
            from '{glob}' where method = 'POST' and url like '%/v1/chat/completions'"""
    ).fetchall()
    assert len(rows) == 1, rows
    url, status, outcome, body, auth = rows[0]
    assert (status, outcome) == (200, "ok"), rows[0]
    assert json.loads(body)["choices"][0]["message"]["content"] == a.choices[0].message.content
    assert auth == b"<redacted>", auth
    checks += 3
    everything = con.execute(f"select * from '{glob}'").fetchall()
    assert API_KEY not in repr(everything), "the API key reached disk"
    assert all(API_KEY not in p.read_text() for p in run.glob("*.json"))
    checks += 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rows_written"] == len(everything), summary
    checks += 1
    return passed(f"openai interop: {len(everything)} exchanges through serve", checks)


if __name__ == "__main__":
    cli_main(main, __doc__)

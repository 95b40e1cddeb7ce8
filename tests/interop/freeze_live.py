"""Interop check, capture -> freeze -> replay with real processes: the official `openai`
SDK sends mixed live traffic (two routes, streaming and not, every prompt asked twice,
a bearer token) through `matrix-proxy serve` in front of the built-in mock worker;
`freeze` turns the run into a plan; `validate` passes; `replay` of the frozen plan against
the same mock passes every oracle, and DuckDB finds every replayed exchange `ok`.

Usage: python3 tests/interop/freeze_live.py PATH/TO/matrix-proxy WORKDIR
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from support import cli_main, free_port, passed, wait_http  # noqa: E402

import duckdb
from openai import OpenAI

API_KEY = "sk-freeze-SECRET-6021"


def main(binary: str, work: Path) -> int:
    checks = 0
    work.mkdir(parents=True, exist_ok=True)
    live, replayed = work / "freeze-live", work / "freeze-replay"
    plan = work / "freeze-plan.json"
    for p in (plan,):
        p.unlink(missing_ok=True)
    mock_port, proxy_port = free_port(), free_port()
    mock = subprocess.Popen([binary, "mock-worker", "--listen", f"127.0.0.1:{mock_port}"], stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health")
        proxy = subprocess.Popen(
            [binary, "serve", "--quiet", "--listen", f"127.0.0.1:{proxy_port}",
             "--upstream", f"http://127.0.0.1:{mock_port}", "--out", str(live)],
        )
        try:
            wait_http(f"http://127.0.0.1:{proxy_port}/health")
            client = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key=API_KEY, max_retries=0)
            texts = {}
            for _ in range(2):
                for prompt in ["Name three colours of the sea.", "Count to four."]:
                    r = client.chat.completions.create(
                        model="mock", messages=[{"role": "user", "content": prompt}],
                        max_tokens=6, temperature=0)
                    texts[prompt] = r.choices[0].message.content
                stream = client.chat.completions.create(
                    model="mock", messages=[{"role": "user", "content": "Stream a line."}],
                    max_tokens=5, temperature=0, stream=True,
                    stream_options={"include_usage": True})
                streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                client.completions.create(model="mock", prompt="Once upon", max_tokens=4)
        finally:
            proxy.send_signal(signal.SIGTERM)
            assert proxy.wait(timeout=30) == 130
        checks += 1

        def freeze(*extra):
            return subprocess.run(
                [binary, "freeze", str(live), "--bearer-token-env", "MP_FREEZE_TOKEN", *extra],
                capture_output=True, text=True)

        out = freeze("--out", str(plan))
        assert out.returncode == 0, out.stderr
        # serve's health probe (wait_http) is not frozen: replay checks /health itself.
        assert "froze 4 distinct request(s) in 2 case(s) from 8 of 9" in out.stderr, out.stderr
        assert "1 health check(s) not frozen" in out.stderr, out.stderr
        assert "0 of 4 requests answered differently on repeat" in out.stderr, out.stderr
        checks += 2
        text = plan.read_text()
        assert API_KEY not in text and "<redacted>" not in text, "a secret reached the plan"
        assert freeze().stdout == text, "two freezes of one run are byte-identical"
        checks += 2
        frozen = json.loads(text)
        chat = frozen["cases"][0]
        assert chat["path"] == "/v1/chat/completions", chat
        assert "headers" not in chat, "the SDK's own headers are not frozen"
        oracles = [v.get("expected_response", {}).get("choices", [{}])[0].get("message", {}).get("content")
                   for v in chat["variants"]]
        assert set(texts.values()) <= set(oracles), (texts, oracles)
        assert chat["variants"][2]["expected_stream_text"] == streamed
        assert frozen["ignore_paths"] == ["/created", "/id"], frozen.get("ignore_paths")
        assert frozen["auth"] == {"bearer_token_env": "MP_FREEZE_TOKEN"}
        checks += 5

        check = subprocess.run([binary, "validate", str(plan)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        checks += 1
        env = dict(os.environ, MP_FREEZE_TOKEN="sk-replay-SECRET-6022")
        run = subprocess.run([binary, "replay", "--quiet", str(plan), "--out", str(replayed)],
                             capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        checks += 1
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(timeout=30)

    summary = json.loads((replayed / "summary.json").read_text())
    assert summary["ending"] == "passed", summary["ending"]
    assert {c["judged"] for c in summary["cases"]} == {"oracle"}, summary["cases"]
    con = duckdb.connect()
    glob = str(replayed / "exchanges" / "*.parquet")
    (rows, ok, mismatched) = con.execute(
        f"""select count(*), count(*) filter (where outcome = 'ok'),
                   count(*) filter (where oracle_mismatch_pointer is not null)
            from '{glob}'""").fetchone()
    assert rows == summary["rows_written"] == ok and mismatched == 0, (rows, ok, mismatched)
    checks += 3
    return passed(f"capture -> freeze -> replay: {rows} replayed exchanges, every oracle passed", checks)


if __name__ == "__main__":
    cli_main(main, __doc__)

#!/usr/bin/env bash
# One command for the side-by-side benchmarks of issue 5 (see benchmarks/README.md):
# installs nginx, HAProxy, wrk and oha from the package registries, builds matrix-proxy in
# release, and runs benchmarks/harness.py. Loopback only; bounded in time
# (about 4 x ROUNDS x 3 x DUR s for the proxy table and 5 x ROUNDS x 3 x DUR s for the
# generator table; SOAK=1 adds 10 minutes).
#
#   DUR=5 ROUNDS=3 bash benchmarks/run.sh
#   OLD_BIN=/tmp/baseline/matrix-proxy OLD_WRITER_BENCH=/tmp/baseline/writer-bench ROUNDS=5 bash benchmarks/run.sh
#     (the old build as targets of its own, interleaved with the new; ONLY=serve:16,replay:64,fresh:1
#     reruns some cells; see benchmarks/README.md)
#   STREAMS=1 ONLY=stream:64,stream:256,serve-stream:64 bash benchmarks/run.sh
#     (LLM-shaped streams instead: benchmarks/streams.py, nginx's canned SSE and the paced mock;
#     PEERS=1 adds AIPerf, GuideLLM and inference-perf, installed into venvs under target/peers/
#     on first use; inference-perf needs python3.12 on PATH or pyenv's)
set -euo pipefail
cd "$(dirname "$0")/.."
streams="${STREAMS:-0}"
need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v taskset >/dev/null || need+=(util-linux)
command -v wrk >/dev/null || need+=(wrk)
if [ "$streams" != 1 ]; then
  command -v haproxy >/dev/null || need+=(haproxy)
fi
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}"
fi
if [ "$streams" = 1 ]; then
  python3 -c 'import duckdb' 2>/dev/null || python3 -m pip install --quiet duckdb
  cargo build --release --locked
  exec python3 benchmarks/streams.py
fi
command -v oha >/dev/null || cargo install oha --locked
cargo build --release --locked
exec python3 benchmarks/harness.py

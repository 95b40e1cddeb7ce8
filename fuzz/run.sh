#!/usr/bin/env bash
# Coverage-guided fuzzing of the plan parser, JSON pointers, the oracle, the SSE parser,
# the Prometheus text reader, the lean client's response codec against hyper's client and
# our request reader against hyper's server
# (libFuzzer through cargo-fuzz). Each target runs for SECONDS (default 60), starting from
# fuzz/seeds/<target> and the kept corpus fuzz/corpus/<target>, which is then minimised.
# Every corpus file is replayed as an ordinary test on stable: tests/it/fuzz_corpus.rs.
#
#   bash fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
# cargo-fuzz passes nightly-only flags (sanitizers); the stable toolchain accepts them
# with RUSTC_BOOTSTRAP=1.
export RUSTC_BOOTSTRAP=1
for t in plan pointer oracle sse http1_response http1_request prom_text; do
  mkdir -p "corpus/$t"
  echo "==> $t for ${secs}s"
  cargo fuzz run "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -max_len=65536 -timeout=10
  cargo fuzz cmin "$t" "corpus/$t" >/dev/null 2>&1 || true
  echo "    corpus: $(ls "corpus/$t" | wc -l) inputs"
done

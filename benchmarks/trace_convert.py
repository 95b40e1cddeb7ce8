"""`plan from-trace` of a 1,000,000-line Mooncake trace: wall time and peak memory
(issue 47: "a 1-million-line Mooncake trace converts in well under a minute"; memory
proportional to the distinct blocks, not the file).

Everything is made here, deterministically (no download):
- a byte-level BPE tokenizer.json (vocabulary 8,000, a BOS added by its post-processor)
  trained with the `tokenizers` package on the corpus embedded in the binary
  (src/dataset/corpus.txt);
- a Mooncake-format JSONL of N lines (default 1,000,000) over an hour: conversations whose
  turns resend the conversation so far (their blocks again, plus 1-2 new ones), and
  one-off requests after one of 500 shared 4-block system prompts; input lengths up to
  16 blocks of 512 tokens, each request's last block partial and its own. The distinct
  (block, length) pairs the converter must re-encode are counted and printed.
Then `matrix-proxy plan from-trace` (release build) runs ROUNDS times on it; its wall time,
peak RSS (wait4) and CPU time are printed with the file's size, and written to
results/<date>-trace-convert.md.

Usage: pip install tokenizers; python3 benchmarks/trace_convert.py [PATH/TO/matrix-proxy] [LINES] [ROUNDS]
"""

import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/matrix-proxy"
LINES = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
BLOCK = 512


def tokenizer(path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    text = Path("src/dataset/corpus.txt").read_text().splitlines()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text * 4, trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    tok.save(str(path))


def trace(path: Path):
    """The trace, written line by line; the distinct (id, length) pairs it holds."""
    rng = random.Random(47)
    next_id = 2000  # ids 0..1999: the 500 system prompts' 4 blocks each
    convs = []  # open conversations: their blocks so far
    distinct = set()
    t_ms = 0.0
    with path.open("w") as f:
        for _ in range(LINES):
            t_ms += rng.expovariate(LINES / 3_600_000)
            if convs and rng.random() < 0.6:
                k = rng.randrange(len(convs))
                blocks = convs[k] + [next_id + i for i in range(rng.randint(1, 2))]
            else:
                g = min(int(rng.paretovariate(1.2)) - 1, 499)
                blocks = [4 * g + i for i in range(4)] + [next_id]
                k = None
            next_id = max(next_id, blocks[-1] + 1)
            blocks = blocks[:16]
            last = rng.randint(1, BLOCK)
            length = BLOCK * (len(blocks) - 1) + last
            for j, b in enumerate(blocks):
                distinct.add((b, last if j == len(blocks) - 1 else BLOCK))
            f.write(json.dumps({"timestamp": round(t_ms, 3), "input_length": length,
                                "output_length": rng.randint(16, 512), "hash_ids": blocks}) + "\n")
            if k is None:
                if len(convs) < 5000:
                    convs.append(blocks)
            elif len(blocks) < 16:
                convs[k] = blocks
            else:
                convs.pop(k)
    return len(distinct)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="trace-convert-"))
    tok = work / "tokenizer.json"
    tokenizer(tok)
    src = work / "mooncake.jsonl"
    t0 = time.perf_counter()
    distinct = trace(src)
    print(f"wrote {LINES} lines ({src.stat().st_size / 1e6:.0f} MB, {distinct} distinct blocks) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    runs = []
    for k in range(ROUNDS):
        out = work / f"plan-{k}.json"
        args = [BIN, "plan", "from-trace", str(src), "--format", "mooncake", "--tokenizer", str(tok),
                "--endpoint", "http://127.0.0.1:8000", "--model", "m", "--ignore-eos", "--out", str(out)]
        t0 = time.perf_counter()
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        err = p.stderr.read().decode()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{' '.join(args)} failed:\n{err}")
        runs.append((wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime))
        print(f"run {k + 1}: {wall:.1f} s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB\n{err}", file=sys.stderr)
        os.remove(out)
        os.remove(work / f"plan-{k}.trace.jsonl")
    med = lambda i: statistics.median(r[i] for r in runs)
    host = os.uname()
    text = "\n".join([
        f"# plan from-trace of a {LINES:,}-line Mooncake trace ({datetime.date.today()})",
        "",
        f"`python3 benchmarks/trace_convert.py {BIN} {LINES} {ROUNDS}` on {host.nodename} ({host.machine}, {os.cpu_count()} CPUs).",
        f"The file: {src.stat().st_size / 1e6:.0f} MB, {distinct:,} distinct (block, length) pairs (each checked by its junctions, a sample of 1,000 re-encoded whole).",
        "",
        "| runs | wall s (median, min-max) | peak RSS MiB | CPU s |",
        "|---|---|---|---|",
        f"| {ROUNDS} | {med(0):.1f} ({min(r[0] for r in runs):.1f}-{max(r[0] for r in runs):.1f}) | {med(1):.0f} | {med(2):.1f} |",
        "",
    ])
    print(text)
    results = Path(__file__).parent / "results"
    stem = f"{datetime.date.today()}-trace-convert"
    path, i = results / f"{stem}.md", 2
    while path.exists():
        path, i = results / f"{stem}-{i}.md", i + 1
    path.write_text(text)
    print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

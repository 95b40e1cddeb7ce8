#!/usr/bin/env python3
"""Write plans/mooncake-sample.jsonl: a small trace in the Mooncake format (one JSON
object a line: `timestamp` in ms, `input_length`, `output_length`, `hash_ids` of
512-token prefix blocks), made up here for `plan from-trace`'s worked example
(docs/plan.md). Not copied from any trace.

Deterministic: a 64-bit xorshift generator with a fixed seed (no `random`, whose draws
may change between Python versions), so the file is the same byte for byte wherever it is
written. Standard library only.

The traffic: conversations whose turns resend the whole conversation so far (the next
turn's hash_ids start with the previous turn's, as Mooncake's do), plus one-off requests
sharing a common system prompt of two blocks; arrivals in bursts a few seconds apart.

    python3 scripts/make-trace-samples.py            # writes plans/mooncake-sample.jsonl
    python3 scripts/make-trace-samples.py --check    # exits 1 if the file differs
"""

import json
import os
import sys

BLOCK = 512
SEED = 47


class XorShift:
    """xorshift64*: small, fast, the same on every platform."""

    def __init__(self, seed):
        self.state = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF

    def next(self):
        x = self.state
        x ^= (x >> 12)
        x ^= (x << 25) & 0xFFFFFFFFFFFFFFFF
        x ^= (x >> 27)
        self.state = x
        return (x * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF

    def below(self, n):
        """Uniform in range(n) (the bias of a plain modulo is below 2^-50 here)."""
        return self.next() % n


def blocks_for(tokens):
    return -(-tokens // BLOCK)


def lines():
    rng = XorShift(SEED)
    next_id = 0

    def fresh(n):
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    system = fresh(2)  # a system prompt of two full blocks every one-off request shares
    conversations = []  # [hash_ids so far, input tokens so far]
    out = []
    t = 0
    for burst in range(8):
        t += 2000 + rng.below(3000)  # bursts 2 to 5 s apart
        for _ in range(3 + rng.below(5)):
            t += rng.below(150)  # requests of a burst within a few hundred ms
            kind = rng.below(3)
            if kind == 0 or not conversations:
                # A new conversation: its own blocks from the first.
                tokens = 300 + rng.below(1500)
                ids = fresh(blocks_for(tokens))
                conversations.append([ids, tokens])
            elif kind == 1:
                # A conversation's next turn: all of it so far, then the new turn.
                conv = conversations[rng.below(len(conversations))]
                ids, tokens = conv
                grown = tokens + 200 + rng.below(900)
                # The last block of the earlier turn was partial: the new text changes it.
                keep = tokens // BLOCK
                ids = ids[:keep] + fresh(blocks_for(grown) - keep)
                conv[0], conv[1] = ids, grown
                tokens = grown
            else:
                # A one-off request after the shared system prompt.
                tokens = 2 * BLOCK + 100 + rng.below(1200)
                ids = system + fresh(blocks_for(tokens) - 2)
            out.append(
                {
                    "timestamp": t,
                    "input_length": tokens,
                    "output_length": 16 + rng.below(240),
                    "hash_ids": list(ids),
                }
            )
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "plans", "mooncake-sample.jsonl")
    text = "".join(json.dumps(line) + "\n" for line in lines())
    if sys.argv[1:] == ["--check"]:
        with open(path, encoding="utf-8") as f:
            same = f.read() == text
        print(f"{path}: {'up to date' if same else 'differs: run the script'}")
        return 0 if same else 1
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

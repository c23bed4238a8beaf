"""CPU greedy decoding at long contexts: decode tok/s and prefill time per context length, the driver's
defaults against the same with ONNX Runtime's own attention (com.microsoft::GroupQueryAttention, every
rewrite but `attention` and `gated-attention`), and optionally other builds of the custom-op library,
in one process.

    python bench/cpu_long_context.py --model /tmp/small [--lengths 256,1024,2048] [--new-tokens 16]
        [--reps 3] [--threads 2] [--library NAME=PATH ...] [--out FILE]

A prompt of L token ids (fixed, spread over the vocabulary), then --new-tokens greedy steps; each
variant's Generator is made once (max_length = the longest prompt + new tokens), and the repetitions
run every variant in turn per length (the order reversed every other repetition), so that a noisy
machine's slow spells fall on all of them alike. Medians over --reps. A decode step at context L
attends over L positions in each full-attention layer: where that attention is slow, tok/s falls with L.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import ops.rewrite  # noqa: E402
from cpu_fusions import session_setting  # noqa: E402  (a variant's library while its sessions are made)
from driver import Generator  # noqa: E402
from cpu import run_record, write_result  # noqa: E402  (bench/cpu.py: a result's opening, its file)

ORT_ATTENTION = tuple(k for k in ops.rewrite.REWRITES if k not in (ops.rewrite.ATTENTION, ops.rewrite.GATED_ATTENTION))


def prompt_of(length: int, vocab: int) -> list[int]:
    return [3 + (i * 7919) % (vocab - 3) for i in range(length)]


def measure(model: str, lengths: list[int], new_tokens: int, reps: int, threads: int, libraries: dict) -> dict:
    variants = {"ours": True, "ort_attention": ORT_ATTENTION, **{name: True for name in libraries}}
    max_length = max(lengths) + new_tokens + 1
    gens = {}
    for name, rewrite in variants.items():
        with session_setting(name, libraries):
            gens[name] = Generator(model, provider="cpu", mode="greedy", rewrite=rewrite, threads=threads,
                                   max_length=max_length)
        gens[name].generate(prompt_of(32, gens[name].folder.vocab_size), 4, stop_at_eos=False)  # warm
    runs = {(name, n): [] for name in gens for n in lengths}
    names = list(gens)
    for rep in range(reps):
        for n in lengths:
            for name in names if rep % 2 == 0 else names[::-1]:
                r = gens[name].generate(prompt_of(n, gens[name].folder.vocab_size), new_tokens, stop_at_eos=False)
                runs[name, n].append((r.stats.new_tokens / r.stats.decode_seconds, r.stats.prefill_seconds, r.tokens))
    out = {}
    for (name, n), rs in runs.items():
        out.setdefault(name, {})[str(n)] = {
            "decode_tok_s": round(statistics.median(x[0] for x in rs), 2),
            "prefill_s": round(statistics.median(x[1] for x in rs), 3),
            "tokens": rs[-1][2],
        }
        print(f"{name:14s} L={n:5d}: decode {out[name][str(n)]['decode_tok_s']:7.1f} tok/s, "
              f"prefill {out[name][str(n)]['prefill_s']:6.2f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="256,1024,2048")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--library", action="append", default=[], metavar="NAME=PATH",
                    help="also the driver's defaults on the library build at PATH, as variant NAME (repeatable)")
    ap.add_argument("--out", help="JSON file (default: print only)")
    args = ap.parse_args()
    libraries = dict(item.split("=", 1) for item in args.library)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    rows = measure(args.model, lengths, args.new_tokens, args.reps, args.threads, libraries)
    write_result(run_record(model=args.model, threads=args.threads, new_tokens=args.new_tokens, reps=args.reps,
                            libraries=libraries, variants=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the CPU fusions buy: the main graph's forward time per width with every rewrite (the driver's
default), and without the mlp fusion, the gated-attention fusion, or both, on one model folder.

    python bench/cpu_fusions.py --model /tmp/small [--reps 25] [--threads 2] [--out FILE]

All four sessions live in one process and are timed round-robin per width (2 warm-up forwards, then
10 timed, per turn), so a noisy machine's slow spells fall on every variant alike; the figure is the
median over --reps turns of the mean forward time. The forwards run at a fixed cache length after a
short prompt (GraphRunner.forward without committing), as a decode step (width 1) and an MTP verify
(width k + 1) run them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ops.rewrite  # noqa: E402
from driver import Generator  # noqa: E402

WIDTHS = (1, 2, 4)
PROMPT = "def read_config(path):\n    with open(path) as f:\n"


def variants() -> dict:
    every = ops.rewrite.REWRITES
    without = lambda *kinds: tuple(k for k in every if k not in kinds)  # noqa: E731
    return {"default": True, "no-mlp": without(ops.rewrite.MLP),
            "no-gated-attention": without(ops.rewrite.GATED_ATTENTION),
            "neither": without(ops.rewrite.MLP, ops.rewrite.GATED_ATTENTION)}


def measure(model: str, reps: int, threads: int) -> dict:
    gens = {}
    for name, rewrite in variants().items():
        gen = Generator(model, mode="greedy", rewrite=rewrite, threads=threads)
        gen.generate(PROMPT, 16)
        gens[name] = gen
    times = {(name, w): [] for name in gens for w in WIDTHS}
    for _ in range(reps):
        for w in WIDTHS:
            for name, gen in gens.items():
                for _ in range(2):
                    gen.main.forward(w)
                t = time.perf_counter()
                for _ in range(10):
                    gen.main.forward(w)
                times[(name, w)].append((time.perf_counter() - t) / 10 * 1e3)
    return {name: {f"w{w}_ms": round(statistics.median(times[(name, w)]), 4) for w in WIDTHS} for name in gens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON file (default: print only)")
    args = ap.parse_args()
    rows = measure(args.model, args.reps, args.threads)
    for name, row in rows.items():
        print(name, json.dumps(row), flush=True)
    result = {"command": "python bench/cpu_fusions.py " + " ".join(sys.argv[1:]),
              "date": datetime.date.today().isoformat(),
              "revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                         cwd=ROOT).stdout.strip(),
              "model": args.model, "reps": args.reps, "threads": args.threads, "forward_ms": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
